"""Residual add + RMSNorm + router decision: one launch (``templates/router_rms_norm.py``) against what the compiled
model ran before it (Inductor's add + RMSNorm kernel, then the router template reading ``x`` again).

    python3 benchmarks/kernels_router_norm.py --out benchmarks/results [--sweep]

Shapes: Llama-3-8B (H = 4096, G = 8 attention / 112 FFN groups) and SmolLM2-135M (H = 576, G = 3 / 12), bf16
residuals, R = 32, M in {1024, 4096, 16384}. "separate" = ``torch.compile`` (Inductor, no CUDA graphs of its own) of
``x = a + b; y = RMSNorm(x)`` followed by ``router_mask(x)``; "fused" = ``router_rms_norm(a, b)`` with its defaults.
Times: median µs per call of CUDA-graph replays over rotated inputs (>= 150 MB, so L2 does not hold them), as
``kernels_router.py``. Checks: ``x`` equal, ``y`` max abs difference, fraction of decisions that differ (near-ties).
``--sweep``: token tile / K step / warps / stages of the fused kernel at 4096 tokens
(``kernels_router_norm_sweep.json``).
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
from kernels_router import make_weights  # noqa: E402

from wide_compile.templates.router_mask import router_mask  # noqa: E402
from wide_compile.templates.router_rms_norm import router_rms_norm  # noqa: E402
from wide_compile.templates.router_rms_norm_reference import rms_norm_reference  # noqa: E402

EPS = 1e-5
DEVICE = "cuda"
SHAPES = ((4096, 8), (4096, 112), (576, 3), (576, 12))  # (H, G)
TOKENS = (1024, 4096, 16384)
SWEEP = ([dict(BLOCK_M=bm, BLOCK_K=bk, NORM_K=bk, ROUTER_LOOP=False, num_warps=w, num_stages=1)
          for bm in (16, 32) for bk in (128, 256, 512) for w in (4, 8)]
         + [dict(BLOCK_M=bm, BLOCK_K=bk, NORM_K=nk, ROUTER_LOOP=True, num_warps=w, num_stages=s)
            for bm in (16, 32) for bk in (128,) for nk in (512, 1024) for w in (4, 8) for s in (1, 2)])
SWEEP_SHAPES = ((4096, 112), (576, 12))


@torch.compile(dynamic=False)
def add_rms_norm(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = a + b
    return x, rms_norm_reference(x, weight, EPS)


def separate(a, b, weight, router):
    x, y = add_rms_norm(a, b, weight)
    return x, y, router_mask(x, *router)


def operands(m: int, hidden: int, groups: int, gen: torch.Generator) -> list[tuple]:
    """Rotated (a, b, norm weight, router weights), >= 150 MB in all (at most 160 copies)."""
    rotations = max(1, min(160, (150 << 20) // (2 * m * hidden * 2)))
    return [(torch.randn(m, hidden, generator=gen).to(DEVICE, torch.bfloat16),
             torch.randn(m, hidden, generator=gen).to(DEVICE, torch.bfloat16),
             (1 + 0.2 * torch.randn(hidden, generator=gen)).to(DEVICE, torch.bfloat16),
             make_weights(hidden, groups, gen)) for _ in range(rotations)]


def check(ops: list[tuple], cfg: dict | None = None) -> dict:
    a, b, weight, router = ops[0]
    x, y, mask = separate(a, b, weight, router)
    fx_, fy, fmask = router_rms_norm(a, b, weight, EPS, *router, config=cfg)
    return {"x_equal": bool(torch.equal(x, fx_)), "y_max_abs_diff": (y.float() - fy.float()).abs().max().item(),
            "decisions_differ": (mask != fmask).float().mean().item()}


def measure(m: int, hidden: int, groups: int, gen: torch.Generator) -> dict:
    ops = operands(m, hidden, groups, gen)
    row = {"M": m, "H": hidden, "G": groups, "rotations": len(ops)}
    row["separate_us"] = bench_graph([lambda o=o: separate(*o) for o in ops])
    row["router_only_us"] = bench_graph([lambda o=o: router_mask(o[0], *o[3]) for o in ops])
    row["fused_us"] = bench_graph([lambda o=o: router_rms_norm(o[0], o[1], o[2], EPS, *o[3]) for o in ops])
    row["speedup"] = row["separate_us"] / row["fused_us"]
    row.update(check(ops))
    print(f"H={hidden:5d} G={groups:4d} M={m:6d}  separate {row['separate_us']:7.1f} (router alone "
          f"{row['router_only_us']:6.1f})  fused {row['fused_us']:7.1f} us  {row['speedup']:.2f}x  "
          f"x equal {row['x_equal']}  y diff {row['y_max_abs_diff']:.1e}  differ {row['decisions_differ']:.1e}",
          flush=True)
    return row


def sweep(gen: torch.Generator, m: int = 4096) -> list[dict]:
    rows = []
    for hidden, groups in SWEEP_SHAPES:
        ops = operands(m, hidden, groups, gen)
        default = bench_graph([lambda o=o: router_rms_norm(o[0], o[1], o[2], EPS, *o[3]) for o in ops])
        for cfg in SWEEP:
            try:
                us = bench_graph([lambda o=o: router_rms_norm(o[0], o[1], o[2], EPS, *o[3], config=cfg)
                                  for o in ops])
                checks = check(ops, cfg)
            except Exception as e:  # a configuration that does not compile / fit: report, go on
                us, checks = float("nan"), {}
                print(f"  config {cfg} failed: {type(e).__name__}: {str(e)[:100]}", flush=True)
            rows.append({"M": m, "H": hidden, "G": groups, **cfg, "fused_us": us, "default_us": default, **checks})
        best = sorted((r for r in rows if r["H"] == hidden and r["G"] == groups and r["fused_us"] == r["fused_us"]),
                      key=lambda r: r["fused_us"])[:3]
        for r in best:
            print(f"sweep H={hidden} G={groups} M={m}: default {default:.1f} us; "
                  f"{ {k: r[k] for k in SWEEP[0]} }: {r['fused_us']:.1f} us", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--sweep", action="store_true", help="also sweep the fused kernel's launch configuration "
                        "at 4096 tokens (kernels_router_norm_sweep.json)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator().manual_seed(0)
    meta = {"command": f"python3 benchmarks/kernels_router_norm.py --out {args.out}" + (" --sweep" if args.sweep
                                                                                         else ""),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    os.makedirs(args.out, exist_ok=True)
    rows = [measure(m, hidden, groups, gen) for hidden, groups in SHAPES for m in TOKENS]
    with open(os.path.join(args.out, "kernels_router_norm.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if args.sweep:
        with open(os.path.join(args.out, "kernels_router_norm_sweep.json"), "w") as f:
            json.dump({"meta": meta, "rows": sweep(gen)}, f, indent=1)


if __name__ == "__main__":
    main()
