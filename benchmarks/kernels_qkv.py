"""The query projection with the key and value projections in one decode launch vs what the model runs without it.

    python3 benchmarks/kernels_qkv.py --out benchmarks/results

Llama-3-8B attention projections (q: 4096 x 4096 in 8 groups of 512, 50% random per-token group masks; k, v:
1024 x 4096, dense) at 1-16 tokens, bf16. "separate": our group-skipping q GEMV, then cuBLAS for k and v (three or
more launches: cuBLAS adds split-K reductions); "joined": ``output_group_linear_with_dense`` (one GEMV launch,
``passes/dense_siblings.py`` puts it in the compiled model); "dense": cuBLAS for all three. Median µs per call of
CUDA-graph replays over rotated weight copies (every call misses in L2). Prints ``JOINED_FASTER=1`` when "joined"
beats "separate" at every token count (the backend's ``wide.fuse_dense_siblings`` default). ``--sweep`` instead times
the joined launch over a grid of its GEMV configurations at 1 and 4 tokens (``kernels_qkv_sweep.json``), or at the
token counts ``--sweep-tokens`` names (``kernels_qkv_sweep_m8_16.json`` for ``--sweep-tokens 8,16``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_linear import bench_graph  # noqa: E402

from wide_compile.templates import output_group_linear  # noqa: E402
from wide_compile.templates.group_linear_with_dense import output_group_linear_with_dense  # noqa: E402

HIDDEN, KV, GROUP = 4096, 1024, 512
TOKENS = (1, 2, 4, 8, 16)
ROTATIONS = 8  # 8 x 50 MB of weights: far beyond the 50 MB L2


SWEEP = [dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT=sp, num_warps=4, num_stages=st)
         for bn in (32, 64) for bk in (128, 256) for sp in (2, 4, 8) for st in (3, 5)]


ROWS_SWEEP = [dict(ROWS=0), *(dict(ROWS=r, num_warps=w) for r, w in ((1, 8), (2, 4), (2, 8), (4, 8)))]


def sweep(gen: torch.Generator, weights: list, out_dir: str, tokens: tuple = (1, 4), rows_gemv: bool = False) -> None:
    """The joined launch at each of ``tokens`` over ``SWEEP`` (``rows_gemv``: ``ROWS_SWEEP``), default config first;
    rows and the best per M."""
    configs = ROWS_SWEEP if rows_gemv else SWEEP
    rows = []
    for m in tokens:
        xs = [torch.randn(m, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(ROTATIONS)]
        masks = [torch.rand(m, HIDDEN // GROUP, generator=gen, device="cuda") < 0.5 for _ in range(ROTATIONS)]
        calls = list(zip(xs, masks, weights))
        for cfg in [None, *configs]:
            def joined(x, mk, w, cfg=cfg):
                return output_group_linear_with_dense(x, w[0], mk, GROUP, None, [w[1], w[2]], [None, None], config=cfg)
            try:
                us = bench_graph([lambda c=c: joined(*c) for c in calls])
            except Exception as exc:  # noqa: BLE001 - a config that does not compile is a row, not a crash
                us = float("nan")
                print(f"  {cfg} failed: {type(exc).__name__}: {str(exc)[:100]}", flush=True)
            rows.append({"M": m, "config": cfg or "default", "joined_us": us})
        best = min((r for r in rows if r["M"] == m), key=lambda r: r["joined_us"])
        default = next(r for r in rows if r["M"] == m and r["config"] == "default")
        print(f"sweep M={m}: default {default['joined_us']:.1f} µs, best {best['joined_us']:.1f} µs at "
              f"{best['config']}", flush=True)
    extra = "" if tokens == (1, 4) else " --sweep-tokens " + ",".join(map(str, tokens))
    meta = {"command": f"python3 benchmarks/kernels_qkv.py --out {out_dir} --sweep{extra}",
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    os.makedirs(out_dir, exist_ok=True)
    if rows_gemv:
        meta["command"] += " --sweep-rows"
        name = "kernels_qkv_sweep_rows.json"
    else:
        name = "kernels_qkv_sweep.json" if not extra else f"kernels_qkv_sweep_m{'_'.join(map(str, tokens))}.json"
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--sweep", action="store_true", help="time the joined launch's GEMV configurations instead")
    parser.add_argument("--sweep-tokens", default="1,4", help="token counts of --sweep, comma-separated")
    parser.add_argument("--sweep-rows", action="store_true", help="with --sweep: the row-streaming one-token GEMV "
                        "(templates/gemv_rows.py) against the MMA GEMV instead (kernels_qkv_sweep_rows.json)")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen, device="cuda") / shape[-1] ** 0.5).to(torch.bfloat16)

    weights = [(rand(HIDDEN, HIDDEN), rand(KV, HIDDEN), rand(KV, HIDDEN)) for _ in range(ROTATIONS)]
    if args.sweep:
        sweep(gen, weights, args.out, tuple(int(t) for t in args.sweep_tokens.split(",")), args.sweep_rows)
        return
    rows = []
    for m in TOKENS:
        xs = [torch.randn(m, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(ROTATIONS)]
        masks = [torch.rand(m, HIDDEN // GROUP, generator=gen, device="cuda") < 0.5 for _ in range(ROTATIONS)]
        calls = list(zip(xs, masks, weights))
        forms = {
            "separate": lambda x, mk, w: (output_group_linear(x, w[0], mk, GROUP), F.linear(x, w[1]),
                                          F.linear(x, w[2])),
            "joined": lambda x, mk, w: output_group_linear_with_dense(x, w[0], mk, GROUP, None, [w[1], w[2]],
                                                                      [None, None]),
            "dense": lambda x, mk, w: (F.linear(x, w[0]), F.linear(x, w[1]), F.linear(x, w[2])),
        }
        row = {"M": m}
        for name, fn in forms.items():
            row[f"{name}_us"] = bench_graph([lambda c=c, fn=fn: fn(*c) for c in calls])
        q_sep, k_sep, v_sep = forms["separate"](*calls[0])
        q_j, k_j, v_j = forms["joined"](*calls[0])
        row["max_abs_diff"] = max((a.float() - b.float()).abs().max().item()
                                  for a, b in ((q_sep, q_j), (k_sep, k_j), (v_sep, v_j)))
        row["joined_over_separate"] = row["separate_us"] / row["joined_us"]
        rows.append(row)
        print(f"M={m:2d}  separate {row['separate_us']:6.1f} µs  joined {row['joined_us']:6.1f} µs  dense "
              f"{row['dense_us']:6.1f} µs  separate/joined {row['joined_over_separate']:.2f}x  "
              f"max |diff| {row['max_abs_diff']:.1e}", flush=True)
    faster = all(r["joined_us"] < r["separate_us"] for r in rows)
    print(f"JOINED_FASTER={int(faster)}")
    meta = {"command": f"python3 benchmarks/kernels_qkv.py --out {args.out}", "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "WIDE_PDL": os.environ.get("WIDE_PDL", "0")}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "kernels_qkv.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "joined_faster_everywhere": faster}, f, indent=1)


if __name__ == "__main__":
    main()
