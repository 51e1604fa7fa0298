"""Prefill fused gate/up GEMM over output groups: ``h = act(x @ Wg.T) * (x @ Wu.T)`` on active groups, else 0.

Same tiling as ``gemm_output_groups`` (per-group reordered token lists, zero-only programs for fully
inactive tiles, in-kernel row gather and scatter), with both products per program: each program reads the same
n tile of the gate and of the up weight (two accumulators, or with ``PAIRED`` one of twice the width), so ``x`` rows
are loaded once for both products and the activation and product are applied in registers before the single store
of ``h``.

``TMA``: the weight tiles come through Hopper's tensor memory accelerator (host-side ``TensorDescriptor``s; the
gathered token rows stay pointer loads). The default from 512 tokens (256 since stop 24) where the descriptors are legal
(``tma_weights.tma_ok``: contiguous bf16 / fp16 weights with 16-byte rows; otherwise pointer loads): 4 stages up to
8191 tokens, 3 from 8192. H200, Llama-3-8B gate/up at 50%, µs, pointer loads with 3 stages / TMA with 3 / TMA with 4,
two device calls (``benchmarks/results/kernels_linear_sweep_tma.json``, ``kernels_linear_sweep_tma_v3.json``):
1024 tokens 237.1 / 222.3 / 215.6 and 234.9 / 220.9 / 213.9; 2048 530.7 / 473.8 / 457.6; 4096 1041.1 / 895.3 / 885.2
and 983.9 / 859.4 / 882.4; 8192 1856.5 / 1701.5 / 1949.7; 16384 3648.1 / 3498.6 / 3621.9 and 3576.0 / 3670.9 /
3382.8. Between calls the same configuration varies by up to 16%: from 8192 tokens TMA with 3 and 4 stages trade
places. An explicit ``config={"TMA": True}`` on weights TMA cannot take raises.

``PAIRED`` (config key, on by default wherever TMA is used): the group's gate and up tiles come as one
``[2, BLOCK_N, BLOCK_K]`` box of a descriptor that sees the two weights as ``[2, N, K]``
(``tma_weights.pair_descriptor``: dimension 0's stride is the distance between their addresses, so they need not share
an allocation), and each K step is one MMA of ``2 * BLOCK_N`` columns (one m64n256 wgmma per warpgroup instead of two
m64n128 that each read the ``x`` tile); the accumulator is split into its gate and up halves once per tile. Results
are bit-equal to two boxes. H200, 50% random masks, µs, median of 3 interleaved rounds, two boxes -> one
(``benchmarks/results/kernels_linear_sweep_paired.json``): 512 tokens 148.3 -> 139.0, 1024 227.8 -> 207.8, 2048
440.0 -> 375.7, 4096 856.2 -> 780.4, 8192 1675.6 -> 1558.9, 16384 3458.4 -> 3225.6. Where no pair descriptor is legal
(the same tensor twice, shapes that differ) two boxes are used.

``TAIL_SPLIT`` (config key, ``tail_split.py``; 2 in the TMA defaults): a group's last tile with at most half (with 4:
also a quarter) of its rows active runs the K loop on that many rows and stores zeros for the rest. H200, 50% random
masks, µs, median of 7 interleaved rounds, whole tiles -> halves
(``benchmarks/results/kernels_linear_sweep_half_tail.json``): 1024 tokens 225.5 -> 224.8, 2048 462.3 -> 432.6, 4096
900.5 -> 822.2, 16384 3384.0 -> 3309.7 (an earlier call: ``kernels_linear_sweep_half_tail_gate_up.json``). Only ~1.5%
of the rows at 4096 tokens are padding that this removes; why the gain is larger was not examined.

``ACTIVE_FIRST`` (config key, ``_triton_utils.output_group_tile``; on in the defaults from 512 to 8191 tokens): the
programs sweep the token tiles below the largest group's count first and store the zero-only tiles last, where they
fill SMs the last wave of MMA tiles leaves idle. H200, 50% random masks, µs, median of 5 interleaved rounds, off -> on
(``benchmarks/results/kernels_linear_sweep_active_first.json``): 1024 tokens 226.8 -> 222.7 (lower in every round),
4096 859.7 -> 837.6 (rounds overlap: 759-875 against 818-849), 16384 3435.6 -> 3440.2. The query projection's GEMM
(8 groups, 2 tiles each) lost 1-2% with it at every length and keeps the plain order.

``WARP_SPECIALIZE`` (config key, off by default; no effect on the H200 with Triton 3.6, ``notes_linear.md``): the K
loop as ``tl.range(..., warp_specialize=True)``, Triton's automatic warp specialisation (producer warps for the loads,
consumer warps for the MMAs), for the sweep ``benchmarks/kernels_linear.py --sweep-gate-up-tiles``.
"""
from __future__ import annotations

