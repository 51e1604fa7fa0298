"""Per-group token lists of a long prompt in two parallel passes over token chunks (``group_plan``'s "output" tables).

``group_plan``'s one-kernel build gives each group one program that walks all ``M`` tokens with a running prefix
sum, so at 16384 tokens a program makes several dependent steps and only ``G`` programs run (8 for the query
projection's groups): 23.6 µs for 8 groups, 41.5 for 112 on the H200 (``list_scan.py``). Here the work is spread
over token chunks instead, every chunk handling all groups:

1. ``_chunk_counts_kernel``: per chunk, each group's active-token count (one coalesced load of the chunk's mask rows);
2. ``_chunk_lists_kernel``: per chunk, each group's active tokens before the chunk (a sum over the earlier chunks'
   counts), then prefix sums down the chunk give every (token, group) its list position, stored at once; the last
   chunk also stores the totals.

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
"""
from __future__ import annotations

import torch

from ._triton_utils import HAS_TRITON, cdiv, next_pow2

TARGET_CHUNKS = 128  # chunks per call where the chunk size allows
MIN_CHUNK = 16
TILE_ELEMENTS = 4096  # a chunk's [CHUNK, G] tile at most this large (registers)
MIN_TOKENS, TOKENS_PER_GROUP = 2048, 64  # use_two_pass: from this many tokens, and this many per group
COUNT_ROWS = 64  # earlier chunks' counts summed this many at a time

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
    def _chunk_lists_kernel(mask_ptr, chunk_counts_ptr, tokens_ptr, counts_ptr, M, G, stride_t, stride_g, num_chunks,
                            CHUNK: tl.constexpr, G_P2: tl.constexpr, ROWS: tl.constexpr):
        c = tl.program_id(0)
        offs_g = tl.arange(0, G_P2)
        g_ok = offs_g < G
        before = tl.zeros((G_P2,), dtype=tl.int32)  # each group's active tokens in the chunks before this one
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


def group_token_lists_two_pass(m: torch.Tensor,
                               tile_elements: int = TILE_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens[G, M], counts[G])`` of the ``[M, G]`` mask rows ``m`` (nonzero = active; any strides, bool read as
    bytes), in two launches (CUDA, or the interpreter); ``tile_elements``: see :func:`chunk_size` (benchmarks)."""
    if m.dtype == torch.bool:
        m = m.view(torch.uint8)
    num_tokens, num_groups = m.shape
    chunk = chunk_size(num_tokens, num_groups, tile_elements)
    num_chunks = cdiv(num_tokens, chunk)
    g_p2 = next_pow2(num_groups)
    warps = 8 if chunk * g_p2 >= 8192 else 4
    tokens = torch.empty(num_groups, num_tokens, dtype=torch.int32, device=m.device)
    counts = torch.empty(num_groups, dtype=torch.int32, device=m.device)
    chunk_counts = torch.empty(num_chunks, num_groups, dtype=torch.int32, device=m.device)
    _chunk_counts_kernel[(num_chunks,)](m, chunk_counts, num_tokens, num_groups, *m.stride(), CHUNK=chunk, G_P2=g_p2,
                                        num_warps=warps)
    _chunk_lists_kernel[(num_chunks,)](m, chunk_counts, tokens, counts, num_tokens, num_groups, *m.stride(),
                                       num_chunks, CHUNK=chunk, G_P2=g_p2, ROWS=COUNT_ROWS, num_warps=warps)
    return tokens, counts


__all__ = ["chunk_size", "group_token_lists_two_pass", "use_two_pass"]
