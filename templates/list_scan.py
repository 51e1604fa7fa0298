"""Launch shape of the one-program-per-list scans: per-group token lists (``group_plan``) and the attention's row
compaction (``attention_compact``).

Both kernels give each (batch,) group one program that walks the tokens in ``BLOCK``-sized steps with a running
prefix sum; the steps depend on each other, so the program's time is about (steps x one load + scan + store). With
8 groups (one per KV head) only 8 programs run. ``BLOCK`` (a power of two) and ``num_warps`` set how many steps a
sequence takes.
"""
from __future__ import annotations

from ._triton_utils import next_pow2

MAX_BLOCK = 1024  # tokens per step
TOKENS_PER_WARP = 256  # num_warps = BLOCK / this, between 4 and 16


def scan_launch(length: int, max_block: int | None = None, num_warps: int | None = None) -> dict:
    """``BLOCK`` and ``num_warps`` for a scan over ``length`` tokens (``max_block`` / ``num_warps`` override)."""
    cap = MAX_BLOCK if max_block is None else max_block
    if cap < 32 or cap & (cap - 1):
        raise ValueError(f"scan BLOCK must be a power of two >= 32, got {cap}")
    block = min(cap, max(32, next_pow2(length)))
    warps = max(4, min(16, block // TOKENS_PER_WARP)) if num_warps is None else num_warps
    return {"BLOCK": block, "num_warps": warps}


__all__ = ["MAX_BLOCK", "scan_launch"]
