"""Prefill kernel for head-group-masked attention: flash-attention forward with per-group row compaction.

Scheme (one idea): for every (batch, group) the active query rows are **compacted** to the front, in ascending
position order (one small Triton launch, :mod:`wide_compile.templates.attention_compact`). A program handles a
(tile of ``BLOCK_M`` compacted rows, query head):

- tiles past the group's active count hold only inactive rows: the program writes zeros through the row index list and
  exits (block-level skipping, no Q/K/V read);
- other tiles gather their query rows by index, run online-softmax attention over keys ``0 .. max position`` of the
  tile (causal) or all keys, and scatter the normalised rows back; rows past the active count are written as zeros.

Random per-token masks almost never leave a whole 128-row tile of *original* positions inactive, so plain block
skipping would save nothing; the compaction makes the work proportional to the active rows (for causal attention the
sum of their positions) at the cost of a wider causal band: a tile of compacted rows spans about
``BLOCK_M / density`` positions, and only keys below the tile's first position skip the causal mask.

Tiles are launched in reverse order (largest positions first) so the long causal rows do not form the tail; with
``HEADS_FIRST`` the grid is (heads, tiles), so this holds over all heads rather than within each, and with
``ACTIVE_FIRST`` the zero-only tiles (past every group's count) come after the others instead of before
(:func:`prefill_config` has the measurements).

With an explicit boolean ``attn_mask`` (a static KV cache's causal + unfilled-slot mask, padding) instead of
``causal``, one small launch first finds each mask row's first and last visible key and whether it sees every key in
between (:mod:`wide_compile.templates.attention_mask_extents`); a tile then loops only over the key blocks between
its rows' extents, so a static cache's unfilled slots are never read. Two launches of the kernel share the tiles:

- the extents pass (``TILE_MASK = False``) takes the tiles whose active rows are each one contiguous key range
  (causal and padding masks, what transformers builds): the extents are the mask, which it does not read; the key
  blocks every row sees in full run unmasked, the others with a range predicate, as the causal variant does;
- the mask-tile pass (``TILE_MASK = True``) takes the other active tiles and applies the mask tile as -inf. The
  extents pass lists them (one atomic per listed tile into an ``arrival_counters`` counter), and the mask-tile pass
  runs on a small grid (2 programs per SM) that shares the list out; the last of its programs resets the counters.
  With nothing listed (every mask transformers builds) it costs one launch of exiting programs: with one program per
  tile, whose programs read the order and the extents before exiting, it took 14.3 of the 178.4 µs per layer at 4096
  tokens on the H200 (``benchmarks/results/kernels_attention_prefill_mask_pass.json``).

Two launches rather than a branch: ptxas serializes every wgmma of a function whose loop loads a mask tile
(C7515, ``benchmarks/attention_aot_report.py``), which made the one-launch version 1.8x slower than the causal
variant at 16k tokens on the H200 (4.48 vs 2.45 ms per layer, ``benchmarks/notes_e2e.md``). The extents pass compiles
as the causal variant does (no C7515, no spills); on a static cache's mask at 4096 tokens it took 0.165 ms per layer
on the H200 (``benchmarks/results/kernels_attention_prefill_mask_list.json``, first pass alone).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention_block import attend_block, load_key_block, load_value_block
from .attention_checks import (
    AttentionDims, allocate_output, check_attention_inputs, expand_attn_mask, expand_attn_mask_extents, interpreting,
)
from .attention_compact import check_row_order, compact_active_rows
from .attention_mask_extents import attn_mask_extents as attn_mask_extents_of
from .attention_mask_extents import check_attn_mask_extents
from .arrival_counters import arrival_counters
from ._triton_utils import sm_count, tiles_below_largest_count

__all__ = ["group_attention_prefill"]

_LOG2E = 1.4426950408889634


@triton.jit
def _attend_key_range(
    acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, q_pos, lo, hi, kv_len, qk_scale,
    offs_n, offs_d, dmask, row0,
    MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_N: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
):
    """Online-softmax update of (acc, l_i, m_i) over keys [lo, hi); scores kept in the log2 domain."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if USE_TMA:  # (keys past kv_len: their scores are hidden below when MASKED, and lie past hi otherwise)
            k = load_key_block(k_base, stride_ks, cols, cols < kv_len, offs_d, dmask, row0, start_n, True)
        else:
            k_ptrs = k_base + cols[None, :] * stride_ks + offs_d[:, None]  # [BLOCK_D, BLOCK_N]
            if MASKED:
                k = tl.load(k_ptrs, mask=(cols[None, :] < kv_len) & dmask[:, None], other=0.0)
            elif EVEN_D:
                k = tl.load(k_ptrs)
            else:
                k = tl.load(k_ptrs, mask=dmask[:, None], other=0.0)
        qk = tl.dot(q, k, input_precision=INPUT_PRECISION)
        if MASKED:
            valid = cols[None, :] < kv_len
            if IS_CAUSAL:
                valid = valid & (cols[None, :] <= q_pos[:, None])
            # A finite penalty (not -inf) keeps fully masked rows finite; such rows are never stored.
            qk = qk * qk_scale + tl.where(valid, 0.0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if USE_TMA:
            v = load_value_block(v_base, stride_vs, cols, cols < kv_len, offs_d, dmask, row0, start_n, True)
        else:
            v_ptrs = v_base + cols[:, None] * stride_vs + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
            if MASKED:
                v = tl.load(v_ptrs, mask=(cols[:, None] < kv_len) & dmask[None, :], other=0.0)
            elif EVEN_D:
                v = tl.load(v_ptrs)
            else:
                v = tl.load(v_ptrs, mask=dmask[None, :], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=INPUT_PRECISION)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _attend_masked_keys(
    acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, am_rows, row_on, stride_as, lo, hi, kv_len, qk_scale,
    offs_n, offs_d, dmask, row0, BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
):
    """Online-softmax update over keys [lo, hi) under an explicit boolean mask (``am_rows``: each row's mask pointer).

    ``[lo, hi)`` covers every key some row of the tile may see (from the mask's row extents), so a static KV cache's
    unfilled slots and the causal upper triangle are never visited; inside it the mask tile is applied as -inf with
    no branch, which keeps the loop software-pipelined. A row with no visible key keeps m = -inf and l = 0 (output 0).
    """
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        col_ok = cols < kv_len
        allowed = tl.load(am_rows[:, None] + cols[None, :] * stride_as, mask=row_on[:, None] & col_ok[None, :],
                          other=0) != 0
        acc, l_i, m_i = attend_block(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, cols, col_ok, allowed,
                                     offs_d, dmask, qk_scale, row0, start_n, INPUT_PRECISION, USE_TMA)
    return acc, l_i, m_i


@triton.jit
def _attend_key_extents(
    acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, first, last, lo, hi, kv_len, qk_scale,
    offs_n, offs_d, dmask, row0, BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
):
    """Online-softmax update over keys [lo, hi) for rows that see exactly the keys [first, last] (contiguous rows:
    the extents are the mask, which is not read)."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        allowed = (cols[None, :] >= first[:, None]) & (cols[None, :] <= last[:, None])
        acc, l_i, m_i = attend_block(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, cols, cols < kv_len,
                                     allowed, offs_d, dmask, qk_scale, row0, start_n, INPUT_PRECISION, USE_TMA)
    return acc, l_i, m_i


@triton.jit
def _attend_contiguous_rows(
    acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, first, last, row_on, kv_len, qk_scale, q_pos,
    offs_n, offs_d, dmask, row0, EVEN_D: tl.constexpr, BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """A tile whose active rows each see one contiguous key range: the key blocks every active row sees in full run
    unmasked (for a causal mask: all keys below the tile's first position), the blocks before and after them with the
    range predicate."""
    lo = (tl.min(tl.where(row_on, first, kv_len), 0) // BLOCK_N) * BLOCK_N
    hi = tl.max(tl.where(row_on, last, -1), 0) + 1
    inner_lo = tl.cdiv(tl.max(tl.where(row_on, first, 0), 0), BLOCK_N) * BLOCK_N
    inner_hi = ((tl.min(tl.where(row_on, last, kv_len - 1), 0) + 1) // BLOCK_N) * BLOCK_N
    mid_lo = tl.minimum(tl.maximum(inner_lo, lo), hi)
    mid_hi = tl.maximum(mid_lo, inner_hi)
    acc, l_i, m_i = _attend_key_extents(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, first, last, lo,
                                        mid_lo, kv_len, qk_scale, offs_n, offs_d, dmask, row0, BLOCK_N,
                                        INPUT_PRECISION, USE_TMA)
    acc, l_i, m_i = _attend_key_range(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, q_pos, mid_lo, mid_hi,
                                      kv_len, qk_scale, offs_n, offs_d, dmask, row0, False, False, EVEN_D, BLOCK_N,
                                      INPUT_PRECISION, USE_TMA)
    acc, l_i, m_i = _attend_key_extents(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, first, last, mid_hi,
                                        hi, kv_len, qk_scale, offs_n, offs_d, dmask, row0, BLOCK_N,
                                        INPUT_PRECISION, USE_TMA)
    return acc, l_i, m_i


@triton.jit
def _prefill_kernel(
    Q, K, V, O, ORDER, COUNT, AMASK, EXT, WORK, COUNTERS,
    stride_qb, stride_qh, stride_qt,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_ot,
    stride_ab, stride_ah, stride_at, stride_as,
    stride_eb, stride_eh, stride_et,
    num_q_heads, num_groups, q_len, kv_len, q_per_kv, heads_per_group, qk_scale, num_m, num_bh, num_counts,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_AMASK: tl.constexpr,
    TILE_MASK: tl.constexpr, INPUT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    H_PACK: tl.constexpr, USE_TMA: tl.constexpr, HEADS_FIRST: tl.constexpr, ACTIVE_FIRST: tl.constexpr,
):
    tensors = (Q, K, V, O, ORDER, COUNT, AMASK, EXT, WORK, COUNTERS)
    strides = (stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
               stride_ob, stride_oh, stride_ot, stride_ab, stride_ah, stride_at, stride_as, stride_eb, stride_eh,
               stride_et)
    sizes = (num_q_heads, num_groups, q_len, kv_len, q_per_kv, heads_per_group, qk_scale, num_bh)
    if TILE_MASK:
        # The tiles the extents pass listed (a row that is not one contiguous key range), shared by a small grid;
        # the last program to finish resets the list's counters to 0 (``arrival_counters``' contract).
        listed = tl.load(COUNTERS)
        for i in range(tl.program_id(0), listed, tl.num_programs(0)):
            tile = tl.load(WORK + i)
            _prefill_tile(tile // num_bh, tile % num_bh, tensors, strides, sizes, HEAD_DIM, BLOCK_D, IS_CAUSAL,
                          HAS_AMASK, True, INPUT_PRECISION, BLOCK_M, BLOCK_N, H_PACK, USE_TMA)
        finished = tl.atomic_add(COUNTERS + 1, 1, sem="acq_rel")
        if finished == tl.num_programs(0) - 1:
            tl.atomic_xchg(COUNTERS, 0)
            tl.atomic_xchg(COUNTERS + 1, 0)
    else:
        if HEADS_FIRST:  # grid (heads, tiles): every head's tile of the largest positions first (longest overall first)
            j = tl.program_id(1)
            bh = tl.program_id(0)
        else:  # grid (tiles, heads): largest positions first within each head
            j = tl.program_id(0)
            bh = tl.program_id(1)
        if ACTIVE_FIRST:  # (a power of two >= B * groups) the tiles past every group's count (zeros only) come last
            m_act = tiles_below_largest_count(COUNT, num_counts, BLOCK_M, ACTIVE_FIRST)
            pid_m = tl.where(j < m_act, m_act - 1 - j, j)
        else:
            pid_m = num_m - 1 - j
        _prefill_tile(pid_m, bh, tensors, strides, sizes, HEAD_DIM, BLOCK_D, IS_CAUSAL, HAS_AMASK, False,
                      INPUT_PRECISION, BLOCK_M, BLOCK_N, H_PACK, USE_TMA)


@triton.jit
def _prefill_tile(
    pid_m, bh, tensors, strides, sizes,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_AMASK: tl.constexpr,
    TILE_MASK: tl.constexpr, INPUT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    H_PACK: tl.constexpr, USE_TMA: tl.constexpr,
):
    """One (tile of compacted rows, packed heads) of the kernel (the kernel's arguments as three tuples); see the
    module docstring."""
    Q, K, V, O, ORDER, COUNT, AMASK, EXT, WORK, COUNTERS = tensors
    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs, \
        stride_ob, stride_oh, stride_ot, stride_ab, stride_ah, stride_at, stride_as, stride_eb, stride_eh, \
        stride_et = strides
    num_q_heads, num_groups, q_len, kv_len, q_per_kv, heads_per_group, qk_scale, num_bh = sizes
    b = bh // (num_q_heads // H_PACK)
    h0 = (bh % (num_q_heads // H_PACK)) * H_PACK  # the first of the H_PACK query heads packed into this tile
    g = h0 // heads_per_group
    kvh = h0 // q_per_kv
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM

    # The tile's rows: H_PACK heads x BLOCK_M compacted positions (head-major); the heads share rows, mask and K/V.
    offs_p = tl.arange(0, H_PACK * BLOCK_M)
    h = h0 + offs_p // BLOCK_M
    offs_m = pid_m * BLOCK_M + offs_p % BLOCK_M
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HEAD_DIM
    in_range = offs_m < q_len
    order_base = ORDER + (b * num_groups + g).to(tl.int64) * q_len
    count = tl.load(COUNT + b * num_groups + g)
    rows = tl.load(order_base + offs_m, mask=in_range, other=0)  # original token index of each compacted row
    o_ptrs = O + b.to(tl.int64) * stride_ob + h[:, None] * stride_oh + rows[:, None].to(tl.int64) * stride_ot \
        + offs_d[None, :]
    store_mask = in_range[:, None] & dmask[None, :]

    tile_start = pid_m * BLOCK_M
    if tile_start >= count:
        # Every row of this tile is inactive for this group: write zeros, read nothing else (the mask-tile pass of an
        # explicit mask leaves them to the first pass).
        if not TILE_MASK:
            tl.store(o_ptrs, tl.zeros([H_PACK * BLOCK_M, BLOCK_D], dtype=O.dtype.element_ty), mask=store_mask)
    else:
        row_on = offs_m < count
        offset = kv_len - q_len
        q_pos = rows + offset
        mine = True
        if HAS_AMASK:  # contiguous tiles belong to the first pass, which lists the others for the mask-tile pass
            ext = EXT + b.to(tl.int64) * stride_eb + h * stride_eh + rows.to(tl.int64) * stride_et
            contiguous = tl.min(tl.load(ext + 2, mask=row_on, other=1), 0) != 0
            mine = contiguous != TILE_MASK
            if not TILE_MASK:
                if contiguous == 0:
                    tl.store(WORK + tl.atomic_add(COUNTERS, 1, sem="relaxed"), pid_m * num_bh + bh)
        if mine:
            q_ptrs = Q + b.to(tl.int64) * stride_qb + h[:, None] * stride_qh + rows[:, None].to(tl.int64) * stride_qt \
                + offs_d[None, :]
            q = tl.load(q_ptrs, mask=store_mask, other=0.0)
            if USE_TMA:  # K / V are descriptors over [B * Hkv * S, D]: this (batch, KV head)'s rows start at row0
                k_base = K
                v_base = V
                row0 = (b * (num_q_heads // q_per_kv) + kvh) * kv_len
            else:
                k_base = K + b.to(tl.int64) * stride_kb + kvh * stride_kh
                v_base = V + b.to(tl.int64) * stride_vb + kvh * stride_vh
                row0 = 0
            m_i = tl.zeros([H_PACK * BLOCK_M], dtype=tl.float32) - float("inf")
            l_i = tl.zeros([H_PACK * BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([H_PACK * BLOCK_M, BLOCK_D], dtype=tl.float32)
            if HAS_AMASK:
                first = tl.load(ext, mask=row_on, other=kv_len)
                last = tl.load(ext + 1, mask=row_on, other=-1)
                if TILE_MASK:
                    lo = (tl.min(first, 0) // BLOCK_N) * BLOCK_N
                    hi = tl.max(last, 0) + 1
                    am_rows = AMASK + b.to(tl.int64) * stride_ab + h * stride_ah + rows.to(tl.int64) * stride_at
                    acc, l_i, m_i = _attend_masked_keys(
                        acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, am_rows, row_on, stride_as, lo, hi,
                        kv_len, qk_scale, offs_n, offs_d, dmask, row0, BLOCK_N, INPUT_PRECISION, USE_TMA,
                    )
                else:
                    acc, l_i, m_i = _attend_contiguous_rows(
                        acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, first, last, row_on, kv_len,
                        qk_scale, q_pos, offs_n, offs_d, dmask, row0, EVEN_D, BLOCK_N, INPUT_PRECISION, USE_TMA,
                    )
            else:
                acc, l_i, m_i = _attend_plain(
                    acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, q_pos, order_base, tile_start, count,
                    offset, kv_len, qk_scale, offs_n, offs_d, dmask, row0, IS_CAUSAL, EVEN_D, BLOCK_M, BLOCK_N,
                    INPUT_PRECISION, USE_TMA,
                )
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            out = tl.where(row_on[:, None], out, 0.0)
            tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=store_mask)


@triton.jit
def _attend_plain(
    acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, q_pos, order_base, tile_start, count, offset, kv_len,
    qk_scale, offs_n, offs_d, dmask, row0, IS_CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
):
    """Causal or full attention without an explicit mask: keys every row sees unmasked, then the masked band."""
    if IS_CAUSAL:
        last = tl.minimum(tile_start + BLOCK_M, count) - 1
        first_pos = tl.load(order_base + tile_start) + offset
        last_pos = tl.load(order_base + last) + offset
        lo = ((first_pos + 1) // BLOCK_N) * BLOCK_N  # keys < lo are visible to every active row
        hi = last_pos + 1
    else:
        lo = (kv_len // BLOCK_N) * BLOCK_N
        hi = kv_len
    acc, l_i, m_i = _attend_key_range(
        acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, q_pos, 0, lo, kv_len, qk_scale,
        offs_n, offs_d, dmask, row0, False, IS_CAUSAL, EVEN_D, BLOCK_N, INPUT_PRECISION, USE_TMA,
    )
    acc, l_i, m_i = _attend_key_range(
        acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, q_pos, lo, hi, kv_len, qk_scale,
        offs_n, offs_d, dmask, row0, True, IS_CAUSAL, EVEN_D, BLOCK_N, INPUT_PRECISION, USE_TMA,
    )
    return acc, l_i, m_i


# Launch config by sequence length; no autotuner (it would tune on whichever shape comes first and cannot run inside
# a CUDA-graph capture). From the H200 measurements in benchmarks/notes_attention.md. sm_90 compile report
# (benchmarks/attention_aot_report.py, D=128 bf16): 128x64 tiles with 4 warps spill (255 regs), so BLOCK_M=128 tiles
# use 8 warps (two warpgroups).
_PREFILL_CONFIGS = (
    # (max(T, S) up to, BLOCK_M, BLOCK_N, num_warps, num_stages, H_PACK, TMA K / V, HEADS_FIRST and ACTIVE_FIRST)
    (4096, 32, 64, 4, 3, 2, True, True),
    (1 << 62, 32, 64, 8, 3, 4, False, False),
)
SWEEP_CONFIGS = ((128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (64, 64, 4, 3), (64, 64, 4, 4))
# Query heads packed into one tile (``H_PACK``, the last entry): H_PACK x BLOCK_M rows per program.
PACKED_SWEEP_CONFIGS = ((64, 64, 8, 3, 2), (64, 64, 8, 4, 2), (64, 128, 8, 2, 2), (32, 64, 8, 3, 4),
                        (32, 64, 4, 3, 2), (32, 128, 8, 2, 4), (128, 64, 8, 3, 2),
                        (32, 64, 4, 2, 2), (32, 64, 8, 2, 4))  # 2 stages: two programs' shared memory fit an SM

_SMEM_LIMIT = 227 * 1024
_MASK_PASS_PROGRAMS_INTERPRETED = 3  # the mask-tile pass's grid under the interpreter (2 per SM on a GPU)

# Under the interpreter one small config keeps CPU tests fast.
_INTERPRET_META = {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}


def prefill_config(q_len: int, kv_len: int, head_dim: int, elem_size: int = 2, masked: bool = False) -> dict:
    """``{"BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "H_PACK", "TMA"}`` for the prefill kernel.

    The row of ``_PREFILL_CONFIGS`` is chosen by ``max(q_len, kv_len)``, or by ``q_len`` with an explicit mask
    (``masked``): a static KV cache's slots past the prompt are never visited, so its ``kv_len`` overstates the work.
    H200, a 4096-token prompt in 4160 slots, 50% random head groups (``kernels_attention_prefill_static.json``):
    64 x 64 tiles 0.219 ms per layer against 0.249 for the 128 x 64 tiles ``max`` chose; 16384 tokens: 128 x 64
    2.47 ms against 2.57. With query heads packed (``H_PACK`` heads of one group share a tile's rows and each K/V
    block; ``kernels_attention_prefill_packed.json``, same layout, ms per layer, previous default -> new): 1024 tokens
    0.0367 -> 0.0328 (2 heads x 32 rows, 4 warps), 4096 0.2210 -> 0.2143 (same), 16384 2.4517 -> 2.2837 (4 heads x 32
    rows, 8 warps). Where a model's heads do not allow the packing, ``launch_prefill`` packs fewer heads into taller
    tiles (the same rows per tile). K / V blocks as TMA boxes (``TMA``, where ``kv_tma_ok``;
    ``kernels_attention_prefill_static_tma.json``, same layout): 4096 tokens 0.2103-0.2111 -> 0.2045-0.2053 ms with the
    4-warp tiles, but 2.2023-2.2670 -> 2.4178-2.4751 at 16384 tokens with the 8-warp tiles, which keep pointer loads.
    Compiled for sm_90a (``attention_aot_report.py``) the TMA kernels use 152-162 registers against 242-255.
    ``HEADS_FIRST`` (the grid's heads dimension first, so the tiles of the largest positions of every head run
    first; ``kernels_attention_prefill_heads_first.json``, same layout, ms per layer): 1024 tokens 0.0324 -> 0.0312,
    4096 0.2052 -> 0.1801; at 16384 it loses (2.1444 -> 2.2826: every KV head's 8 MB of K / V is then read at once,
    more than L2 holds), so the longer row keeps the tiles of one head together. With it, ``ACTIVE_FIRST`` (the
    zero-only tiles after the others; ``kernels_attention_prefill_active_first.json``): 4096 tokens 0.1729 -> 0.1684,
    1024 0.0325 -> 0.0306 (not timed at 16384, where it stays off).

    Tiles shrink for wide heads or fp32 so that Q plus the pipelined K/V stages fit in the 227 KB of shared memory
    of an sm_90 block and the fp32 accumulator stays in registers.
    """
    if interpreting():
        return dict(_INTERPRET_META)
    length = q_len if masked else max(q_len, kv_len)
    for max_len, block_m, block_n, warps, stages, pack, tma, heads_first in _PREFILL_CONFIGS:
        if length <= max_len:
            break
    block_d = max(16, triton.next_power_of_2(head_dim))
    if block_d * elem_size > 256:  # wide fp32/bf16 rows: smaller query tile, accumulator of 64 rows (pointer loads)
        block_m, warps, pack, tma = 64, 4, 1, False
    rows = pack * block_m
    while block_n > 32 and rows * block_d * elem_size + stages * 2 * block_n * block_d * elem_size > _SMEM_LIMIT:
        block_n //= 2
    while stages > 2 and rows * block_d * elem_size + stages * 2 * block_n * block_d * elem_size > _SMEM_LIMIT:
        stages -= 1
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages, "H_PACK": pack,
            "TMA": tma, "HEADS_FIRST": heads_first, "ACTIVE_FIRST": heads_first}


def head_pack(cfg: dict, dims: AttentionDims, explicit: bool) -> int:
    """Query heads per tile (``H_PACK``): a power of two dividing both the heads of one mask group and the query heads
    of one KV head, so that the packed heads share their active rows and their K/V. A default the shape does not allow
    falls back to the largest that fits; an explicit one raises."""
    pack = int(cfg.get("H_PACK", 1))
    if pack < 1 or pack & (pack - 1):
        raise ValueError(f"group_attention_prefill: H_PACK must be a power of two >= 1, got {pack}")
    fits = lambda p: dims.heads_per_group % p == 0 and dims.q_per_kv % p == 0  # noqa: E731
    if not fits(pack):
        if explicit:
            raise ValueError(f"group_attention_prefill: H_PACK={pack} must divide the {dims.heads_per_group} query "
                             f"heads of a group and the {dims.q_per_kv} query heads of a KV head")
        while not fits(pack):
            pack //= 2
    return pack


def kv_tma_ok(k: torch.Tensor, v: torch.Tensor, dims: AttentionDims, block_d: int) -> bool:
    """Whether K / V blocks may be TMA boxes of ``[B * Hkv * S, D]`` views: a CUDA device (not the interpreter),
    contiguous 16-bit K and V, whole rows in one block (``head_dim`` a power of two) of 16-byte multiples."""
    return (not interpreting() and k.is_cuda and block_d == dims.head_dim and k.dtype in (torch.bfloat16, torch.float16)
            and all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (k, v))
            and (dims.head_dim * k.element_size()) % 16 == 0)


def kv_descriptors(k: torch.Tensor, v: torch.Tensor, head_dim: int, block_n: int) -> tuple:
    """Host-side TMA descriptors of K and V as ``[B * Hkv * S, D]``, box ``[block_n, head_dim]``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return tuple(TensorDescriptor.from_tensor(t.view(-1, head_dim), [block_n, head_dim]) for t in (k, v))


def launch_prefill(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_mask: torch.Tensor, out: torch.Tensor,
    dims: AttentionDims, causal: bool, config: dict | None = None, attn_mask: torch.Tensor | None = None,
    attn_mask_extents: torch.Tensor | None = None, row_order: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Run the prefill kernel into ``out`` (a ``[B, Hq, T, D]`` view with unit last stride). Inputs are checked.

    ``config`` (``BLOCK_M``, ``BLOCK_N``, ``num_warps``, ``num_stages``, optional ``H_PACK``, ``TMA`` and
    ``HEADS_FIRST``) overrides :func:`prefill_config`; ``TMA``: K / V blocks as TMA boxes where :func:`kv_tma_ok`
    allows (else pointer loads); ``HEADS_FIRST``: the grid is (heads, tiles) instead of (tiles, heads);
    ``ACTIVE_FIRST``: the tiles past every group's active count (zeros only) run after the others, not before;
    ``attn_mask``: the checked boolean mask (see ``attention_checks.expand_attn_mask``); ``attn_mask_extents``: its
    row extents if already computed (``attention_mask_extents.attn_mask_extents``), else they are computed here;
    ``row_order``: ``(order, count)`` of ``head_mask`` if already computed (``wide::group_rows``), else computed here.
    """
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if interpreting() and q.dtype == torch.bfloat16:  # the interpreter mis-computes bf16: run in fp32
        staging = torch.empty(out.shape, dtype=torch.float32, device=out.device)
        launch_prefill(q.float(), k.float(), v.float(), head_mask, staging, dims, causal, config, attn_mask,
                       attn_mask_extents, row_order)
        out.copy_(staging)
        return
    order, count = compact_active_rows(head_mask) if row_order is None else row_order
    amask = ext = None
    if attn_mask is not None:
        amask = expand_attn_mask(attn_mask, dims)
        if attn_mask_extents is None:
            attn_mask_extents = attn_mask_extents_of(attn_mask, dims.kv_len)
        else:
            check_attn_mask_extents(attn_mask_extents, attn_mask)
        ext = expand_attn_mask_extents(attn_mask_extents, dims)
    block_d = max(16, triton.next_power_of_2(dims.head_dim))
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    cfg = dict(config or prefill_config(dims.q_len, dims.kv_len, dims.head_dim, q.element_size(), amask is not None))
    tma = bool(cfg.pop("TMA", False)) and kv_tma_ok(k, v, dims, block_d)
    heads_first = bool(cfg.pop("HEADS_FIRST", False))
    active_first = triton.next_power_of_2(dims.batch * dims.num_groups) if cfg.pop("ACTIVE_FIRST", False) else 0
    k_arg, v_arg = kv_descriptors(k, v, dims.head_dim, cfg["BLOCK_N"]) if tma else (k, v)
    asked = int(cfg.get("H_PACK", 1))
    cfg["H_PACK"] = head_pack(cfg, dims, explicit=config is not None and "H_PACK" in config)
    cfg["BLOCK_M"] *= asked // cfg["H_PACK"]  # a default packing the heads do not allow: taller tiles, same rows
    num_m, num_bh = triton.cdiv(dims.q_len, cfg["BLOCK_M"]), dims.batch * dims.num_q_heads // cfg["H_PACK"]
    if amask is not None:  # the extents pass lists the tiles it leaves to the mask-tile pass
        work = torch.empty(num_m * num_bh, dtype=torch.int32, device=q.device)
        counters = arrival_counters(2, q.device)
    else:
        work = counters = order  # unused
    args = (
        q, k_arg, v_arg, out, order, count, amask if amask is not None else order, ext if ext is not None else order,
        work, counters,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        *(amask.stride() if amask is not None else (0, 0, 0, 0)),
        *(ext.stride()[:3] if ext is not None else (0, 0, 0)),
        dims.num_q_heads, dims.num_groups, dims.q_len, dims.kv_len, dims.q_per_kv, dims.heads_per_group,
        dims.scale * _LOG2E, num_m, num_bh, dims.batch * dims.num_groups,
    )
    meta = {"HEAD_DIM": dims.head_dim, "BLOCK_D": block_d, "IS_CAUSAL": causal, "HAS_AMASK": amask is not None,
            "INPUT_PRECISION": precision, "USE_TMA": tma, "HEADS_FIRST": heads_first, "ACTIVE_FIRST": active_first}
    grid = (num_bh, num_m) if heads_first else (num_m, num_bh)
    _prefill_kernel[grid](*args, **meta, TILE_MASK=False, **cfg)
    if amask is not None:  # the listed tiles (none for causal or padding masks: every program exits at once)
        programs = min(num_m * num_bh, _MASK_PASS_PROGRAMS_INTERPRETED if interpreting() else 2 * sm_count(q.device))
        _prefill_kernel[(programs,)](*args, **meta, TILE_MASK=True, **cfg)


def group_attention_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    head_mask: torch.Tensor,
    causal: bool = True,
    scale: float | None = None,
    merge_heads: bool = False,
    out: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    attn_mask_extents: torch.Tensor | None = None,
    row_order: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Head-group-masked attention with the prefill (flash, row-compacting) kernel for any T.

    Returns ``o[B, Hq, T, D]``, or ``[B, T, Hq * D]`` with ``merge_heads=True``. See
    :func:`wide_compile.templates.attention.group_attention` for the semantics.
    """
    dims = check_attention_inputs(q, k, v, head_mask, causal, scale, attn_mask, attn_mask_extents)
    if row_order is not None:
        check_row_order("group_attention_prefill", row_order, head_mask)
    result, view = allocate_output(q, dims, merge_heads, out)
    if dims.q_len > 0:
        launch_prefill(q, k, v, head_mask, view, dims, causal, attn_mask=attn_mask,
                       attn_mask_extents=attn_mask_extents, row_order=row_order)
    return result

