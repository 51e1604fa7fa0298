"""GPU probe of the experimental warp-specialised gate/up GEMM (``templates/gemm_gated_up_ws.py``).

Checks it against the Triton kernel's output and the PyTorch reference (Llama-3-8B shapes: hidden 4096, 112 groups of
128 channels; ragged token counts; all-active / all-inactive / random masks; outputs poisoned with NaN), then times it
against the Triton kernel (``gated_up_gemm``, default config) and cuBLAS on the dense gate weight in interleaved rounds
of CUDA-graph replays over rotated weight copies. Prints a table and writes JSON with ``--out``.

    python3 benchmarks/gated_up_ws_probe.py [--tokens 4096,16384] [--rounds 5] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import triton

from wide_compile.templates import build_group_plan, gated_up_groups_reference
from wide_compile.templates.gemm_gated_up import gated_up_gemm
from wide_compile.templates.gemm_gated_up_ws import gated_up_gemm_ws

HIDDEN, INTER, GROUP = 4096, 14336, 128


def _mask(kind: str, m: int, gen: torch.Generator) -> torch.Tensor:
    g = INTER // GROUP
    if kind == "all":
        return torch.ones(m, g, dtype=torch.bool, device="cuda")
    if kind == "none":
        return torch.zeros(m, g, dtype=torch.bool, device="cuda")
    return torch.rand(m, g, device="cuda", generator=gen) < 0.5


def check(gen: torch.Generator) -> list[dict]:
    wg, wu = ((torch.randn(INTER, HIDDEN, device="cuda", generator=gen) / HIDDEN**0.5).to(torch.bfloat16)
              for _ in range(2))
    rows = []
    for m in (4096, 1000, 100, 7):
        for kind in ("random", "all", "none"):
            x = torch.randn(m, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
            mask = _mask(kind, m, gen)
            plan = build_group_plan(mask, parts=("output",))
            ours = gated_up_gemm_ws(x, wg, wu, plan.group_tokens, plan.group_counts, GROUP)
            wide = gated_up_gemm_ws(x, wg, wu, plan.group_tokens, plan.group_counts, GROUP, wide_n=True)
            triton_out = gated_up_gemm(x, wg, wu, plan.group_tokens, plan.group_counts, GROUP, "silu")
            ref = gated_up_groups_reference(x, wg, wu, mask, GROUP, "silu").float()
            inactive = ~mask.repeat_interleave(GROUP, dim=-1)
            row = dict(tokens=m, mask=kind, nan=bool(torch.isnan(ours).any()),
                       inactive_zero=bool((ours[inactive] == 0).all()),
                       rel_err_ref=float((ours.float() - ref).norm() / ref.norm().clamp_min(1e-30)),
                       max_diff_triton=float((ours.float() - triton_out.float()).abs().max()),
                       equal_triton=bool(torch.equal(ours, triton_out)),
                       wide_n_nan=bool(torch.isnan(wide).any()),
                       wide_n_rel_err_ref=float((wide.float() - ref).norm() / ref.norm().clamp_min(1e-30)),
                       wide_n_inactive_zero=bool((wide[inactive] == 0).all()))
            row["ok"] = (not row["nan"] and row["inactive_zero"] and row["rel_err_ref"] < 1e-2 and not row["wide_n_nan"]
                         and row["wide_n_inactive_zero"] and row["wide_n_rel_err_ref"] < 1e-2)
            rows.append(row)
            print(f"check M={m:5d} {kind:6s} ok={row['ok']} rel_err={row['rel_err_ref']:.2e} "
                  f"max|ws-triton|={row['max_diff_triton']:.2e} equal={row['equal_triton']} "
                  f"wide_n rel_err={row['wide_n_rel_err_ref']:.2e}", flush=True)
    return rows


def graph_us(fns: list, reps: int = 15) -> float:
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    for _ in range(2):
        g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(fns))
    return statistics.median(times)


VARIANTS = {"ws_wide_n": dict(wide_n=True), "ws_wide_n_no_fence": dict(wide_n=True, fence=False),
            "ws_no_fence": dict(fence=False)}


def timing(tokens: int, rounds: int, gen: torch.Generator, extra: dict | None = None) -> dict:
    extra = extra or {}
    copies = 3  # 3 x 235 MB of gate + up weights: L2 holds none of it between calls
    ws = [tuple((torch.randn(INTER, HIDDEN, device="cuda", generator=gen) / HIDDEN**0.5).to(torch.bfloat16)
                for _ in range(2)) for _ in range(copies)]
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    mask = _mask("random", tokens, gen)
    plan = build_group_plan(mask, parts=("output",))
    t, c = plan.group_tokens, plan.group_counts
    variants = {
        "triton": [lambda w=w: gated_up_gemm(x, w[0], w[1], t, c, GROUP, "silu") for w in ws],
        "gluon_ws": [lambda w=w: gated_up_gemm_ws(x, w[0], w[1], t, c, GROUP) for w in ws],
        "cublas_dense_gate_plus_up": [lambda w=w: (F.linear(x, w[0]), F.linear(x, w[1])) for w in ws],
    }
    for name, kw in extra.items():  # gluon_ws variants: keyword arguments of gated_up_gemm_ws
        variants[name] = [lambda w=w, kw=kw: gated_up_gemm_ws(x, w[0], w[1], t, c, GROUP, **kw) for w in ws]
    samples = {k: [] for k in variants}
    for _ in range(rounds):
        for k, fns in variants.items():
            samples[k].append(graph_us(fns))
    flops = 2 * 2 * int(mask.sum()) * GROUP * HIDDEN
    out = {"tokens": tokens, "active_pairs": int(mask.sum()), "us": {}, "rounds": samples}
    for k, v in samples.items():
        out["us"][k] = statistics.median(v)
    for k in ("triton", "gluon_ws"):
        out[f"{k}_useful_TFLOPs"] = flops / (out["us"][k] * 1e-6) / 1e12
    out["gluon_ws_vs_triton"] = out["us"]["triton"] / out["us"]["gluon_ws"]
    for k in extra:
        print(f"   variant {k}: {out['us'][k]:.1f} us", flush=True)
    out["dense_over_gluon_ws"] = out["us"]["cublas_dense_gate_plus_up"] / out["us"]["gluon_ws"]
    out["dense_over_triton"] = out["us"]["cublas_dense_gate_plus_up"] / out["us"]["triton"]
    print(f"time M={tokens}: triton {out['us']['triton']:.1f} us ({out['triton_useful_TFLOPs']:.0f} TFLOP/s), gluon_ws "
          f"{out['us']['gluon_ws']:.1f} us ({out['gluon_ws_useful_TFLOPs']:.0f}), cuBLAS dense gate+up "
          f"{out['us']['cublas_dense_gate_plus_up']:.1f} us; dense/ws {out['dense_over_gluon_ws']:.2f}x, "
          f"dense/triton {out['dense_over_triton']:.2f}x", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="4096,16384")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None)
    p.add_argument("--no-timing", action="store_true")
    p.add_argument("--variants", action="store_true", help="also time the kernel with one m64n256 MMA per K step "
                   "(wide_n) and without the proxy fence (unsafe, only to measure its cost)")
    args = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    record = {"command": "python3 benchmarks/gated_up_ws_probe.py " + " ".join(sys.argv[1:]),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    record["checks"] = check(gen)
    if all(r["ok"] for r in record["checks"]) and not args.no_timing:
        extra = VARIANTS if args.variants else {}
        record["timing"] = [timing(int(m), args.rounds, gen, extra) for m in args.tokens.split(",")]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
