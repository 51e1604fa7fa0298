"""GPU probe of the experimental persistent warp-specialised gate/up GEMM (``templates/gemm_gated_up_persistent.py``).

Checks it against the Triton kernel (``gemm_gated_up.gated_up_gemm``, default config: bit for bit) and the PyTorch
reference (Llama-3-8B shapes: hidden 4096, 112 groups of 128 channels; ragged token counts; all-active, all-inactive,
random and clustered masks; group counts with half-active last tiles), then times it against the Triton kernel and
cuBLAS on the dense product (one GEMM on [W_gate; W_up]) in interleaved rounds of CUDA-graph replays over 3 rotated
weight copies (705 MB: L2 holds none of it between calls). Both kernels read the same plan, built outside the timing.

    python3 benchmarks/gated_up_persistent_probe.py [--tokens 1024,4096,16384] [--rounds 5] [--out FILE]
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
from wide_compile.templates.gemm_gated_up_persistent import gated_up_gemm_persistent

HIDDEN, INTER, GROUP = 4096, 14336, 128


def _mask(kind: str, m: int, gen: torch.Generator, p: float = 0.5) -> torch.Tensor:
    g = INTER // GROUP
    if kind == "all":
        return torch.ones(m, g, dtype=torch.bool, device="cuda")
    if kind == "none":
        return torch.zeros(m, g, dtype=torch.bool, device="cuda")
    if kind == "clustered":  # 6 router-like patterns
        patterns = torch.rand(6, g, generator=gen, device="cuda") < 0.5
        return patterns[torch.randint(0, 6, (m,), generator=gen, device="cuda")]
    if kind == "counts":  # group g has (g * 37) % (m + 1) active tokens: every kind of last tile
        counts = (torch.arange(g, device="cuda") * 37) % (m + 1)
        ranks = torch.rand(m, g, generator=gen, device="cuda").argsort(0).argsort(0)
        return ranks < counts[None, :]
    return torch.rand(m, g, device="cuda", generator=gen) < p


def check(gen: torch.Generator) -> list[dict]:
    wg, wu = ((torch.randn(INTER, HIDDEN, device="cuda", generator=gen) / HIDDEN**0.5).to(torch.bfloat16)
              for _ in range(2))
    rows = []
    for m in (4096, 4100, 1000, 100, 7):
        for kind in ("random", "all", "none", "clustered", "counts"):
            x = torch.randn(m, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
            mask = _mask(kind, m, gen)
            plan = build_group_plan(mask, parts=("output",))
            ours = gated_up_gemm_persistent(x, wg, wu, plan.group_tokens, plan.group_counts, GROUP)
            few = gated_up_gemm_persistent(x, wg, wu, plan.group_tokens, plan.group_counts, GROUP, ctas=7, stages=3)
            triton_out = gated_up_gemm(x, wg, wu, plan.group_tokens, plan.group_counts, GROUP, "silu")
            ref = gated_up_groups_reference(x, wg, wu, mask, GROUP, "silu").float()
            inactive = ~mask.repeat_interleave(GROUP, dim=-1)
            row = dict(tokens=m, mask=kind, nan=bool(torch.isnan(ours).any()),
                       inactive_zero=bool((ours[inactive] == 0).all()),
                       rel_err_ref=float((ours.float() - ref).norm() / ref.norm().clamp_min(1e-30)),
                       max_diff_triton=float((ours.float() - triton_out.float()).abs().max()),
                       equal_triton=bool(torch.equal(ours, triton_out)),
                       equal_few_ctas=bool(torch.equal(ours, few)))
            row["ok"] = (not row["nan"] and row["inactive_zero"] and row["rel_err_ref"] < 1e-2 and row["equal_few_ctas"])
            rows.append(row)
            print(f"check M={m:5d} {kind:9s} ok={row['ok']} rel_err={row['rel_err_ref']:.2e} "
                  f"max|persistent-triton|={row['max_diff_triton']:.2e} equal={row['equal_triton']} "
                  f"7 CTAs equal={row['equal_few_ctas']}", flush=True)
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


VARIANTS = {"persistent": {}, "persistent_3_stages": dict(stages=3), "persistent_group_n_16": dict(group_n=16)}


def timing(tokens: int, p: float, rounds: int, gen: torch.Generator, variants: dict) -> dict:
    copies = 3
    ws = [tuple((torch.randn(INTER, HIDDEN, device="cuda", generator=gen) / HIDDEN**0.5).to(torch.bfloat16)
                for _ in range(2)) for _ in range(copies)]
    cat = [torch.cat(w, 0) for w in ws]
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    mask = _mask("random", tokens, gen, p)
    plan = build_group_plan(mask, parts=("output",))
    t, c = plan.group_tokens, plan.group_counts
    fns = {"triton": [lambda w=w: gated_up_gemm(x, w[0], w[1], t, c, GROUP, "silu") for w in ws],
           "cublas_dense": [lambda w=w: F.linear(x, w) for w in cat]}
    for name, kw in variants.items():
        fns[name] = [lambda w=w, kw=kw: gated_up_gemm_persistent(x, w[0], w[1], t, c, GROUP, **kw) for w in ws]
    samples = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            samples[k].append(graph_us(f))
    flops = 2 * 2 * int(mask.sum()) * GROUP * HIDDEN
    out = {"tokens": tokens, "active_fraction": p, "active_pairs": int(mask.sum()), "rounds": samples,
           "us": {k: statistics.median(v) for k, v in samples.items()}}
    out["useful_TFLOPs"] = {k: flops / (v * 1e-6) / 1e12 for k, v in out["us"].items() if k != "cublas_dense"}
    line = ", ".join(f"{k} {v:.1f}" for k, v in out["us"].items())
    print(f"time M={tokens} active {p:.2f}: {line} us; dense/triton {out['us']['cublas_dense'] / out['us']['triton']:.2f}x"
          f", dense/persistent {out['us']['cublas_dense'] / out['us']['persistent']:.2f}x", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1024,4096,16384")
    ap.add_argument("--fractions", default="0.5", help="active fractions of the random masks")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-timing", action="store_true")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    record = {"command": "python3 benchmarks/gated_up_persistent_probe.py " + " ".join(sys.argv[1:]),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    record["checks"] = check(gen)
    if all(r["ok"] for r in record["checks"]) and not args.no_timing:
        record["timing"] = [timing(int(m), float(p), args.rounds, gen, VARIANTS)
                            for m in args.tokens.split(",") for p in args.fractions.split(",")]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