import torch

from ._triton_utils import (ACTIVATION_CODES, HAS_TRITON, activation_fn, cdiv, interpreting, next_pow2,
                            output_group_tile, tail_part, tail_rows)
from .group_gemm_tiles import load_token_rows, load_weight_pair, load_weight_tile
from .tma_weights import pair_descriptor, use_tma, weight_descriptors
from .tail_split import tail_split

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _gated_up_rows(
        x_ptr, wg_ptr, wu_ptr, h_ptr, wg_desc, wu_desc, rows, offs_m, count, offs_n, valid_n, out_mask, N, K,
        ACTIVATION: tl.constexpr,
        BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr,
        EVEN_N: tl.constexpr,
        UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        USE_TMA: tl.constexpr,
        WARP_SPECIALIZE: tl.constexpr,
        PAIRED: tl.constexpr,
        UP_FIRST: tl.constexpr,
    ):
        """``h[rows, n tile]`` of one tile (as many rows as ``rows`` holds): both products over K, then the
        activation, the product, zeros for rows at or past ``count``, one store."""
        offs_k = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + rows[:, None] * K + offs_k[None, :]
        n_start = tl.min(offs_n, 0)  # the tile's first output column (TMA coordinates)
        if PAIRED:  # one [2, N, K] box and one MMA of 2 x BLOCK_N columns per K step
            BLOCK_N: tl.constexpr = offs_n.shape[0]
            acc = tl.zeros((rows.shape[0], 2 * BLOCK_N), dtype=tl.float32)
            for k in tl.range(0, K, BLOCK_K, warp_specialize=WARP_SPECIALIZE):
                a = load_token_rows(x_ptrs, k, offs_k, K, EVEN_K, UPCAST)
                acc = tl.dot(a, load_weight_pair(wg_desc, n_start, k, BLOCK_N, BLOCK_K, UPCAST), acc,
                             input_precision=DOT_PRECISION)
                x_ptrs += BLOCK_K
            first, second = acc.reshape(rows.shape[0], 2, BLOCK_N).permute(0, 2, 1).split()
            if UP_FIRST:
                acc_g, acc_u = second, first
            else:
                acc_g, acc_u = first, second
        else:
            w_off = offs_n.to(tl.int64)[None, :] * K + offs_k[:, None]
            wg_ptrs = wg_ptr + w_off
            wu_ptrs = wu_ptr + w_off
            acc_g = tl.zeros((rows.shape[0], offs_n.shape[0]), dtype=tl.float32)
            acc_u = tl.zeros((rows.shape[0], offs_n.shape[0]), dtype=tl.float32)
            for k in tl.range(0, K, BLOCK_K, warp_specialize=WARP_SPECIALIZE):
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
        tl.store(h_ptr + rows[:, None] * N + offs_n[None, :], h.to(h_ptr.dtype.element_ty), mask=out_mask)

    @triton.jit
    def _gated_up_tail(
        x_ptr, wg_ptr, wu_ptr, h_ptr, wg_desc, wu_desc, tokens_ptr, tile_start, count, offs_m, rows, offs_n, valid_n,
        out_mask, M, N, K,
        PART: tl.constexpr,
        GROUP_SIZE: tl.constexpr,
        ACTIVATION: tl.constexpr,
        BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr,
        EVEN_N: tl.constexpr,
        UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        USE_TMA: tl.constexpr,
        WARP_SPECIALIZE: tl.constexpr,
        PAIRED: tl.constexpr,
        UP_FIRST: tl.constexpr,
    ):
        """A partly active tile whose active rows fit in its first ``PART`` rows: the products over those, zeros
        for the rest of the tile."""
        part_rows, part_offs, part_mask = tail_rows(tokens_ptr, tile_start, offs_n, valid_n, M, GROUP_SIZE, PART)
        _gated_up_rows(x_ptr, wg_ptr, wu_ptr, h_ptr, wg_desc, wu_desc, part_rows, part_offs, count, offs_n, valid_n,
                       part_mask, N, K, ACTIVATION, BLOCK_K, EVEN_K, EVEN_N, UPCAST, DOT_PRECISION, USE_TMA,
                       WARP_SPECIALIZE, PAIRED, UP_FIRST)
        rest = out_mask & (offs_m >= tile_start + PART)[:, None]
        tl.store(h_ptr + rows[:, None] * N + offs_n[None, :],
                 tl.zeros((offs_m.shape[0], offs_n.shape[0]), dtype=h_ptr.dtype.element_ty), mask=rest)

    @triton.jit
    def _gated_up_gemm_kernel(
        x_ptr, wg_ptr, wu_ptr, h_ptr, tokens_ptr, counts_ptr, wg_desc, wu_desc,
        M, N, K,
        GROUP_SIZE: tl.constexpr,
        TILES_PER_GROUP: tl.constexpr,
        ACTIVATION: tl.constexpr,
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
        PAIRED: tl.constexpr,
        UP_FIRST: tl.constexpr,
    ):
        tile_start, offs_m, rows, count, offs_n, valid_n, out_mask = output_group_tile(
            M, N, tokens_ptr, counts_ptr, GROUP_SIZE, TILES_PER_GROUP, BLOCK_M, BLOCK_N, GROUP_N, ACTIVE_FIRST)
        part = tail_part(count, tile_start, BLOCK_M, TAIL_SPLIT)
        if tile_start >= count:  # fully inactive tile: zeros only
            h_ptrs = h_ptr + rows[:, None] * N + offs_n[None, :]
            tl.store(h_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=h_ptr.dtype.element_ty), mask=out_mask)
        elif part == BLOCK_M:
            _gated_up_rows(x_ptr, wg_ptr, wu_ptr, h_ptr, wg_desc, wu_desc, rows, offs_m, count, offs_n, valid_n,
                           out_mask, N, K, ACTIVATION, BLOCK_K, EVEN_K, EVEN_N, UPCAST, DOT_PRECISION, USE_TMA,
                           WARP_SPECIALIZE, PAIRED, UP_FIRST)
        elif part == BLOCK_M // 2:  # the group's last tile, at most half of it active
            if BLOCK_M // 2 >= 16:
                _gated_up_tail(x_ptr, wg_ptr, wu_ptr, h_ptr, wg_desc, wu_desc, tokens_ptr, tile_start, count, offs_m,
                               rows, offs_n, valid_n, out_mask, M, N, K, BLOCK_M // 2, GROUP_SIZE, ACTIVATION, BLOCK_K,
                               EVEN_K, EVEN_N, UPCAST, DOT_PRECISION, USE_TMA, WARP_SPECIALIZE, PAIRED, UP_FIRST)
        else:
            if TAIL_SPLIT >= 4 and BLOCK_M // 4 >= 16:  # at most a quarter active
                _gated_up_tail(x_ptr, wg_ptr, wu_ptr, h_ptr, wg_desc, wu_desc, tokens_ptr, tile_start, count, offs_m,
                               rows, offs_n, valid_n, out_mask, M, N, K, BLOCK_M // 4, GROUP_SIZE, ACTIVATION,
                               BLOCK_K, EVEN_K, EVEN_N, UPCAST, DOT_PRECISION, USE_TMA, WARP_SPECIALIZE, PAIRED,
                               UP_FIRST)


