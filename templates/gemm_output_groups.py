"""Prefill GEMM over output groups: ``y[m, n] = (x @ W.T + b)[m, n]`` if ``mask[m, n // group_size]``, else 0.

Grid: one program per (n tile of one group, tile of that group's reordered token list). The plan puts
each group's active tokens first, so a tile is fully active, mixed or fully inactive. Programs of fully
inactive tiles only write zeros to their rows (no loads, no MMAs); the others gather their rows of ``x``
by index inside the kernel, run the K loop on tensor cores and scatter the rows back, writing zeros for
the inactive rows of a mixed tile. Every output element is written exactly once (no pre-zeroed output).
Program order: GROUP_N n tiles side by side, sweeping token tiles, so concurrently running programs
share weight tiles and (as per-group lists are in ascending token order) nearby rows of ``x`` in L2.

From 512 tokens the weight tiles come through TMA descriptors (``tma_weights``), as in the gate/up GEMM, where the
weights allow it (a default falls back to pointer loads; an explicit ``config={"TMA": True}`` raises instead).

``TAIL_SPLIT`` (config key, ``tail_split.py``; 2 in the TMA defaults): a group's last tile with at most half (with 4:
also a quarter) of its rows active runs the K loop on that many rows, as in ``gemm_gated_up``. Query projection, H200,
50% random masks, µs, whole tiles -> halves (``kernels_linear_sweep_half_tail.json``): 1024 tokens 47.8 -> 47.6, 2048
56.0 -> 55.7, 4096 119.3 -> 112.5, 16384 463.6 -> 462.0.

``WARP_SPECIALIZE`` (config key, off by default): the K loop with Triton's automatic warp specialisation, as in
``gemm_gated_up``.

``rotary=``: the query's rotary embedding applied to each tile before its store (``rotary_epilogue``).
"""
from __future__ import annotations

import torch

from ._triton_utils import HAS_TRITON, cdiv, interpreting, next_pow2, output_group_tile, sm_count, tail_part, tail_rows
from .group_gemm_tiles import load_token_rows, load_weight_tile
from .rotary_epilogue import epilogue_ok
from .tma_weights import use_tma, weight_descriptors
from .tail_split import tail_split

