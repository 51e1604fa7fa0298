"""Per-group token lists of a long prompt in two parallel passes over token chunks (``group_plan``'s "output" tables).

``group_plan``'s one-kernel build gives each group one program that walks all ``M`` tokens with a running prefix
sum, so at 16384 tokens a program makes several dependent steps and only ``G`` programs run (8 for the query
projection's groups): 23.6 µs for 8 groups, 41.5 for 112 on the H200 (``list_scan.py``). Here the work is spread
over token chunks instead, every chunk handling all groups:

1. ``_chunk_counts_kernel``: per chunk, each group's active-token count (one coalesced load of the chunk's mask rows);
2. ``_chunk_lists_kernel``: per chunk, each group's active tokens before the chunk (a sum over the earlier chunks'
   counts, or with many chunks one row of the offsets pass between the two, see the end), then prefix sums down the
   chunk give every (token, group) its list position, stored at once; the last chunk also stores the totals.

The lists are the same, entry for entry, as the one-kernel build's: a group's active tokens first in ascending order,
its inactive ones from the back (the first inactive token at position ``M - 1``).

H200, µs per call, one kernel / two passes (``benchmarks/kernels_group_lists.py --two-pass-only``,
``benchmarks/results/kernels_group_lists_two_pass.json``; 50% random float masks, CUDA-graph replays):

| tokens | 8 groups | 112 groups |
|---:|---:|---:|
| 1024 | 3.20 / 3.52 | 3.52 / 5.96 |
| 2048 | 4.13 / 4.14 | 5.21 / 7.05 |
| 4096 | 6.78 / 4.45 | 8.52 / 8.79 |
| 8192 | 12.37 / 3.88 | 18.13 / 12.35 |
| 16384 | 23.34 / 5.37 | 41.49 / 26.52 |
| 32768 | 45.46 / 7.80 | 81.50 / 62.52 |

(two passes with 4096-element chunk tiles; 8192-element tiles were as fast for 8 groups and slower for 112: 15.85 at
8192 tokens, 32.07 at 16384.) :func:`use_two_pass` takes them from 2048 tokens and at least 64 tokens per group
(``M >= 64 G``): for 8 groups from 2048 tokens (a tie there), for 112 from 7168 (between the measured 4096 and
8192).

Summing the earlier chunks' counts in step 2 costs every chunk's program ``c`` rows, ``num_chunks ** 2 / 2`` in all:
with 112 groups a chunk holds 32 tokens (the tile limit), so at 65536 tokens 2048 chunks made the two passes slower
than the one-kernel build (182.9 against 170.5 µs; 131072 tokens: 594.7 against 340.1). Where that sum grows large
(:func:`use_offsets_pass`) a third launch between the two, ``_chunk_offsets_kernel`` (one program per group, a prefix
sum down its chunk counts), stores each chunk's offsets and step 2 loads its row. H200, µs, two passes / with the
offsets pass (``benchmarks/kernels_group_lists.py --two-pass-only``,
``benchmarks/results/kernels_group_lists_offsets_pass.json``; 4096-element tiles):

| tokens | 112 groups | 8 groups |
|---:|---:|---:|
| 4096 | 8.83 / 9.36 | 3.95 / 4.59 |
| 8192 | 12.47 / 11.64 | 3.93 / 4.74 |
| 16384 | 26.56 / 19.55 | 5.44 / 6.44 |
| 32768 | 62.57 / 30.10 | 7.85 / 8.85 |
| 65536 | 182.88 / 56.39 | 13.14 / 14.46 |
| 131072 | 594.69 / 103.88 | 15.36 / 16.35 |

(the one-kernel build in the same call: 112 groups 8.54 / 17.90 / 41.35 / 81.08 / 170.52 / 340.10 µs.)
"""
from __future__ import annotations

import torch

from ._triton_utils import HAS_TRITON, cdiv, next_pow2

