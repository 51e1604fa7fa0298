"""A program's share of a mask's union as bits in two 64-bit words, walked without memory loads.

The input-group GEMV (``gemv_decode``) reduces over the groups any token of the batch uses. A union list in global
memory costs one dependent load per K step (the weight address waits on the entry: on sm_90a the pipeline keeps 3 of
8 buffers at 32-row tiles), and a per-step load of the mask row is not prefetched at all (a synchronous load between
the MMA and the ``cp.async`` it predicates), so with narrow tiles each step waits out a loaded memory system's
latency (``benchmarks/down_gemv_parts_probe.py``, 8 tokens, 32-row tiles over every group: 50.4 µs with the mask
row loaded per step, 12 stages, against 33.4 with these words, 8 stages).

Here each program loads the ``[tokens, G]`` mask once (G <= ``MAX_GROUPS``), keeps the groups of its share of the
union as bits of two int64 words (groups 0-63 and 64-127) and each token's groups as two int64 words per token,
and every step pops the lowest set bit with scalar arithmetic: the weight address depends only on registers, so the
pipeline prefetches it like a pointer increment.

The share of split ``s`` of ``SPLIT``: the union's active groups ranked in order, ranks ``(s * per, (s + 1) * per]``
with ``per = ceil(active / SPLIT)`` (equal counts of active groups, as the list split them).
"""
from __future__ import annotations

from ._triton_utils import HAS_TRITON

MAX_GROUPS = 128  # two 64-bit words

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _load_half(mask_ptr, offs_t, valid_t, G, base):
        """``[tokens, 64]`` booleans: which tokens use groups ``base .. base + 63``."""
        offs_g = tl.arange(0, 64)
        return tl.load(mask_ptr + offs_t[:, None] * G + base + offs_g[None, :],
                       mask=valid_t[:, None] & (base + offs_g < G)[None, :], other=0) != 0

    @triton.jit
    def _half_words(on, rank_base, split, per):
        """One half's ``(share word, share count, each token's word)``; ``rank_base``: active groups before it."""
        bit = tl.arange(0, 64).to(tl.int64)
        used = tl.max(on.to(tl.int32), axis=0)
        rank = rank_base + tl.cumsum(used, 0)
        mine = (used > 0) & (rank > split * per) & (rank <= (split + 1) * per)
        tok_words = tl.sum(on.to(tl.int64) << bit[None, :], axis=1)
        return tl.sum(mine.to(tl.int64) << bit, axis=0), tl.sum(mine.to(tl.int32), axis=0), tok_words

    @triton.jit
    def union_words(mask_ptr, offs_t, valid_t, G, split, SPLIT: tl.constexpr):
        """``(lo, hi, count, tok_lo, tok_hi)``: this split's share of the union of the ``[M, G]`` mask rows (tokens
        ``offs_t`` where ``valid_t``), its group count, and each token's groups, as bits (group g: bit g % 64 of
        ``lo`` if g < 64 else of ``hi``)."""
        on_lo = _load_half(mask_ptr, offs_t, valid_t, G, 0)
        on_hi = _load_half(mask_ptr, offs_t, valid_t, G, 64)
        active_lo = tl.sum(tl.max(on_lo.to(tl.int32), axis=0), axis=0)
        per = tl.cdiv(active_lo + tl.sum(tl.max(on_hi.to(tl.int32), axis=0), axis=0), SPLIT)
        lo, n_lo, tok_lo = _half_words(on_lo, 0, split, per)
        hi, n_hi, tok_hi = _half_words(on_hi, active_lo, split, per)
        return lo, hi, n_lo + n_hi, tok_lo, tok_hi

    @triton.jit
    def lowest_bit_index(word):
        """Index of the lowest set bit of a non-zero int64 (its power of two is exact in fp32: the exponent field)."""
        low = word & (0 - word)
        return ((low.to(tl.float32).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127

    @triton.jit
    def pop_group(lo, hi):
        """``(g, lo, hi)``: the lowest group still set, and the words without it (both words zero: g is garbage,
        the caller counts its steps)."""
        use_lo = lo != 0
        cur = tl.where(use_lo, lo, hi)
        g = lowest_bit_index(cur) + tl.where(use_lo, 0, 64)
        rest = cur & (cur - 1)
        return g, tl.where(use_lo, rest, lo), tl.where(use_lo, hi, rest)

    @triton.jit
    def token_on(tok_lo, tok_hi, g):
        """Which tokens use group ``g`` (from their words)."""
        word = tl.where(g < 64, tok_lo, tok_hi)
        return ((word >> (g % 64).to(tl.int64)) & 1) != 0
