"""Diagnostic: where the fused residual add + RMSNorm + router kernel (``templates/add_rmsnorm_router.py``) spends its
time (H200, H = 4096, 4096 tokens, G = 112). Timing-only copies of its kernel that differ in one thing each:

- ``full``: the library kernel's work (both passes, the router's K steps with W_in split in registers, epilogue);
- ``norm_only``: no router work at all (no W_in loads, no products, no epilogue: the add + RMSNorm part alone);
- ``presplit``: W_in's two bf16 parts read from a pre-split copy (``[2, R, H]`` bf16) instead of split per step;
- ``no_pass2_reload``: pass 2 recomputes ``x = a + b`` from ``a`` and ``b`` instead of reloading the stored ``x``.

Each at a few (BLOCK_M, BLOCK_K, warps, stages), against the unfused pair (Inductor's add + RMSNorm, then
``router_mask``) in interleaved rounds of CUDA-graph replays over rotated inputs. Outputs of the timing-only variants
are not used.

    python3 benchmarks/add_rmsnorm_router_probe.py [--rounds 3] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_add_rmsnorm_router import EPS, add_norm, operands  # noqa: E402
from kernels_linear import bench_graph  # noqa: E402

from wide_compile.templates.router_mask import router_decisions, router_h_step, router_mask  # noqa: E402


@triton.jit
def _probe_kernel(a_ptr, b_ptr, nw_ptr, x_ptr, y_ptr, w_in_ptr, w2_ptr, b_in_ptr, w_out_ptr, b_out_ptr, mask_ptr,
                  M, H, R, G, eps,
                  BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr,
                  ROUTER: tl.constexpr, PRESPLIT: tl.constexpr, RELOAD_X: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    valid_m = offs_m < M
    offs_r = tl.arange(0, BLOCK_R)
    valid_r = offs_r < R
    offs_k = tl.arange(0, BLOCK_K)
    rows = offs_m.to(tl.int64)[:, None] * H
    sum_sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k in range(0, H, BLOCK_K):
        cols = k + offs_k
        io_mask = valid_m[:, None]
        a = tl.load(a_ptr + rows + cols[None, :], mask=io_mask, other=0.0)
        b = tl.load(b_ptr + rows + cols[None, :], mask=io_mask, other=0.0)
        x = (a.to(tl.float32) + b.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(x_ptr + rows + cols[None, :], x, mask=io_mask)
        xf = x.to(tl.float32)
        sum_sq += tl.sum(xf * xf, axis=1)
        if ROUTER:
            if PRESPLIT:
                w_ptrs = w2_ptr + offs_r.to(tl.int64)[None, :] * H + cols[:, None]
                w_hi = tl.load(w_ptrs, mask=valid_r[None, :], other=0.0)
                w_mid = tl.load(w_ptrs + R * H, mask=valid_r[None, :], other=0.0)
                acc = tl.dot(x, w_mid, acc)
                acc = tl.dot(x, w_hi, acc)
            else:
                wt = tl.load(w_in_ptr + offs_r.to(tl.int64)[None, :] * H + cols[:, None], mask=valid_r[None, :],
                             other=0.0)
                acc = router_h_step(x, wt, acc, True, 2)
    inv_rms = tl.math.rsqrt(sum_sq / H + eps)
    tl.debug_barrier()
    for k in range(0, H, BLOCK_K):
        cols = k + offs_k
        io_mask = valid_m[:, None]
        nw = tl.load(nw_ptr + cols)
        if RELOAD_X:
            x = tl.load(x_ptr + rows + cols[None, :], mask=io_mask, other=0.0)
        else:
            a = tl.load(a_ptr + rows + cols[None, :], mask=io_mask, other=0.0)
            b = tl.load(b_ptr + rows + cols[None, :], mask=io_mask, other=0.0)
            x = (a.to(tl.float32) + b.to(tl.float32)).to(x_ptr.dtype.element_ty)
        t = (x.to(tl.float32) * inv_rms[:, None]).to(x_ptr.dtype.element_ty)
        y = nw.to(tl.float32)[None, :] * t.to(tl.float32)
        tl.store(y_ptr + rows + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=io_mask)
    if ROUTER:
        router_decisions(acc, offs_m, valid_m, offs_r, valid_r, b_in_ptr, w_out_ptr, b_out_ptr, mask_ptr, R, G,
                         BLOCK_G, True, "tf32x3")


VARIANTS = {"full": dict(ROUTER=True, PRESPLIT=False, RELOAD_X=True),
            "norm_only": dict(ROUTER=False, PRESPLIT=False, RELOAD_X=True),
            "presplit": dict(ROUTER=True, PRESPLIT=True, RELOAD_X=True),
            "no_pass2_reload": dict(ROUTER=True, PRESPLIT=False, RELOAD_X=False)}
CONFIGS = ((16, 256, 4, 3), (16, 128, 4, 4), (32, 128, 4, 3), (64, 64, 4, 3), (64, 128, 8, 3))


def launch(a, b, nw, router, w2, x, y, mask, variant: dict, cfg: tuple):
    bm, bk, warps, stages = cfg
    m, h = a.shape
    w_in, b_in, w_out, b_out = router
    _probe_kernel[(triton.cdiv(m, bm),)](a, b, nw, x, y, w_in, w2, b_in, w_out, b_out, mask, m, h, w_in.shape[0],
                                         w_out.shape[0] // 2, EPS, BLOCK_M=bm, BLOCK_K=bk, BLOCK_R=32, BLOCK_G=64,
                                         **variant, num_warps=warps, num_stages=stages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "add_rmsnorm_router_probe.json"))
    args = parser.parse_args()
    m, hidden, groups = 4096, 4096, 112
    ab, nw, router = operands(m, hidden, groups, torch.Generator().manual_seed(0))
    w_hi = router[0].bfloat16()
    w2 = torch.stack([w_hi, (router[0] - w_hi.float()).bfloat16()]).contiguous()
    x, y = torch.empty_like(ab[0][0]), torch.empty_like(ab[0][0])
    mask = torch.empty(m, groups, device="cuda")
    compiled = torch.compile(add_norm, dynamic=False)
    fns = {"unfused": lambda a, b: router_mask(compiled(a, b, nw)[0], *router)}
    for name, variant in VARIANTS.items():
        for cfg in CONFIGS:
            fns[f"{name} {cfg}"] = lambda a, b, variant=variant, cfg=cfg: launch(a, b, nw, router, w2, x, y, mask,
                                                                                   variant, cfg)
    samples = {k: [] for k in fns}
    for _ in range(args.rounds):
        for k, fn in fns.items():
            try:
                samples[k].append(bench_graph([lambda a=a, b=b, fn=fn: fn(a, b) for a, b in ab]))
            except Exception as e:
                samples[k].append(float("nan"))
                print(f"{k} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
    rows = [{"variant": k, "us": statistics.median(v), "rounds_us": v} for k, v in samples.items()]
    for r in rows:
        print(f"{r['variant']:40s} {r['us']:8.1f} us", flush=True)
    with open(args.out, "w") as f:
        json.dump({"command": "python3 benchmarks/add_rmsnorm_router_probe.py --rounds " + str(args.rounds),
                   "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "M": m, "H": hidden, "G": groups,
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