TARGET_CHUNKS = 128  # chunks per call where the chunk size allows
MIN_CHUNK = 16
TILE_ELEMENTS = 4096  # a chunk's [CHUNK, G] tile at most this large (registers)
MIN_TOKENS, TOKENS_PER_GROUP = 2048, 64  # use_two_pass: from this many tokens, and this many per group
COUNT_ROWS = 64  # earlier chunks' counts summed this many at a time
OFFSETS_MIN_SUMMED = 1 << 21  # use_offsets_pass: from this many count entries summed over all lists programs
OFFSETS_BLOCK = 1024  # the offsets pass's step down a group's chunk counts

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _chunk_mask(mask_ptr, c, M, G, stride_t, stride_g, CHUNK: tl.constexpr, G_P2: tl.constexpr):
        """Chunk ``c``'s mask rows as ``(offs_t, offs_g, active, inactive, inside)``: int32 0 / 1 tiles over
        ``[CHUNK, G_P2]`` (tokens past ``M`` and groups past ``G`` are neither active nor inactive)."""
        offs_t = c * CHUNK + tl.arange(0, CHUNK)
        offs_g = tl.arange(0, G_P2)
        inside = (offs_t < M)[:, None] & (offs_g < G)[None, :]
        m = tl.load(mask_ptr + offs_t.to(tl.int64)[:, None] * stride_t + offs_g[None, :] * stride_g, mask=inside,
                    other=0)
        active = ((m != 0) & inside).to(tl.int32)
        inactive = ((m == 0) & inside).to(tl.int32)
        return offs_t, offs_g, active, inactive, inside

    @triton.jit
    def _chunk_counts_kernel(mask_ptr, chunk_counts_ptr, M, G, stride_t, stride_g, CHUNK: tl.constexpr,
                             G_P2: tl.constexpr):
        c = tl.program_id(0)
        _t, offs_g, active, _i, _in = _chunk_mask(mask_ptr, c, M, G, stride_t, stride_g, CHUNK, G_P2)
        tl.store(chunk_counts_ptr + c * G + offs_g, tl.sum(active, 0), mask=offs_g < G)

    @triton.jit
    def _chunk_offsets_kernel(chunk_counts_ptr, offsets_ptr, num_chunks, G, BLOCK: tl.constexpr):
        """The offsets pass (many chunks): per group, the active tokens in the chunks before each chunk (an exclusive
        prefix sum down ``chunk_counts[:, g]``), so the lists pass loads one row instead of summing the earlier ones."""
        g = tl.program_id(0)
        running = tl.sum(tl.zeros((BLOCK,), dtype=tl.int32), 0)
        for start in range(0, num_chunks, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            ok = offs < num_chunks
            n = tl.load(chunk_counts_ptr + offs * G + g, mask=ok, other=0)
            tl.store(offsets_ptr + offs * G + g, running + tl.cumsum(n, 0) - n, mask=ok)
            running += tl.sum(n, 0)

    @triton.jit
    def _chunk_lists_kernel(mask_ptr, chunk_counts_ptr, offsets_ptr, tokens_ptr, counts_ptr, M, G, stride_t, stride_g,
                            num_chunks, CHUNK: tl.constexpr, G_P2: tl.constexpr, ROWS: tl.constexpr,
                            OFFSETS: tl.constexpr):
        c = tl.program_id(0)
        offs_g = tl.arange(0, G_P2)
        g_ok = offs_g < G
        if OFFSETS:  # from the offsets pass
            before = tl.load(offsets_ptr + c * G + offs_g, mask=g_ok, other=0)
        else:  # each group's active tokens in the chunks before this one, summed here
            before = tl.zeros((G_P2,), dtype=tl.int32)
            for r0 in range(0, c, ROWS):
                rows = r0 + tl.arange(0, ROWS)
                before += tl.sum(tl.load(chunk_counts_ptr + rows[:, None] * G + offs_g[None, :],
                                         mask=(rows < c)[:, None] & g_ok[None, :], other=0), 0)
        offs_t, _g, active, inactive, inside = _chunk_mask(mask_ptr, c, M, G, stride_t, stride_g, CHUNK, G_P2)
        if c == num_chunks - 1:  # the last chunk knows the totals
            tl.store(counts_ptr + offs_g, before + tl.sum(active, 0), mask=g_ok)
        pos_a = before[None, :] + tl.cumsum(active, 0) - 1
        pos_i = M - (c * CHUNK - before)[None, :] - tl.cumsum(inactive, 0)
        pos = tl.where(active > 0, pos_a, pos_i)
        tokens = tl.broadcast_to(offs_t[:, None], (CHUNK, G_P2))
        tl.store(tokens_ptr + offs_g.to(tl.int64)[None, :] * M + pos, tokens, mask=inside)


def use_two_pass(num_tokens: int, num_groups: int) -> bool:
    """Whether the two-pass build is the faster one (see the table above)."""
    return num_tokens >= MIN_TOKENS and num_tokens >= TOKENS_PER_GROUP * num_groups


def chunk_size(num_tokens: int, num_groups: int, tile_elements: int = TILE_ELEMENTS) -> int:
    """Tokens per chunk: a power of two giving about ``TARGET_CHUNKS`` chunks, at least ``MIN_CHUNK``, with the chunk's
    ``[CHUNK, next_pow2(G)]`` tile at most ``tile_elements``."""
    cap = max(MIN_CHUNK, tile_elements // next_pow2(num_groups))
    return min(cap, max(MIN_CHUNK, next_pow2(cdiv(num_tokens, TARGET_CHUNKS))))


def use_offsets_pass(num_chunks: int, num_groups: int) -> bool:
    """Whether the lists pass gets its chunks' offsets from a pass of their own (see the table above): summing the
    earlier chunks' counts in every chunk's program reads about ``num_chunks ** 2 / 2`` rows of ``next_pow2(G)``
    counts in all, which the extra launch (about 1 µs) beats from ``OFFSETS_MIN_SUMMED`` of them. With 112 groups
    (32-token chunks) that is from 182 chunks, 5793 tokens, between the measured 128 chunks (slower) and 256 (faster),
    so wherever ``use_two_pass`` takes the two passes for 112 groups (from 7168 tokens); with 8 groups (512-token
    chunks) from 725 chunks, about 371k tokens."""
    return num_chunks * num_chunks * next_pow2(num_groups) // 2 >= OFFSETS_MIN_SUMMED


def pop_two_pass_options(scan: dict) -> dict:
    """The keyword arguments of :func:`group_token_lists_two_pass` (``tile_elements``, ``offsets_pass``) taken out of
    a caller's ``scan`` overrides (the rest are the one-kernel scan's)."""
    return {key: scan.pop(key) for key in ("tile_elements", "offsets_pass") if key in scan}


def group_token_lists_two_pass(m: torch.Tensor, tile_elements: int = TILE_ELEMENTS,
                               offsets_pass: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens[G, M], counts[G])`` of the ``[M, G]`` mask rows ``m`` (nonzero = active; any strides, bool read as
    bytes), in two launches, or three with the offsets pass (CUDA, or the interpreter); ``tile_elements``: see
    :func:`chunk_size`; ``offsets_pass``: force / forbid the offsets pass, else :func:`use_offsets_pass` (benchmarks,
    tests)."""
    if m.dtype == torch.bool:
        m = m.view(torch.uint8)
    num_tokens, num_groups = m.shape
    chunk = chunk_size(num_tokens, num_groups, tile_elements)
    num_chunks = cdiv(num_tokens, chunk)
    g_p2 = next_pow2(num_groups)
    warps = 8 if chunk * g_p2 >= 8192 else 4
    offsets = use_offsets_pass(num_chunks, num_groups) if offsets_pass is None else bool(offsets_pass)
    tokens = torch.empty(num_groups, num_tokens, dtype=torch.int32, device=m.device)
    counts = torch.empty(num_groups, dtype=torch.int32, device=m.device)
    chunk_counts = torch.empty(num_chunks, num_groups, dtype=torch.int32, device=m.device)
    chunk_offsets = torch.empty_like(chunk_counts) if offsets else chunk_counts
    _chunk_counts_kernel[(num_chunks,)](m, chunk_counts, num_tokens, num_groups, *m.stride(), CHUNK=chunk, G_P2=g_p2,
                                        num_warps=warps)
    if offsets:
        _chunk_offsets_kernel[(num_groups,)](chunk_counts, chunk_offsets, num_chunks, num_groups,
                                             BLOCK=min(OFFSETS_BLOCK, next_pow2(num_chunks)), num_warps=4)
    _chunk_lists_kernel[(num_chunks,)](m, chunk_counts, chunk_offsets, tokens, counts, num_tokens, num_groups,
                                       *m.stride(), num_chunks, CHUNK=chunk, G_P2=g_p2, ROWS=COUNT_ROWS,
                                       OFFSETS=offsets, num_warps=warps)
    return tokens, counts


__all__ = ["chunk_size", "group_token_lists_two_pass", "pop_two_pass_options", "use_offsets_pass", "use_two_pass"]
