"""Per-(batch, group) compaction of active query rows: the row order the prefill kernel's tiles walk.

``order[b, g, :]`` lists the original token indices with the group's **active** tokens first, in ascending position
order, followed by the inactive ones (in descending order; the prefill kernel only writes zeros through those).
``count[b, g]`` is the number of active tokens. One Triton program per (batch, group) scans the mask once with a
running prefix sum, so the whole step is a single launch (the PyTorch version below takes about ten).

One long sequence (from ``TWO_PASS_MIN_TOKENS`` tokens) takes the chunked two-pass build of the prefill GEMMs' token
lists instead (``group_lists_two_pass``), whose lists for one sequence are this order entry for entry: one program
per group walks all the tokens one step after another, the two passes spread them over token chunks. H200, 8 groups,
one sequence, µs, one program per group / two passes (``benchmarks/kernels_group_lists.py --two-pass-only``,
``benchmarks/results/kernels_group_lists_two_pass_compact.json``): 1024 tokens 2.70 / 3.31, 2048 2.90 / 3.71, 4096
3.90 / 3.87, 8192 6.24 / 3.91, 16384 10.98 / 5.44, 32768 20.68 / 7.88. (This scan is faster than the GEMM lists'
one-kernel build below 4096 tokens, so the switch comes later than there.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .group_lists_two_pass import group_token_lists_two_pass, pop_two_pass_options, use_two_pass
from .list_scan import scan_launch
from .row_order import check_row_order, compact_active_rows_reference

__all__ = ["check_row_order", "compact_active_rows", "compact_active_rows_reference"]

TWO_PASS_MIN_TOKENS = 4096  # one sequence from this many tokens: the two-pass build (see the table above)


@triton.jit
def _compact_kernel(
    MASK, ORDER, COUNT, stride_mb, stride_mt, stride_mg, num_groups, q_len, BLOCK: tl.constexpr,
):
    bg = tl.program_id(0)
    b = bg // num_groups
    g = bg % num_groups
    mask_base = MASK + b.to(tl.int64) * stride_mb + g * stride_mg
    order_base = ORDER + bg.to(tl.int64) * q_len
    n_active = tl.sum(tl.zeros([BLOCK], dtype=tl.int32), 0)  # scalar running count of active tokens
    for start in range(0, q_len, BLOCK):
        t = start + tl.arange(0, BLOCK)
        in_range = t < q_len
        flag = (tl.load(mask_base + t * stride_mt, mask=in_range, other=0) != 0) & in_range
        f = flag.to(tl.int32)
        active_before = n_active + tl.cumsum(f, 0) - f  # active tokens before t
        dest = tl.where(flag, active_before, q_len - 1 - (t - active_before))
        tl.store(order_base + dest, t, mask=in_range)
        n_active += tl.sum(f, 0)
    tl.store(COUNT + bg, n_active)


def compact_active_rows(head_mask: torch.Tensor, scan: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(order[B, G, T] int32, count[B, G] int32)`` for ``head_mask[B, T, G]`` (nonzero = active).

    ``scan``: ``{"max_block": ..., "num_warps": ...}`` overrides of :func:`list_scan.scan_launch`, or
    ``{"two_pass": bool, "tile_elements": int, "offsets_pass": bool}`` to force / forbid the two-pass build of one
    sequence and its offsets pass (benchmarks, tests); by default it runs for one sequence of at least
    ``TWO_PASS_MIN_TOKENS`` tokens (and, as for the GEMM lists, ``use_two_pass``: at least 64 per group)."""
    batch, q_len, groups = head_mask.shape
    mask = head_mask.view(torch.uint8) if head_mask.dtype == torch.bool else head_mask
    scan = dict(scan or {})
    two_pass_options = pop_two_pass_options(scan)
    if scan.pop("two_pass", batch == 1 and q_len >= TWO_PASS_MIN_TOKENS and use_two_pass(q_len, groups)):
        if batch != 1:
            raise ValueError(f"compact_active_rows: the two-pass build orders one sequence, got a batch of {batch}")
        order, count = group_token_lists_two_pass(mask[0], **two_pass_options)
        return order.unsqueeze(0), count.unsqueeze(0)
    order = torch.empty((batch, groups, q_len), dtype=torch.int32, device=head_mask.device)
    count = torch.empty((batch, groups), dtype=torch.int32, device=head_mask.device)
    _compact_kernel[(batch * groups,)](
        mask, order, count, mask.stride(0), mask.stride(1), mask.stride(2), groups, q_len,
        **scan_launch(q_len, **scan),
    )
    return order, count
