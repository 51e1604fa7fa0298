"""Residual add + RMSNorm + router decision in one Triton launch: ``(a, b) -> (x = a + b, RMSNorm(x), mask[..., G])``.

In a compiled prefill Inductor fuses each block's residual add with its RMSNorm (one kernel: reads ``a`` and ``b``,
writes ``x`` and the normalised ``y``), and the block's router then reads ``x`` again in its own launch
(``router_mask``). At 4096 tokens of the Llama-3-8B shape that second read was the router's whole cost: about 21 µs
per router, 1.35 ms per prefill (H200, run Z of ``benchmarks/results/e2e.md``), while its FLOPs are 1 GFLOP. Here the
router's first product runs on the ``x`` tiles the add has just produced, in registers.

A program owns ``BLOCK_M`` rows and walks H twice:
1. per ``BLOCK_K`` columns: ``x = a + b`` (rounded to the input dtype, as PyTorch's add), store ``x``, accumulate the
   rows' sum of squares in fp32 and ``h += x W_in^T`` (``router_mask.accumulate_hidden``: bf16 / fp16 ``x`` on the
   tensor cores against ``W_in`` split into two 16-bit parts, fp32 ``x`` as an fp32 FMA product);
2. per ``BLOCK_K`` columns: re-read ``x`` (just written by this program, so from L2) and store
   ``y = w * (x * rsqrt(mean + eps)).to(dtype)`` (the product in fp32, rounded once, as PyTorch's 16-bit multiply);
then the router's epilogue (``router_mask.store_decisions``: bias, one logit-difference product per group chunk,
compare). Decisions equal :func:`router_rms_norm_reference`'s except on near-ties; ``x`` is exact; ``y`` differs
from the reference only by the sum-of-squares order (Inductor's kernel differs the same way).

Router weights in fp16 / bf16, and devices without Triton (CPU without ``TRITON_INTERPRET=1``), take the reference.
"""
from __future__ import annotations

import torch

from ._triton_utils import HAS_TRITON, can_run_triton, cdiv, interpreting, next_pow2
from .router_mask import EPILOGUE, _block_g, _split_weights
from .router_rms_norm_reference import check_router_rms_norm_args, router_rms_norm_reference

if HAS_TRITON:
    import triton
    import triton.language as tl

    from .router_mask import accumulate_hidden, store_decisions

    @triton.jit
    def _router_rms_norm_kernel(
        a_ptr, b_ptr, x_ptr, y_ptr, norm_w_ptr, w_in_ptr, b_in_ptr, w_out_ptr, b_out_ptr, mask_ptr,
        M, H, R, G, eps,
        BLOCK_M: tl.constexpr,
        BLOCK_K: tl.constexpr,
        NORM_K: tl.constexpr,
        ROUTER_LOOP: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_G: tl.constexpr,
        W_SPLIT3: tl.constexpr,
        W_PARTS: tl.constexpr,
        LOGIT_DIFF: tl.constexpr,
        EPILOGUE_PRECISION: tl.constexpr,
    ):
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        valid_m = offs_m < M
        offs_r = tl.arange(0, BLOCK_R)
        valid_r = offs_r < R
        row_off = offs_m.to(tl.int64)[:, None] * H
        acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        sum_sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
        if ROUTER_LOOP:
            # ---- pass 1: x = a + b (stored) and its sum of squares, in NORM_K-wide steps (few, long loads)
            offs_n = tl.arange(0, NORM_K)
            for k in range(0, H, NORM_K):
                cols = k + offs_n
                io_mask = valid_m[:, None] & (cols < H)[None, :]
                a = tl.load(a_ptr + row_off + cols[None, :], mask=io_mask, other=0.0)
                b = tl.load(b_ptr + row_off + cols[None, :], mask=io_mask, other=0.0)
                x = (a.to(tl.float32) + b.to(tl.float32)).to(a.dtype)
                tl.store(x_ptr + row_off + cols[None, :], x, mask=io_mask)
                xf = x.to(tl.float32)
                sum_sq += tl.sum(xf * xf, 1)
            tl.debug_barrier()  # this program's stores of x are read back below by other threads of the program
            # ---- the router's h = x W_in^T over the x just written (L2)
            offs_k = tl.arange(0, BLOCK_K)
            w_ptrs = w_in_ptr + offs_r.to(tl.int64)[None, :] * H + offs_k[:, None]  # W_in^T tile [BLOCK_K, BLOCK_R]
            for k in range(0, H, BLOCK_K):
                cols = k + offs_k
                x = tl.load(x_ptr + row_off + cols[None, :], mask=valid_m[:, None] & (cols < H)[None, :], other=0.0)
                wt = tl.load(w_ptrs + k, mask=(cols < H)[:, None] & valid_r[None, :], other=0.0)
                acc = accumulate_hidden(acc, x, wt, W_SPLIT3, W_PARTS)
        else:
            # ---- pass 1: x = a + b (stored), sum of squares and h = x W_in^T in BLOCK_K-wide steps
            offs_k = tl.arange(0, BLOCK_K)
            w_ptrs = w_in_ptr + offs_r.to(tl.int64)[None, :] * H + offs_k[:, None]
            for k in range(0, H, BLOCK_K):
                cols = k + offs_k
                io_mask = valid_m[:, None] & (cols < H)[None, :]
                a = tl.load(a_ptr + row_off + cols[None, :], mask=io_mask, other=0.0)
                b = tl.load(b_ptr + row_off + cols[None, :], mask=io_mask, other=0.0)
                x = (a.to(tl.float32) + b.to(tl.float32)).to(a.dtype)
                tl.store(x_ptr + row_off + cols[None, :], x, mask=io_mask)
                xf = x.to(tl.float32)
                sum_sq += tl.sum(xf * xf, 1)
                wt = tl.load(w_ptrs + k, mask=(cols < H)[:, None] & valid_r[None, :], other=0.0)
                acc = accumulate_hidden(acc, x, wt, W_SPLIT3, W_PARTS)
            tl.debug_barrier()
        rstd = tl.rsqrt(sum_sq / H + eps)

        # ---- pass 2: y = w * (x * rstd).to(dtype), in NORM_K-wide steps
        offs_n = tl.arange(0, NORM_K)
        for k in range(0, H, NORM_K):
            cols = k + offs_n
            io_mask = valid_m[:, None] & (cols < H)[None, :]
            w_norm = tl.load(norm_w_ptr + cols, mask=cols < H, other=0.0)
            x = tl.load(x_ptr + row_off + cols[None, :], mask=io_mask, other=0.0)
            normed = (x.to(tl.float32) * rstd[:, None]).to(x.dtype)
            y = (w_norm.to(tl.float32)[None, :] * normed.to(tl.float32)).to(x.dtype)
            tl.store(y_ptr + row_off + cols[None, :], y, mask=io_mask)

        store_decisions(acc, b_in_ptr, w_out_ptr, b_out_ptr, mask_ptr, offs_m, valid_m, offs_r, valid_r, R, G,
                        BLOCK_G, LOGIT_DIFF, EPILOGUE_PRECISION)