if HAS_TRITON:
    import triton
    import triton.language as tl

    from .rotary_epilogue import rotate_rows

    @triton.jit
    def _output_group_rows(
        x_ptr, w_ptr, b_ptr, y_ptr, w_desc, cos_ptr, sin_ptr, period, rows, offs_m, count, offs_n, valid_n, out_mask,
        N, K,
        HAS_BIAS: tl.constexpr,
        ROTARY_DIM: tl.constexpr,
        BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr,
        EVEN_N: tl.constexpr,
        UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        USE_TMA: tl.constexpr,
        WARP_SPECIALIZE: tl.constexpr,
    ):
        """``y[rows, n tile]`` of one tile (as many rows as ``rows`` holds): the K loop, the bias, the rotary
        embedding when ``ROTARY_DIM`` (``rotary_epilogue``), zeros for rows at or past ``count``, one store."""
        offs_k = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + rows[:, None] * K + offs_k[None, :]
        w_ptrs = w_ptr + offs_n.to(tl.int64)[None, :] * K + offs_k[:, None]
        acc = tl.zeros((rows.shape[0], offs_n.shape[0]), dtype=tl.float32)
        n_start = tl.min(offs_n, 0)  # the tile's first output column (TMA coordinates)
        for k in tl.range(0, K, BLOCK_K, warp_specialize=WARP_SPECIALIZE):
            a = load_token_rows(x_ptrs, k, offs_k, K, EVEN_K, UPCAST)
            b = load_weight_tile(w_ptrs, w_desc, n_start, k, offs_k, K, valid_n, USE_TMA, EVEN_K, EVEN_N, UPCAST)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=valid_n, other=0.0).to(tl.float32)[None, :]
        if ROTARY_DIM > 0:
            acc = rotate_rows(acc, cos_ptr, sin_ptr, rows, offs_m < count, period, ROTARY_DIM,
                              y_ptr.dtype.element_ty)
        acc = tl.where((offs_m < count)[:, None], acc, 0.0)
        tl.store(y_ptr + rows[:, None] * N + offs_n[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_mask)

    @triton.jit
    def _output_group_tail(
        x_ptr, w_ptr, b_ptr, y_ptr, w_desc, cos_ptr, sin_ptr, period, tokens_ptr, tile_start, count, offs_m, rows,
        offs_n, valid_n, out_mask, M, N, K,
        PART: tl.constexpr,
        GROUP_SIZE: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        ROTARY_DIM: tl.constexpr,
        BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr,
        EVEN_N: tl.constexpr,
        UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        USE_TMA: tl.constexpr,
        WARP_SPECIALIZE: tl.constexpr,
    ):
        """A partly active tile whose active rows fit in its first ``PART`` rows: the K loop over those, zeros for
        the rest of the tile."""
        part_rows, part_offs, part_mask = tail_rows(tokens_ptr, tile_start, offs_n, valid_n, M, GROUP_SIZE, PART)
        _output_group_rows(x_ptr, w_ptr, b_ptr, y_ptr, w_desc, cos_ptr, sin_ptr, period, part_rows, part_offs, count,
                           offs_n, valid_n, part_mask, N, K, HAS_BIAS, ROTARY_DIM, BLOCK_K, EVEN_K, EVEN_N, UPCAST,
                           DOT_PRECISION, USE_TMA, WARP_SPECIALIZE)
        rest = out_mask & (offs_m >= tile_start + PART)[:, None]
        tl.store(y_ptr + rows[:, None] * N + offs_n[None, :],
                 tl.zeros((offs_m.shape[0], offs_n.shape[0]), dtype=y_ptr.dtype.element_ty), mask=rest)

    @triton.jit
    def _output_groups_gemm_kernel(
        x_ptr, w_ptr, b_ptr, y_ptr, tokens_ptr, counts_ptr, w_desc, cos_ptr, sin_ptr,
        M, N, K, period,
        GROUP_SIZE: tl.constexpr,
        TILES_PER_GROUP: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        ROTARY_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr,
        EVEN_N: tl.constexpr,
        GROUP_N: tl.constexpr,
        UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        USE_TMA: tl.constexpr,
        WARP_SPECIALIZE: tl.constexpr,
        TAIL_SPLIT: tl.constexpr,
        ACTIVE_FIRST: tl.constexpr,
    ):
        tile_start, offs_m, rows, count, offs_n, valid_n, out_mask = output_group_tile(
            M, N, tokens_ptr, counts_ptr, GROUP_SIZE, TILES_PER_GROUP, BLOCK_M, BLOCK_N, GROUP_N, ACTIVE_FIRST)
        part = tail_part(count, tile_start, BLOCK_M, TAIL_SPLIT)
        if tile_start >= count:  # fully inactive tile: zeros only
            y_ptrs = y_ptr + rows[:, None] * N + offs_n[None, :]
            tl.store(y_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=y_ptr.dtype.element_ty), mask=out_mask)
        elif part == BLOCK_M:
            _output_group_rows(x_ptr, w_ptr, b_ptr, y_ptr, w_desc, cos_ptr, sin_ptr, period, rows, offs_m, count,
                               offs_n, valid_n, out_mask, N, K, HAS_BIAS, ROTARY_DIM, BLOCK_K, EVEN_K, EVEN_N, UPCAST,
                               DOT_PRECISION, USE_TMA, WARP_SPECIALIZE)
        elif part == BLOCK_M // 2:  # the group's last tile, at most half of it active
            if BLOCK_M // 2 >= 16:
                _output_group_tail(x_ptr, w_ptr, b_ptr, y_ptr, w_desc, cos_ptr, sin_ptr, period, tokens_ptr, tile_start,
                                   count, offs_m, rows, offs_n, valid_n, out_mask, M, N, K, BLOCK_M // 2, GROUP_SIZE,
                                   HAS_BIAS, ROTARY_DIM, BLOCK_K, EVEN_K, EVEN_N, UPCAST, DOT_PRECISION, USE_TMA,
                                   WARP_SPECIALIZE)
        else:
            if TAIL_SPLIT >= 4 and BLOCK_M // 4 >= 16:  # at most a quarter active
                _output_group_tail(x_ptr, w_ptr, b_ptr, y_ptr, w_desc, cos_ptr, sin_ptr, period, tokens_ptr, tile_start,
                                   count, offs_m, rows, offs_n, valid_n, out_mask, M, N, K, BLOCK_M // 4, GROUP_SIZE,
                                   HAS_BIAS, ROTARY_DIM, BLOCK_K, EVEN_K, EVEN_N, UPCAST, DOT_PRECISION, USE_TMA,
                                   WARP_SPECIALIZE)