def default_config(num_tokens: int, group_size: int) -> dict:
    """Tile sizes / warps / pipeline depth for the fused gate/up GEMM (two weight tiles per stage); see the module
    docstring for the TMA rows. 256-511 tokens: 128-token tiles of 64 columns (256 tokens: 107.7 µs against 116.5
    for 64 x 64, ``kernels_linear_sweep_moderate.json``), since stop 24 with TMA, paired tiles and half-height tails
    (107.1 -> 99.8 µs, ``kernels_linear_sweep_paired.json``), since stop 38 with 8 warps instead of 4 (the one
    warpgroup held 255 registers per thread, ``results/ncu_gate_up_256.txt``; 98.6 / 99.2 -> 95.8 / 95.8 µs at 50% /
    trained masks in 3 interleaved rounds, outputs bit-equal, ``kernels_linear_sweep_gate_up_tail_fold.json``)."""
    block_n = min(128, max(16, next_pow2(group_size)))
    if interpreting():
        return dict(BLOCK_M=32, BLOCK_N=min(block_n, 64), BLOCK_K=64, num_warps=4, num_stages=1)
    if num_tokens >= 8192:
        return dict(BLOCK_M=128, BLOCK_N=block_n, BLOCK_K=64, num_warps=8, num_stages=3, TMA=True, TAIL_SPLIT=2)
    if num_tokens >= 512:
        return dict(BLOCK_M=128, BLOCK_N=block_n, BLOCK_K=64, num_warps=8, num_stages=4, TMA=True, TAIL_SPLIT=2,
                    ACTIVE_FIRST=True)
    if num_tokens >= 256:
        return dict(BLOCK_M=128, BLOCK_N=min(block_n, 64), BLOCK_K=64, num_warps=8, num_stages=4, TMA=True,
                    TAIL_SPLIT=2)
    return dict(BLOCK_M=64, BLOCK_N=min(block_n, 64), BLOCK_K=64, num_warps=4, num_stages=3)


