"""``TAIL_SPLIT``: how finely the output-group GEMMs (``gemm_gated_up``, ``gemm_output_groups``) shrink a group's last,
partly active token tile.

A group's reordered token list ends in a tile whose active rows (a prefix) may be far fewer than the tile's
``BLOCK_M``. With ``TAIL_SPLIT = 2`` such a tile runs its K loop on ``BLOCK_M // 2`` rows when the active ones fit
there; with ``4`` also on ``BLOCK_M // 4`` rows (at least 16, ``tl.dot``'s minimum); ``1`` keeps whole tiles. Each
size is its own copy of the K loop in the compiled kernel. The rest of the tile is stored as zeros.
"""
from __future__ import annotations

TAIL_SPLITS = (1, 2, 4)


def tail_split(value) -> int:
    """The checked ``TAIL_SPLIT`` config value (``True`` / ``False`` read as 2 / 1)."""
    if isinstance(value, bool):
        return 2 if value else 1
    if value not in TAIL_SPLITS:
        raise ValueError(f"TAIL_SPLIT must be one of {TAIL_SPLITS}, got {value!r}")
    return int(value)


__all__ = ["TAIL_SPLITS", "tail_split"]