def router_rms_norm_config(num_tokens: int, hidden: int) -> dict:
    """Default launch configuration (the keys :func:`router_rms_norm` accepts in ``config``)."""
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_K=64, NORM_K=64, ROUTER_LOOP=False, num_warps=4, num_stages=1)
    block_k = max(16, min(128, next_pow2(hidden)))
    return dict(BLOCK_M=16, BLOCK_K=block_k, NORM_K=min(1024, next_pow2(hidden)), ROUTER_LOOP=True, num_warps=8,
                num_stages=1)


def _use_kernel(a: torch.Tensor, w_in: torch.Tensor) -> bool:
    return w_in.dtype == torch.float32 and can_run_triton(a)


def router_rms_norm(a: torch.Tensor, b: torch.Tensor, norm_weight: torch.Tensor, eps: float, w_in: torch.Tensor,
                    b_in: torch.Tensor, w_out: torch.Tensor, b_out: torch.Tensor,
                    config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x = a + b, RMSNorm(x), mask[..., G])``; see the module docstring. ``config`` overrides
    :func:`router_rms_norm_config` keys. Runs the reference where Triton cannot run and for 16-bit router weights."""
    check_router_rms_norm_args(a, b, norm_weight, eps, w_in, b_in, w_out, b_out)
    if not _use_kernel(a, w_in):
        return router_rms_norm_reference(a, b, norm_weight, eps, w_in, b_in, w_out, b_out)
    hidden, rank, groups = a.shape[-1], w_in.shape[0], w_out.shape[0] // 2
    lead = a.shape[:-1]
    a2, b2 = (t.reshape(-1, hidden).contiguous() for t in (a, b))
    num_tokens = a2.shape[0]
    x = torch.empty_like(a2)
    y = torch.empty_like(a2)
    mask = torch.empty((num_tokens, groups), dtype=w_in.dtype, device=a.device)
    if num_tokens:
        cfg = dict(router_rms_norm_config(num_tokens, hidden), **(config or {}))
        _router_rms_norm_kernel[(cdiv(num_tokens, cfg["BLOCK_M"]),)](
            a2, b2, x, y, norm_weight.contiguous(), w_in.contiguous(), b_in.contiguous(), w_out.contiguous(),
            b_out.contiguous(), mask,
            num_tokens, hidden, rank, groups, float(eps),
            BLOCK_M=cfg["BLOCK_M"],
            BLOCK_K=cfg["BLOCK_K"],
            NORM_K=cfg["NORM_K"] if cfg["ROUTER_LOOP"] else cfg["BLOCK_K"],
            ROUTER_LOOP=bool(cfg["ROUTER_LOOP"]),
            BLOCK_R=max(16, next_pow2(rank)),
            BLOCK_G=_block_g(groups),
            W_SPLIT3=_split_weights(a2, num_tokens, None),
            W_PARTS=2,
            LOGIT_DIFF=EPILOGUE["LOGIT_DIFF"],
            EPILOGUE_PRECISION=EPILOGUE["EPILOGUE_PRECISION"],
            num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"],
        )
    return x.view(*lead, hidden), y.view(*lead, hidden), mask.view(*lead, groups)


__all__ = ["router_rms_norm", "router_rms_norm_config"]
