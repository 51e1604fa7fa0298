"""Residual add, RMSNorm and the router decision of the next routed block in one Triton launch.

``add_rmsnorm_router(a, b, norm_weight, eps, w_in, b_in, w_out, b_out) -> (x, y, mask)`` (reference and checks:
``add_rmsnorm_router_reference.py``). In a routed decoder layer the residual add ``x = a + b`` feeds both the next
norm and the router, which reads the residual before the norm. Unfused, Inductor's add + RMSNorm kernel reads ``a``
and ``b`` and writes ``x`` and ``y``, and the router kernel (``router_mask.py``) reads ``x`` once more: at 4096 tokens
and H = 4096 that is 32 MB and a launch per router on top of the norm's 128 MB. Here each program takes ``BLOCK_M``
whole rows:

1. over H in ``BLOCK_K`` steps: load ``a``, ``b``; ``x = a + b`` rounded to the input dtype (as a bf16 / fp16
   ``torch.add``); store ``x``; accumulate the rows' ``sum(x^2)`` in fp32 and ``x W_in^T`` with the router kernel's
   step (``router_h_step``: on tensor cores against two 16-bit parts of the fp32 ``W_in`` for 16-bit ``x``);
2. ``r = rsqrt(sum / H + eps)``; over H again: reload ``x`` (this program's own rows, just written: L2), store
   ``y = norm_weight * (x * r).to(x.dtype)`` in the promoted dtype;
3. the router's epilogue (``router_decisions``): ``+ b_in``, the logit margin per group, ``mask`` 0 / 1.

``x`` and ``y`` equal the reference's but where the fp32 sum of squares, summed in another order, moves ``y`` across
a rounding boundary (one unit in the last place); ``mask`` equals ``router_mask_reference(x, ...)`` except on
near-ties, as ``router_mask`` does. Runs the reference where Triton cannot run (CPU without ``TRITON_INTERPRET=1``)
and for 16-bit router weights.
"""
from __future__ import annotations

import torch

from ._triton_utils import HAS_TRITON, can_run_triton, cdiv, interpreting, next_pow2
from .add_rmsnorm_router_reference import (add_rmsnorm_router_reference, check_add_rmsnorm_router_args,
                                           norm_output_dtype)
from .router_mask import EPILOGUE, _block_g

if HAS_TRITON:
    import triton
    import triton.language as tl

    from .router_mask import router_decisions, router_h_step

    @triton.jit
    def _add_rmsnorm_router_kernel(
        a_ptr, b_ptr, nw_ptr, x_ptr, y_ptr, w_in_ptr, b_in_ptr, w_out_ptr, b_out_ptr, mask_ptr,
        M, H, R, G, eps,
        BLOCK_M: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_G: tl.constexpr,
        EVEN_K: tl.constexpr,
        W_SPLIT: tl.constexpr,
        LOGIT_DIFF: tl.constexpr,
        EPILOGUE_PRECISION: tl.constexpr,
    ):
        pid = tl.program_id(0)
        offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        valid_m = offs_m < M
        offs_r = tl.arange(0, BLOCK_R)
        valid_r = offs_r < R
        offs_k = tl.arange(0, BLOCK_K)
        rows = offs_m.to(tl.int64)[:, None] * H
        # ---- pass 1: x = a + b (stored), sum of squares, x W_in^T
        sum_sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        for k in range(0, H, BLOCK_K):
            cols = k + offs_k
            if EVEN_K:
                io_mask = valid_m[:, None]
                w_mask = valid_r[None, :]
            else:
                io_mask = valid_m[:, None] & (cols < H)[None, :]
                w_mask = (cols < H)[:, None] & valid_r[None, :]
            a = tl.load(a_ptr + rows + cols[None, :], mask=io_mask, other=0.0)
            b = tl.load(b_ptr + rows + cols[None, :], mask=io_mask, other=0.0)
            x = (a.to(tl.float32) + b.to(tl.float32)).to(x_ptr.dtype.element_ty)
            tl.store(x_ptr + rows + cols[None, :], x, mask=io_mask)
            xf = x.to(tl.float32)
            sum_sq += tl.sum(xf * xf, axis=1)
            wt = tl.load(w_in_ptr + offs_r.to(tl.int64)[None, :] * H + cols[:, None], mask=w_mask, other=0.0)
            acc = router_h_step(x, wt, acc, W_SPLIT, 2)
        inv_rms = tl.math.rsqrt(sum_sq / H + eps)
        tl.debug_barrier()  # pass 2 reads x that other threads of this program stored
        # ---- pass 2: y = norm_weight * (x * r).to(x.dtype)
        for k in range(0, H, BLOCK_K):
            cols = k + offs_k
            if EVEN_K:
                io_mask = valid_m[:, None]
                nw = tl.load(nw_ptr + cols)
            else:
                io_mask = valid_m[:, None] & (cols < H)[None, :]
                nw = tl.load(nw_ptr + cols, mask=cols < H, other=0.0)
            x = tl.load(x_ptr + rows + cols[None, :], mask=io_mask, other=0.0)
            t = (x.to(tl.float32) * inv_rms[:, None]).to(x_ptr.dtype.element_ty)
            y = nw.to(tl.float32)[None, :] * t.to(tl.float32)
            tl.store(y_ptr + rows + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=io_mask)
        # ---- the router's decisions
        router_decisions(acc, offs_m, valid_m, offs_r, valid_r, b_in_ptr, w_out_ptr, b_out_ptr, mask_ptr, R, G,
                         BLOCK_G, LOGIT_DIFF, EPILOGUE_PRECISION)