def gated_up_gemm(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    group_tokens: torch.Tensor,
    group_counts: torch.Tensor,
    group_size: int,
    activation: str,
    config: dict | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch the kernel on checked, contiguous 2-D inputs; returns a new ``h[M, I]``."""
    num_tokens, k_dim = x.shape
    n_dim = w_gate.shape[0]
    cfg = dict(default_config(num_tokens, group_size), **(config or {}))
    block_m, block_n, block_k = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    h = torch.empty(num_tokens, n_dim, dtype=x.dtype, device=x.device) if out is None else out
    tiles_per_group = cdiv(group_size, block_n)
    grid = (cdiv(num_tokens, block_m) * (n_dim // group_size) * tiles_per_group,)
    tma = use_tma("gated_up_gemm", cfg, config, w_gate, w_up)
    pair = pair_descriptor(w_gate, w_up, block_n, block_k) if tma and cfg.get("PAIRED", True) else None
    if pair is not None:
        descs, up_first = (pair[0], pair[0]), pair[1]
    else:
        descs, up_first = (weight_descriptors((w_gate, w_up), block_n, block_k) if tma else (w_gate, w_up)), False
    _gated_up_gemm_kernel[grid](
        x, w_gate, w_up, h, group_tokens, group_counts, *descs,
        num_tokens, n_dim, k_dim,
        GROUP_SIZE=group_size,
        TILES_PER_GROUP=tiles_per_group,
        ACTIVATION=ACTIVATION_CODES[activation],
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
        PAIRED=pair is not None,
        UP_FIRST=up_first,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    return h
