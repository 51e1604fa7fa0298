"""``FOLD``: the output-group GEMMs (``gemm_gated_up``, ``gemm_output_groups``) with two token tiles per program.

Without it the grid has one program per (token tile, n tile): ``cdiv(M, BLOCK_M)`` token tiles for every group,
since a launch cannot know how many of a group's tokens are active. At 50% about half of those programs find a
fully inactive tile and only store zeros, yet each holds a whole SM's worth of shared memory while it waits for its
list load and its stores, one after another.

With ``FOLD`` program ``j`` of an n tile takes token tile ``a`` and its mirror ``num_m - 1 - a``. A group's active
tokens come first in its list, so the mirror is the zero-only one whenever ``a`` is active and at most half the tiles
are: its zeros are stored before ``a``'s K loop starts and overlap it, and the grid has half the programs. Below 50%
sparsity some programs run two K loops (as a persistent kernel would); programs start from the middle tiles
(``a = cdiv(num_m, 2) - 1`` first), so those pairs, the longest, come first.
"""
from __future__ import annotations

from ._triton_utils import HAS_TRITON, cdiv

if HAS_TRITON:
    import triton
    import triton.language as tl

    from ._triton_utils import swizzle_n_major

    @triton.jit
    def folded_tile_pair(M, N, GROUP_SIZE: tl.constexpr, TILES_PER_GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                         GROUP_N: tl.constexpr):
        """This program's ``(pid_a, pid_b, pid_n)``: token tile ``pid_a``, its mirror ``pid_b`` (``== pid_a`` for
        the middle tile of an odd count) and the n tile; GROUP_N n tiles side by side as ``swizzle_n_major``."""
        num_m = tl.cdiv(M, BLOCK_M)
        num_half = (num_m + 1) // 2
        num_n = (N // GROUP_SIZE) * TILES_PER_GROUP
        j, pid_n = swizzle_n_major(tl.program_id(0), num_half, num_n, GROUP_N)
        pid_a = num_half - 1 - j
        return pid_a, num_m - 1 - pid_a, pid_n


def fold_flag(cfg: dict) -> bool:
    """The checked ``FOLD`` config value (default off). It sets the program order itself, so ``ACTIVE_FIRST`` has no
    effect with it."""
    value = cfg.get("FOLD", False)
    if not isinstance(value, bool):
        raise ValueError(f"FOLD must be True or False, got {value!r}")
    return value


def token_tile_programs(num_tokens: int, block_m: int, fold: bool) -> int:
    """Programs per n tile: one per token tile, or with ``FOLD`` one per pair of mirrored token tiles."""
    tiles = cdiv(num_tokens, block_m)
    return cdiv(tiles, 2) if fold else tiles


__all__ = ["fold_flag", "token_tile_programs"] + (["folded_tile_pair"] if HAS_TRITON else [])
