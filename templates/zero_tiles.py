"""Who writes an output-group GEMM's fully inactive tiles (``ZERO_TILES``; ``gemm_gated_up``, ``gemm_output_groups``).

A group's reordered token list ends in tiles whose tokens all skip the group: their outputs are zeros. With
``"own"`` (the default) each such tile's program stores them. Every program of these kernels reserves the GEMM's
shared memory (up to 196 KB: one program per SM), so a zero-only program holds an SM for its whole short life,
about half the programs at 50% sparsity. With ``"fused"`` the group's active programs store them after their own tile
(program ``t`` of ``n`` active ones takes the inactive tiles ``n + t``, ``2n + t``, ...), where the stores drain while
the SM moves on, and the zero-only programs exit at once; a group with no active token keeps ``"own"``.
Not yet timed on the GPU (stop 18 wrote it with no device time left).
"""
from __future__ import annotations

from ._triton_utils import HAS_TRITON

ZERO_TILES = ("own", "fused")


def zero_tiles_fused(value) -> bool:
    """The checked ``ZERO_TILES`` config value as the kernels' ``FUSED_ZEROS`` flag."""
    if value not in ZERO_TILES:
        raise ValueError(f"ZERO_TILES must be one of {ZERO_TILES}, got {value!r}")
    return value == "fused"


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def stores_own_zeros(count, FUSED_ZEROS: tl.constexpr):
        """Whether a zero-only program stores its own tile: always with ``"own"``, with ``"fused"`` only when its
        group has no active program to do it."""
        if FUSED_ZEROS:
            own = count == 0
        else:
            own = True  # a constant: the default path compiles to the unconditional store it had before
        return own

    @triton.jit
    def store_zero_tiles(out_ptr, tokens_ptr, tile_start, count, offs_n, valid_n, M, N, GROUP_SIZE: tl.constexpr,
                         BLOCK_M: tl.constexpr):
        """An active program's share of its group's inactive tiles (``"fused"``; ``count >= 1``): zeros for list
        tiles ``n_act + t``, ``n_act + t + n_act``, ... of the output columns ``offs_n``."""
        g = tl.min(offs_n, 0) // GROUP_SIZE
        n_act = tl.cdiv(count, BLOCK_M)
        zeros = tl.zeros((BLOCK_M, offs_n.shape[0]), dtype=out_ptr.dtype.element_ty)
        for tile in range(n_act + tile_start // BLOCK_M, tl.cdiv(M, BLOCK_M), n_act):
            offs = tile * BLOCK_M + tl.arange(0, BLOCK_M)
            inside = offs < M
            rows = tl.load(tokens_ptr + g.to(tl.int64) * M + offs, mask=inside, other=0).to(tl.int64)
            tl.store(out_ptr + rows[:, None] * N + offs_n[None, :], zeros, mask=inside[:, None] & valid_n[None, :])


__all__ = ["ZERO_TILES", "store_zero_tiles", "stores_own_zeros", "zero_tiles_fused"]
