"""The fused gate/up GEMM as a persistent kernel: one program per SM walks the active tiles, then the inactive ones.

Same product as ``gemm_gated_up`` (``h = act(x @ Wg.T) * (x @ Wu.T)`` on each token's active groups, exact zeros
elsewhere; gathered token rows, TMA or pointer weight tiles). What changes is the schedule (``group_tile_schedule``):
a fixed grid of programs takes active tiles ``pid, pid + P, ...`` in group-major order, with the tile loop and the K
loop flattened (``tl.range(..., flatten=True)``) so that the software pipeline keeps loading the next tile's operands
while the current tile's epilogue runs, instead of draining and refilling once per tile. The zero-only tiles come
after, in a plain loop. Chosen with the config key ``PERSISTENT`` (off by default until timed on the H200).
"""
from __future__ import annotations

from ._triton_utils import HAS_TRITON, activation_fn
from .group_gemm_tiles import load_token_rows, load_weight_tile
from .group_tile_schedule import group_tile_at, group_tile_table

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _gated_up_gemm_persistent_kernel(
        x_ptr, wg_ptr, wu_ptr, h_ptr, tokens_ptr, counts_ptr, wg_desc, wu_desc,
        M, N, K, NUM_GROUPS, NUM_PROGRAMS,
        GROUP_SIZE: tl.constexpr,
        TILES_PER_GROUP: tl.constexpr,
        BLOCK_G: tl.constexpr,
        ACTIVATION: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr,
        EVEN_N: tl.constexpr,
        UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        USE_TMA: tl.constexpr,
        FLATTEN: tl.constexpr,
    ):
        pid = tl.program_id(0)
        arange_m = tl.arange(0, BLOCK_M)
        arange_n = tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        counts, tiles, ends, total = group_tile_table(counts_ptr, M, NUM_GROUPS, BLOCK_M, TILES_PER_GROUP, BLOCK_G,
                                                      True)
        for t in tl.range(pid, total, NUM_PROGRAMS, flatten=FLATTEN):
            g, m_tile, n_sub, count = group_tile_at(t, counts, tiles, ends, M, BLOCK_M, TILES_PER_GROUP, BLOCK_G,
                                                    True)
            offs_m = m_tile * BLOCK_M + arange_m
            valid_m = offs_m < M
            rows = tl.load(tokens_ptr + g.to(tl.int64) * M + offs_m, mask=valid_m, other=0).to(tl.int64)
            offs_gn = n_sub * BLOCK_N + arange_n
            valid_n = offs_gn < GROUP_SIZE
            offs_n = g * GROUP_SIZE + offs_gn
            n_start = g * GROUP_SIZE + n_sub * BLOCK_N
            x_ptrs = x_ptr + rows[:, None] * K + offs_k[None, :]
            w_off = offs_n.to(tl.int64)[None, :] * K + offs_k[:, None]
            wg_ptrs = wg_ptr + w_off
            wu_ptrs = wu_ptr + w_off
            acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in range(0, K, BLOCK_K):
                a = load_token_rows(x_ptrs, k, offs_k, K, EVEN_K, UPCAST)
                bg = load_weight_tile(wg_ptrs, wg_desc, n_start, k, offs_k, K, valid_n, USE_TMA, EVEN_K, EVEN_N,
                                      UPCAST)
                bu = load_weight_tile(wu_ptrs, wu_desc, n_start, k, offs_k, K, valid_n, USE_TMA, EVEN_K, EVEN_N,
                                      UPCAST)
                acc_g = tl.dot(a, bg, acc_g, input_precision=DOT_PRECISION)
                acc_u = tl.dot(a, bu, acc_u, input_precision=DOT_PRECISION)
                x_ptrs += BLOCK_K
                wg_ptrs += BLOCK_K
                wu_ptrs += BLOCK_K
            h = activation_fn(acc_g, ACTIVATION) * acc_u
            h = tl.where((offs_m < count)[:, None], h, 0.0)
            h_ptrs = h_ptr + rows[:, None] * N + offs_n[None, :]
            tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=valid_m[:, None] & valid_n[None, :])
        counts, tiles, ends, total = group_tile_table(counts_ptr, M, NUM_GROUPS, BLOCK_M, TILES_PER_GROUP, BLOCK_G,
                                                      False)
        for t in range(pid, total, NUM_PROGRAMS):
            g, m_tile, n_sub, count = group_tile_at(t, counts, tiles, ends, M, BLOCK_M, TILES_PER_GROUP, BLOCK_G,
                                                    False)
            offs_m = m_tile * BLOCK_M + arange_m
            valid_m = offs_m < M
            rows = tl.load(tokens_ptr + g.to(tl.int64) * M + offs_m, mask=valid_m, other=0).to(tl.int64)
            offs_gn = n_sub * BLOCK_N + arange_n
            valid_n = offs_gn < GROUP_SIZE
            h_ptrs = h_ptr + rows[:, None] * N + (g * GROUP_SIZE + offs_gn)[None, :]
            tl.store(h_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=h_ptr.dtype.element_ty),
                     mask=valid_m[:, None] & valid_n[None, :])


__all__ = ["_gated_up_gemm_persistent_kernel"]