def add_rmsnorm_router_config(num_tokens: int, hidden: int, rank: int, groups: int) -> dict:
    """Default launch configuration (the keys :func:`add_rmsnorm_router` accepts in ``config``)."""
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_K=64, num_warps=4, num_stages=1)
    return dict(BLOCK_M=16, BLOCK_K=min(256, max(16, next_pow2(hidden))), num_warps=4, num_stages=3)


def _use_kernel(a: torch.Tensor, w_in: torch.Tensor) -> bool:
    return w_in.dtype == torch.float32 and can_run_triton(a)


def add_rmsnorm_router(a: torch.Tensor, b: torch.Tensor, norm_weight: torch.Tensor, eps: float, w_in: torch.Tensor,
                       b_in: torch.Tensor, w_out: torch.Tensor, b_out: torch.Tensor,
                       config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, y, mask)``: the residual ``a + b``, its RMSNorm, and the router's 0 / 1 decisions on ``x`` (shapes
    ``[..., H]``, ``[..., H]``, ``[..., G]``). ``config`` overrides :func:`add_rmsnorm_router_config` keys."""
    check_add_rmsnorm_router_args(a, b, norm_weight, eps, w_in, b_in, w_out, b_out)
    if not _use_kernel(a, w_in):
        return add_rmsnorm_router_reference(a, b, norm_weight, eps, w_in, b_in, w_out, b_out)
    hidden, rank, groups = a.shape[-1], w_in.shape[0], w_out.shape[0] // 2
    lead = a.shape[:-1]
    a2, b2 = a.reshape(-1, hidden).contiguous(), b.reshape(-1, hidden).contiguous()
    num_tokens = a2.shape[0]
    x = torch.empty_like(a2)
    y = torch.empty(a2.shape, dtype=norm_output_dtype(a.dtype, norm_weight), device=a.device)
    mask = torch.empty((num_tokens, groups), dtype=w_in.dtype, device=a.device)
    if num_tokens and hidden:
        cfg = dict(add_rmsnorm_router_config(num_tokens, hidden, rank, groups), **(config or {}))
        block_m, block_k = cfg["BLOCK_M"], cfg["BLOCK_K"]
        split = a.dtype in (torch.bfloat16, torch.float16) and not (interpreting() and a.dtype == torch.bfloat16)
        _add_rmsnorm_router_kernel[(cdiv(num_tokens, block_m),)](
            a2, b2, norm_weight.contiguous(), x, y, w_in.contiguous(), b_in.contiguous(), w_out.contiguous(),
            b_out.contiguous(), mask,
            num_tokens, hidden, rank, groups, float(eps),
            BLOCK_M=block_m,
            BLOCK_K=block_k,
            BLOCK_R=max(16, next_pow2(rank)),
            BLOCK_G=cfg.get("BLOCK_G", _block_g(groups)),
            EVEN_K=hidden % block_k == 0,
            W_SPLIT=split,
            LOGIT_DIFF=bool(cfg.get("LOGIT_DIFF", EPILOGUE["LOGIT_DIFF"])),
            EPILOGUE_PRECISION=cfg.get("EPILOGUE_PRECISION", EPILOGUE["EPILOGUE_PRECISION"]),
            num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"],
        )
    return x.reshape(*lead, hidden), y.reshape(*lead, hidden), mask.reshape(*lead, groups)


__all__ = ["add_rmsnorm_router", "add_rmsnorm_router_config"]
