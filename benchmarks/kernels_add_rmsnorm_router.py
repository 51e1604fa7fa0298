"""The fused residual add + RMSNorm + router decision (``templates/add_rmsnorm_router.py``) against what the model runs
without it: Inductor's add + RMSNorm kernel (``torch.compile`` of the same PyTorch code) and the router kernel
(``router_mask``) on its output. Llama-3-8B (H = 4096, G = 8 attention / 112 FFN groups) and SmolLM2-135M (H = 576,
G = 3 / 12) router shapes, bf16 residuals, fp32 routers (R = 32).

    python3 benchmarks/kernels_add_rmsnorm_router.py [--tokens 4096,1024,16384] [--rounds 5] [--sweep] [--out FILE]

Times: median µs of CUDA-graph replays over rotated inputs (>= 150 MB of ``a`` / ``b``, so L2 holds none of them), in
interleaved rounds (unfused, fused, every ``--sweep`` configuration, ...). Beside each: ``x`` equal to the
reference's, the largest ``y`` difference (in units of the dtype's last place at the value), the fraction of
decisions that differ from the reference (near-ties).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_linear import bench_graph  # noqa: E402

from wide_compile.templates.add_rmsnorm_router import add_rmsnorm_router  # noqa: E402
from wide_compile.templates.add_rmsnorm_router_reference import (  # noqa: E402
    add_rmsnorm_router_reference,
    rmsnorm_reference,
)
from wide_compile.templates.router_mask import router_mask  # noqa: E402

RANK, EPS = 32, 1e-5
SHAPES = ((4096, 112), (4096, 8), (576, 12), (576, 3))  # (H, G)
SWEEP = [dict(BLOCK_M=bm, BLOCK_K=bk, num_warps=w, num_stages=st)
         for bm in (16, 32) for bk in (128, 256) for w in (4, 8) for st in (2, 3, 4)]


def add_norm(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor):
    x = a + b
    return x, rmsnorm_reference(x, w, EPS)


def operands(m: int, hidden: int, groups: int, gen: torch.Generator):
    rotations = max(1, min(64, (150 << 20) // (2 * m * hidden * 2)))
    ab = [(torch.randn(m, hidden, generator=gen).cuda().bfloat16(), torch.randn(m, hidden, generator=gen).cuda()
           .bfloat16()) for _ in range(rotations)]
    nw = (torch.rand(hidden, generator=gen) + 0.5).cuda().bfloat16()
    router = [torch.randn(RANK, hidden, generator=gen) / hidden**0.5, torch.randn(RANK, generator=gen) * 0.1,
              torch.randn(2 * groups, RANK, generator=gen) / RANK**0.5, torch.zeros(2 * groups)]
    return ab, nw, [t.cuda() for t in router]


def ulps(y: torch.Tensor, ref: torch.Tensor) -> float:
    spacing = torch.finfo(ref.dtype).eps * ref.float().abs().clamp_min(torch.finfo(ref.dtype).tiny)
    return ((y.float() - ref.float()).abs() / spacing).max().item()


def measure(m: int, hidden: int, groups: int, gen: torch.Generator, rounds: int, sweep: bool) -> list[dict]:
    ab, nw, router = operands(m, hidden, groups, gen)
    compiled = torch.compile(add_norm, dynamic=False)
    variants = {"unfused": lambda a, b: router_mask(compiled(a, b, nw)[0], *router),
                "fused": lambda a, b: add_rmsnorm_router(a, b, nw, EPS, *router)}
    for i, cfg in enumerate(SWEEP if sweep else []):
        variants[f"cfg{i}"] = lambda a, b, cfg=cfg: add_rmsnorm_router(a, b, nw, EPS, *router, config=cfg)
    samples = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            try:
                samples[name].append(bench_graph([lambda a=a, b=b, fn=fn: fn(a, b) for a, b in ab]))
            except Exception as e:  # a configuration that does not fit: report, go on
                samples[name].append(float("nan"))
                print(f"  {name} failed: {type(e).__name__}: {str(e)[:100]}", flush=True)
    xr, yr, mr = add_rmsnorm_router_reference(*ab[0], nw, EPS, *router)
    rows = []
    for name, fn in variants.items():
        row = {"M": m, "H": hidden, "G": groups, "variant": name, "rotations": len(ab),
               "us": statistics.median(samples[name]), "rounds_us": samples[name]}
        if name != "unfused":
            row["config"] = SWEEP[int(name[3:])] if name.startswith("cfg") else "default"
            x, y, mk = fn(*ab[0])
            row.update(x_equal=torch.equal(x, xr), y_max_ulps=ulps(y, yr), decisions_differ=(mk != mr).float().mean()
                       .item())
        rows.append(row)
    base = rows[0]["us"]
    for r in sorted(rows, key=lambda r: r["us"])[:4] + [rows[0]]:
        print(f"M={m:6d} H={hidden:5d} G={groups:4d} {r['variant']:8s} {r['us']:8.1f} us ({base / r['us']:.2f}x) "
              f"{r.get('config', '')} x_equal={r.get('x_equal')} y_ulps={r.get('y_max_ulps')} "
              f"differ={r.get('decisions_differ')}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="4096,1024,16384")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sweep", action="store_true", help="also time every configuration of SWEEP")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "kernels_add_rmsnorm_router.json"))
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator().manual_seed(0)
    meta = {"command": "python3 benchmarks/kernels_add_rmsnorm_router.py " + " ".join(sys.argv[1:]),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    rows = []
    for m in (int(t) for t in args.tokens.split(",")):
        for hidden, groups in SHAPES:
            torch._dynamo.reset()
            rows += measure(m, hidden, groups, gen, args.rounds, args.sweep)
            with open(args.out, "w") as f:
                json.dump({"meta": meta, "sweep": SWEEP if args.sweep else [], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
