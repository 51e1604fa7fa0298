"""Prefill GEMM over input groups: ``y = (x * mask expanded over K) @ W.T + b``.

Grid: one program per (token tile of the plan's token order, n tile[, K split]). The plan lists, per
token tile, the input groups active for at least one of its tokens; the program loops only over those
(one flat loop over (listed group, k chunk) pairs): groups inactive for the whole tile cost no load and
no MMA (intra-block skipping). The only dependent load in the loop is the group id (one level of
indirection). Rows of a listed group that are inactive for some tokens are zero-filled by a predicated
load of ``x`` (``ROW_MASK``; skipped when the caller promises that ``x`` is already zero outside each
token's groups, e.g. ``h`` from ``gated_up_groups``). (A variant with a direct k loop for tiles whose
list holds every group, and one that zeroed rows in registers, both measured slower on the H200:
see benchmarks/notes_linear.md.)
Rows are gathered from ``x`` and scattered into ``y`` by the token order, inside the kernel. Tokens are
sorted by mask pattern in the plan so that tiles share active groups (see ``group_plan``).

When there are too few (token tile, n tile) pairs to fill the GPU (moderate M), the tile's group list
is split among ``SPLIT`` programs that add fp32 partial sums atomically into a zeroed fp32 buffer,
converted (and biased) afterwards; the summation order then varies from run to run (rounding only).
Program order: GROUP_M token tiles side by side, sweeping n tiles; the splits of one tile adjacent.
"""
from __future__ import annotations

import torch

from ._triton_utils import HAS_TRITON, cdiv, interpreting, largest_pow2_divisor, sm_count, swizzle_m_major

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _input_groups_gemm_kernel(
        x_ptr, w_ptr, b_ptr, y_ptr, mask_ptr, order_ptr, tile_groups_ptr, tile_counts_ptr,
        M, N, K, G,
        GROUP_SIZE: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        ROW_MASK: tl.constexpr,
        SPLIT: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr,
        UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
    ):
        CHUNKS: tl.constexpr = GROUP_SIZE // BLOCK_K
        pid = tl.program_id(0)
        split = pid % SPLIT
        num_m = tl.cdiv(M, BLOCK_M)
        num_n = tl.cdiv(N, BLOCK_N)
        pid_m, pid_n = swizzle_m_major(pid // SPLIT, num_m, num_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        valid_m = offs_m < M
        rows = tl.load(order_ptr + offs_m, mask=valid_m, other=0).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        valid_n = offs_n < N
        offs_nc = tl.minimum(offs_n, N - 1).to(tl.int64)  # clamped: weight loads need no mask
        offs_k = tl.arange(0, BLOCK_K)
        n_groups = tl.load(tile_counts_ptr + pid_m)
        per_split = tl.cdiv(n_groups, SPLIT)
        j_start = split * per_split * CHUNKS
        j_end = tl.minimum(n_groups, (split + 1) * per_split) * CHUNKS
        list_ptr = tile_groups_ptr + pid_m.to(tl.int64) * G
        x_rows = x_ptr + rows[:, None] * K + offs_k[None, :]
        w_rows = w_ptr + offs_nc[None, :] * K + offs_k[:, None]
        m_rows = mask_ptr + rows * G
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for j in range(j_start, j_end):
            g = tl.load(list_ptr + j // CHUNKS)  # the only dependent load: one level of indirection
            k0 = g * GROUP_SIZE + (j % CHUNKS) * BLOCK_K
            if ROW_MASK:  # zero-fill rows of tokens that do not use group g (predicated load)
                row_on = tl.load(m_rows + g) != 0
                a = tl.load(x_rows + k0, mask=row_on[:, None], other=0.0)
            else:
                a = tl.load(x_rows + k0)
            b = tl.load(w_rows + k0)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        y_ptrs = y_ptr + rows[:, None] * N + offs_n[None, :]
        out_mask = valid_m[:, None] & valid_n[None, :]
        if SPLIT == 1:
            if HAS_BIAS:
                acc += tl.load(b_ptr + offs_n, mask=valid_n, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_mask)
        else:
            tl.atomic_add(y_ptrs, acc, mask=out_mask, sem="relaxed")


def default_config(num_tokens: int, n_dim: int, group_size: int) -> dict:
    """Tile sizes / warps / pipeline depth (BLOCK_M comes from the plan; SPLIT 0 = automatic)."""
    if interpreting():
        return dict(BLOCK_N=64, BLOCK_K=max(largest_pow2_divisor(group_size, 32), 16), SPLIT=1, num_warps=4,
                    num_stages=1)
    if num_tokens >= 2048:
        return dict(BLOCK_N=128, BLOCK_K=largest_pow2_divisor(group_size, 64), SPLIT=0, num_warps=8, num_stages=5)
    return dict(BLOCK_N=64, BLOCK_K=largest_pow2_divisor(group_size, 128), SPLIT=0, num_warps=4, num_stages=3)


def input_groups_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    mask_rows: torch.Tensor,
    token_order: torch.Tensor,
    tile_groups: torch.Tensor,
    tile_group_counts: torch.Tensor,
    group_size: int,
    block_m: int,
    x_is_masked: bool = False,
    config: dict | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch the kernel on checked, contiguous 2-D inputs; returns ``y[M, N]`` (``out`` if given)."""
    num_tokens, k_dim = x.shape
    n_dim = weight.shape[0]
    num_groups = k_dim // group_size
    cfg = dict(default_config(num_tokens, n_dim, group_size), **(config or {}))
    block_k, block_n = cfg["BLOCK_K"], cfg["BLOCK_N"]
    if block_k < 16 or group_size % block_k:
        raise ValueError(
            f"input_group_linear: group_size {group_size} needs a multiple of 16 for the GEMM path (BLOCK_K={block_k})"
        )
    tiles = cdiv(num_tokens, block_m) * cdiv(n_dim, block_n)
    split = int(cfg.get("SPLIT", 0))
    if split <= 0:
        split = 1
        if x.is_cuda:
            target = 2 * sm_count(x.device)
            while tiles * split < target and split < 8 and split * 2 <= num_groups:
                split *= 2
    if split == 1:
        y = torch.empty(num_tokens, n_dim, dtype=x.dtype, device=x.device) if out is None else out
    else:
        y = torch.zeros(num_tokens, n_dim, dtype=torch.float32, device=x.device)
    _input_groups_gemm_kernel[(tiles * split,)](
        x, weight, bias if bias is not None else x, y, mask_rows, token_order, tile_groups, tile_group_counts,
        num_tokens, n_dim, k_dim, num_groups,
        GROUP_SIZE=group_size,
        HAS_BIAS=bias is not None,
        ROW_MASK=not x_is_masked,
        SPLIT=split,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        GROUP_M=cfg.get("GROUP_M", 8),
        UPCAST=interpreting(),
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    if split == 1:
        return y
    if bias is not None:
        y += bias.float()
    if out is None:
        return y.to(x.dtype)
    out.copy_(y)
    return out