def default_config(num_tokens: int, group_size: int, num_groups: int = 1, sms: int = 132) -> dict:
    """Tile sizes / warps / pipeline depth for the output-group GEMM (H200 sweeps at 50% random masks,
    ``benchmarks/results/kernels_linear_sweep_moderate.json`` and ``kernels_linear_sweep_tma_v3.json``).

    From 512 tokens the weight tiles come through TMA (query projection, µs, pointer loads -> TMA: 1024 tokens 61.6 ->
    47.9 with 3 stages, 4096 117.1 -> 108.2, 16384 509.1 -> 463.9). Below 512 tokens the output tile is the widest of
    128 / 64 / 32 columns that still gives one program per SM over ``num_groups`` groups (64 tokens, 8 groups of 512:
    32 programs of 128 columns took 25.5 µs, 128 programs of 32 columns 21.8 µs). From 2048 to 8191 tokens the
    128 x 256 tiles run 4 TMA stages: query projection at 4096 tokens 135.6 -> 118.6 µs, lower in each of 5
    interleaved rounds (``kernels_linear_sweep_query_tiles.json``; 16384 tokens keep 3: 460.2 µs with 3 and 474.1 with
    4 in two device calls, ``kernels_linear_sweep_active_first.json`` and ``kernels_linear_sweep_query_tiles_16k.json``).
    """
    block_n = min(128, max(16, next_pow2(group_size)))
    if interpreting():
        return dict(BLOCK_M=32, BLOCK_N=min(block_n, 64), BLOCK_K=64, num_warps=4, num_stages=1)
    if num_tokens >= 2048 and group_size >= 256:
        return dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=4 if num_tokens < 8192 else 3,
                    TMA=True, TAIL_SPLIT=2)
    if num_tokens >= 512:
        return dict(BLOCK_M=128, BLOCK_N=block_n, BLOCK_K=64, num_warps=8, num_stages=3, TMA=True, TAIL_SPLIT=2)
    token_tiles = cdiv(num_tokens, 64)
    while block_n > 32 and token_tiles * num_groups * cdiv(group_size, block_n) < sms:
        block_n //= 2
    return dict(BLOCK_M=64, BLOCK_N=block_n, BLOCK_K=64, num_warps=4, num_stages=4)


def output_groups_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    group_tokens: torch.Tensor,
    group_counts: torch.Tensor,
    group_size: int,
    config: dict | None = None,
    out: torch.Tensor | None = None,
    rotary: tuple[torch.Tensor, torch.Tensor, int] | None = None,
) -> torch.Tensor:
    """Launch the kernel on checked, contiguous 2-D inputs; returns a new ``y[M, N]``. ``rotary``: ``(cos, sin,
    period)`` from ``rotary_epilogue.kernel_tables`` (tables ``[rows, head_dim]``; token row ``m`` uses table row
    ``m % period``): the output is rotated per head (``rotary_epilogue``; tiles widen to at least one head)."""
    num_tokens, k_dim = x.shape
    n_dim = weight.shape[0]
    sms = sm_count(x.device) if x.device.type == "cuda" else 132
    cfg = dict(default_config(num_tokens, group_size, n_dim // group_size, sms), **(config or {}))
    rotary_dim = 0 if rotary is None else rotary[0].shape[-1]
    if rotary_dim and "BLOCK_N" not in (config or {}):
        cfg["BLOCK_N"] = max(cfg["BLOCK_N"], rotary_dim)
    if rotary_dim and not epilogue_ok(rotary_dim, group_size, cfg["BLOCK_N"]):
        raise ValueError(f"output_groups_gemm: the rotary epilogue needs a power-of-two head dim dividing BLOCK_N and "
                         f"the group size, got head dim {rotary_dim}, BLOCK_N {cfg['BLOCK_N']}, "
                         f"group size {group_size}")
    block_m, block_n, block_k = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    y = torch.empty(num_tokens, n_dim, dtype=x.dtype, device=x.device) if out is None else out
    tiles_per_group = cdiv(group_size, block_n)
    grid = (cdiv(num_tokens, block_m) * (n_dim // group_size) * tiles_per_group,)
    tma = use_tma("output_groups_gemm", cfg, config, weight)
    desc = weight_descriptors((weight,), block_n, block_k)[0] if tma else weight
    _output_groups_gemm_kernel[grid](
        x, weight, bias if bias is not None else x, y, group_tokens, group_counts, desc,
        *(rotary[:2] if rotary is not None else (x, x)),
        num_tokens, n_dim, k_dim, rotary[2] if rotary is not None else 1,
        GROUP_SIZE=group_size,
        TILES_PER_GROUP=tiles_per_group,
        HAS_BIAS=bias is not None,
        ROTARY_DIM=rotary_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        EVEN_K=k_dim % block_k == 0,
        EVEN_N=group_size % block_n == 0,
        GROUP_N=cfg.get("GROUP_N", 8),
        UPCAST=interpreting(),
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        USE_TMA=tma,
        WARP_SPECIALIZE=bool(cfg.get("WARP_SPECIALIZE", False)),
        TAIL_SPLIT=tail_split(cfg.get("TAIL_SPLIT", 1)),
        ACTIVE_FIRST=next_pow2(n_dim // group_size) if cfg.get("ACTIVE_FIRST", False) else 0,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    return y
