"""A router decision of exactly one token in one Triton launch: ``x[H] -> mask[G]`` (batch-1 decode).

Same decision as :func:`router_mask_reference` (``l1 >= l0`` per group, 0.0 / 1.0 in the routers' dtype), computed
as the routers' shapes make cheapest at one token: ``W_in`` (``[R, H]`` fp32, 512 KB at H=4096, R=32) is most of the
bytes, so it is spread over ``R`` programs, one per low-rank unit ``j``, each reading its contiguous row of ``W_in``
and ``x`` (cast to fp32 in registers) and storing ``h[j] = x . W_in[j] + b_in[j]``. Each program then increments an
arrival counter (``arrival_counters``: zero between launches); the last to arrive reads the ``R`` values of ``h``,
computes both logits of every group from ``W_out`` / ``b_out`` (``[2G, R]``: even rows skip, odd rows execute),
compares, stores ``mask`` and resets the counter. Decisions equal the fp32 reference except on near-ties (another
summation order).

Where the generic template (``templates/router_mask.py``) splits ``H`` into slices of all ``R`` rows, and its last
program sums ``SPLIT`` partial tiles (11-15 µs at one token on the H200), this one's last program reads ``R``
floats: 4.2 µs on the H200 at Llama-3-8B's shapes (``benchmarks/results/kernels_router.md``). That is slower than the
two Inductor reductions of the backend's default one-token form (3.2 µs), so the backend uses this kernel only on
request (``wide.one_token_routers="kernel"``) and for one-token ``wide::router_mask`` calls (dynamic shapes), where
the alternative is the cuBLAS reference.
"""
from __future__ import annotations

import torch

from ._triton_utils import HAS_TRITON, can_run_triton, next_pow2
from .arrival_counters import arrival_counters
from .router_mask_reference import check_router_mask_args, router_mask_reference

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _router_one_token_kernel(
        x_ptr, w_in_ptr, b_in_ptr, w_out_ptr, b_out_ptr, out_ptr, h_ptr, counter_ptr,
        H, R, G,
        BLOCK_H: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_G: tl.constexpr,
    ):
        j = tl.program_id(0)
        offs = tl.arange(0, BLOCK_H)
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        w_row = w_in_ptr + j.to(tl.int64) * H
        for h0 in range(0, H, BLOCK_H):
            ok = h0 + offs < H
            xv = tl.load(x_ptr + h0 + offs, mask=ok, other=0.0).to(tl.float32)
            wv = tl.load(w_row + h0 + offs, mask=ok, other=0.0)
            acc += xv * wv
        tl.store(h_ptr + j, tl.sum(acc, 0) + tl.load(b_in_ptr + j))
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel")
        if arrived == R - 1:  # the last program: every h[j] is stored
            offs_r = tl.arange(0, BLOCK_R)
            offs_g = tl.arange(0, BLOCK_G)
            r_ok = offs_r < R
            g_ok = offs_g < G
            h = tl.load(h_ptr + offs_r, mask=r_ok, other=0.0, cache_modifier=".cg")
            both = g_ok[:, None] & r_ok[None, :]
            skip_rows = w_out_ptr + (2 * offs_g)[:, None] * R + offs_r[None, :]
            w_skip = tl.load(skip_rows, mask=both, other=0.0)
            w_exec = tl.load(skip_rows + R, mask=both, other=0.0)
            l_skip = tl.sum(w_skip * h[None, :], 1) + tl.load(b_out_ptr + 2 * offs_g, mask=g_ok, other=0.0)
            l_exec = tl.sum(w_exec * h[None, :], 1) + tl.load(b_out_ptr + 2 * offs_g + 1, mask=g_ok, other=0.0)
            tl.store(out_ptr + offs_g, (l_exec >= l_skip).to(out_ptr.dtype.element_ty), mask=g_ok)
            tl.atomic_xchg(counter_ptr, 0)


def router_one_token(x: torch.Tensor, w_in: torch.Tensor, b_in: torch.Tensor, w_out: torch.Tensor,
                     b_out: torch.Tensor, block_h: int = 4096, num_warps: int = 8,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """``mask[..., G]`` for an ``x`` of exactly one token (``x.numel() == H``), in one launch (see module docstring);
    ``out`` (contiguous, that shape and the routers' dtype) receives it.

    Runs :func:`router_mask_reference` where Triton cannot run (CPU without ``TRITON_INTERPRET=1``) and for fp16 /
    bf16 router weights (whose intermediate rounding an fp32 kernel would not reproduce)."""
    check_router_mask_args(x, w_in, b_in, w_out, b_out)
    hidden, rank, groups = x.shape[-1], w_in.shape[0], w_out.shape[0] // 2
    if x.numel() != hidden:
        raise ValueError(f"router_one_token: x must hold exactly one token of {hidden} features, got shape "
                         f"{tuple(x.shape)}")
    shape = (*x.shape[:-1], groups)
    if out is not None and (tuple(out.shape) != shape or out.dtype != w_in.dtype or out.device != x.device
                            or not out.is_contiguous()):
        raise ValueError(f"router_one_token: out must be a contiguous {w_in.dtype} tensor of shape {shape} on "
                         f"{x.device}, got {out.dtype} {tuple(out.shape)} on {out.device}")
    if block_h < 16 or block_h & (block_h - 1):
        raise ValueError(f"router_one_token: block_h must be a power of two >= 16, got {block_h}")
    if w_in.dtype != torch.float32 or not can_run_triton(x):
        mask = router_mask_reference(x, w_in, b_in, w_out, b_out)
        return mask if out is None else out.copy_(mask)
    mask = torch.empty(shape, dtype=w_in.dtype, device=x.device) if out is None else out
    h = torch.empty(rank, dtype=torch.float32, device=x.device)  # per call (caching allocator: no kernel)
    _router_one_token_kernel[(rank,)](
        x.reshape(hidden).contiguous(), w_in.contiguous(), b_in.contiguous(), w_out.contiguous(),
        b_out.contiguous(), mask, h, arrival_counters(1, x.device),
        hidden, rank, groups,
        BLOCK_H=min(block_h, max(16, next_pow2(hidden))),
        BLOCK_R=max(16, next_pow2(rank)),
        BLOCK_G=max(16, next_pow2(groups)),
        num_warps=num_warps,
    )
    return mask


__all__ = ["router_one_token"]
