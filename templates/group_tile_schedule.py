"""Which tile a persistent program of an output-group GEMM takes next.

The non-persistent templates launch one program per (token tile, output tile) and let the fully inactive ones store
zeros and exit. A persistent kernel instead walks two lists with a fixed number of programs: the *active* tiles
(token tiles of group ``g`` before ``cdiv(count_g, BLOCK_M)``, each with ``TILES_PER_GROUP`` output tiles), then the
*inactive* ones (the rest, zeros only). Tile ``t`` of a list is found from the per-group tile counts in registers: a
prefix sum over the groups and one comparison per group (``BLOCK_G`` >= number of groups), so no host-side count and
no extra launch. Active tiles are numbered group-major, so programs running side by side share a weight tile in L2.
"""
from __future__ import annotations

from ._triton_utils import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def group_tile_table(counts_ptr, M, NUM_GROUPS, BLOCK_M: tl.constexpr, TILES_PER_GROUP: tl.constexpr,
                         BLOCK_G: tl.constexpr, ACTIVE: tl.constexpr):
        """Per group (``[BLOCK_G]`` vectors): its active token count, its tiles in the chosen list (``ACTIVE``: the
        active ones, else the inactive ones) and the running end of that list; plus the list's length."""
        offs_g = tl.arange(0, BLOCK_G)
        counts = tl.load(counts_ptr + offs_g, mask=offs_g < NUM_GROUPS, other=0)
        active_m = tl.cdiv(counts, BLOCK_M)
        if ACTIVE:
            tiles = active_m * TILES_PER_GROUP
        else:
            tiles = tl.where(offs_g < NUM_GROUPS, tl.cdiv(M, BLOCK_M) - active_m, 0) * TILES_PER_GROUP
        ends = tl.cumsum(tiles, 0)
        return counts, tiles, ends, tl.sum(tiles, 0)

    @triton.jit
    def group_tile_at(t, counts, tiles, ends, M, BLOCK_M: tl.constexpr, TILES_PER_GROUP: tl.constexpr,
                      BLOCK_G: tl.constexpr, ACTIVE: tl.constexpr):
        """Tile ``t`` of the list: ``(group, token tile, output tile within the group, the group's count)``."""
        offs_g = tl.arange(0, BLOCK_G)
        g = tl.sum((ends <= t).to(tl.int32), 0)
        pick = offs_g == g
        local = t - tl.sum(tl.where(pick, ends - tiles, 0), 0)
        count = tl.sum(tl.where(pick, counts, 0), 0)
        m_tile = local // TILES_PER_GROUP
        if not ACTIVE:
            m_tile += tl.cdiv(count, BLOCK_M)
        return g, m_tile, local % TILES_PER_GROUP, count


__all__ = ["group_tile_table", "group_tile_at"]
