"""The fused router decision (``templates/router_mask.py``) vs the unfused PyTorch path, Llama-3-8B router shapes.

    python3 benchmarks/kernels_router.py --out benchmarks/results

A router maps ``x[M, 4096]`` (bf16 residual) to ``mask[M, G]`` (G = 8 attention groups, 112 FFN groups) through
``h = x W_in^T + b_in`` (R = 32) and two logit columns per group. "unfused" is what the model runs without the
lowering (``router_mask_reference``: fp32 cast of x, cuBLAS fp32 GEMM / GEMV x2, compare: several kernels); "fused"
is the template with its defaults (at M > 16 with bf16 x: W_in split in three bf16 parts on tensor cores, see the
template's docstring); "fused fp32" forces its fp32 FMA path (``W_SPLIT3 = False``), the only path of the last
measured version. Times: median µs of CUDA-graph replays, each replay running the op on rotated copies of x and the
weights (>= 150 MB, so L2 does not hold them, as in a model where other layers run in between), per call.
Decisions: fraction of (token, group) pairs where the fused mask differs from the unfused one (near-ties only).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_linear import bench_graph  # noqa: E402

from wide_compile.templates.router_mask import router_mask  # noqa: E402
from wide_compile.templates.router_mask_reference import router_mask_reference  # noqa: E402

HIDDEN, RANK = 4096, 32
TOKENS = (1, 2, 8, 32, 64, 256, 1024, 4096, 16384)
GROUPS = (8, 112)
VARIANTS = {
    "unfused": lambda x, w: router_mask_reference(x, *w),
    "fused": lambda x, w: router_mask(x, *w),
    "fused_fp32": lambda x, w: router_mask(x, *w, config={"W_SPLIT3": False}),
}


def make_weights(groups: int, gen: torch.Generator) -> list[torch.Tensor]:
    w_in = torch.randn(RANK, HIDDEN, generator=gen) / HIDDEN**0.5
    b_in = torch.randn(RANK, generator=gen) * 0.1
    w_out = torch.randn(2 * groups, RANK, generator=gen) / RANK**0.5
    b_out = torch.zeros(2 * groups)
    return [t.cuda() for t in (w_in, b_in, w_out, b_out)]


def measure(m: int, groups: int, gen: torch.Generator) -> dict:
    x_bytes = m * HIDDEN * 2
    rotations = max(1, min(320, (150 << 20) // (x_bytes + RANK * HIDDEN * 4)))
    xs = [torch.randn(m, HIDDEN, generator=gen).to("cuda", torch.bfloat16) for _ in range(rotations)]
    ws = [make_weights(groups, gen) for _ in range(rotations)]
    row = {"M": m, "G": groups, "rotations": rotations}
    ref = router_mask_reference(xs[0], *ws[0])
    for name, fn in VARIANTS.items():
        row[f"{name}_us"] = bench_graph([lambda x=x, w=w, fn=fn: fn(x, w) for x, w in zip(xs, ws)])
        row[f"{name}_differ"] = (fn(xs[0], ws[0]) != ref).float().mean().item()
    row["speedup"] = row["unfused_us"] / row["fused_us"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # the unfused path is an fp32 GEMM, as in the model
    gen = torch.Generator().manual_seed(0)
    rows = []
    for groups in GROUPS:
        for m in TOKENS:
            rows.append(measure(m, groups, gen))
            r = rows[-1]
            print(f"G={groups:4d} M={m:6d}  unfused {r['unfused_us']:8.1f}  fused {r['fused_us']:8.1f}  "
                  f"fused_fp32 {r['fused_fp32_us']:8.1f} us  speedup {r['speedup']:.2f}x  "
                  f"differ {r['fused_differ']:.1e}", flush=True)
    meta = {"command": "python3 benchmarks/kernels_router.py --out " + args.out, "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "kernels_router.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    lines = [f"# Fused router decision vs unfused PyTorch ops (H={HIDDEN}, R={RANK}, bf16 x, fp32 routers)", "",
             f"GPU: {meta['gpu']}; torch {meta['torch']}; triton {meta['triton']}; {meta['date']}", "",
             f"Command: `{meta['command']}`", "", __doc__.split("\n\n", 2)[2].strip(), "",
             "| G | M | unfused µs | fused µs | fused fp32 µs | speed-up | decisions differ |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['G']} | {r['M']} | {r['unfused_us']:.1f} | {r['fused_us']:.1f} | {r['fused_fp32_us']:.1f} | "
              f"{r['speedup']:.2f}x | {r['fused_differ']:.1e} |" for r in rows]
    with open(os.path.join(args.out, "kernels_router.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
