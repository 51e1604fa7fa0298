"""Launch shape of the one-program-per-list scans: per-group token lists (``group_plan``) and the attention's row
compaction (``attention_compact``).

Both kernels give each (batch,) group one program that walks the tokens in ``BLOCK``-sized steps with a running
prefix sum; the steps depend on each other, so the program's time is about (steps x one load + scan + store). With
8 groups (one per KV head) only 8 programs run. ``BLOCK`` (a power of two) and ``num_warps`` set how many steps a
sequence takes.

Defaults from ``benchmarks/kernels_group_lists.py`` (H200, µs per call, 50% random masks; previous default: steps of
1024 tokens, 4 warps -> steps of up to 4096 tokens, 8 warps; ``results/kernels_group_lists.json``):

| tokens | lists, 112 groups | lists, 8 groups | compaction, 8 groups |
|---:|---:|---:|---:|
| 1024 | 3.63 -> 3.53 | 3.08 -> 2.73 | 2.42 -> 2.42 |
| 4096 | 10.06 -> 8.48 | 7.84 -> 6.83 | 5.43 -> 4.94 |
| 16384 | 43.59 -> 41.48 | 27.65 -> 23.61 | 17.41 -> 11.09 |

(16 warps were faster for the 112-group lists at 16384 tokens, 31.1 µs, and slower for the compaction, 13.3.)
Since stop 34 the token lists of long prompts come from ``group_lists_two_pass`` instead (chunks of tokens in
parallel, 5.4 µs for 8 groups and 26.5 for 112 at 16384 tokens); the compaction still scans here.
"""
from __future__ import annotations

from ._triton_utils import next_pow2

MAX_BLOCK = 4096  # tokens per step
WARPS = 8  # from 1024-token steps up; 4 below


def scan_launch(length: int, max_block: int | None = None, num_warps: int | None = None) -> dict:
    """``BLOCK`` and ``num_warps`` for a scan over ``length`` tokens (``max_block`` / ``num_warps`` override)."""
    cap = MAX_BLOCK if max_block is None else max_block
    if cap < 32 or cap & (cap - 1):
        raise ValueError(f"scan BLOCK must be a power of two >= 32, got {cap}")
    block = min(cap, max(32, next_pow2(length)))
    warps = (WARPS if block >= 1024 else 4) if num_warps is None else num_warps
    return {"BLOCK": block, "num_warps": warps}


__all__ = ["MAX_BLOCK", "scan_launch"]
