"""The row order of a head-group mask: each (sequence, group)'s tokens, active first (no Triton needed here).

For ``head_mask[B, T, G]`` (nonzero = active): int32 ``order[B, G, T]`` lists the token indices of each (sequence,
group) with the active tokens first in ascending order, then the inactive ones in descending order; int32
``count[B, G]`` counts the active ones. The prefill attention walks its tiles in this order
(``attention_compact.compact_active_rows``, one Triton scan) and, for one sequence, it equals the per-group token lists
of the output-group GEMMs (``group_plan``), so one computation can serve both (``wide::group_rows``).
"""
from __future__ import annotations

import torch

__all__ = ["check_row_order", "compact_active_rows_reference", "row_order_args"]


def check_row_order(op: str, row_order: tuple[torch.Tensor, torch.Tensor], head_mask: torch.Tensor) -> None:
    """A precomputed ``(order, count)`` (``wide::group_rows``) must be int32 ``[B, G, T]`` / ``[B, G]`` of ``head_mask
    [B, T, G]``'s shape and device; the values are trusted (computed from the same mask)."""
    batch, tokens, groups = head_mask.shape
    for name, t, shape in (("order", row_order[0], (batch, groups, tokens)), ("count", row_order[1], (batch, groups))):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or tuple(t.shape) != shape:
            got = f"{getattr(t, 'dtype', None)} {tuple(getattr(t, 'shape', ()))}"
            raise ValueError(f"{op}: row {name} must be int32 of shape {shape} for a mask of shape "
                             f"{tuple(head_mask.shape)}, got {got}")
        if t.device != head_mask.device or not t.is_contiguous():
            raise ValueError(f"{op}: row {name} must be contiguous on {head_mask.device}")


def row_order_args(op: str, mask: torch.Tensor, order: torch.Tensor | None, count: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """An op's optional ``row_order`` / ``row_count`` arguments: both checked against ``mask[B, T, G]``, or None when
    neither is given."""
    if order is None and count is None:
        return None
    if order is None or count is None:
        raise ValueError(f"{op}: pass both row_order and row_count (wide::group_rows), or neither")
    if mask.dim() != 3:
        raise ValueError(f"{op}: a row order needs a mask of shape [B, T, G], got {tuple(mask.shape)}")
    check_row_order(op, (order, count), mask)
    return order, count


def compact_active_rows_reference(head_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch version: active tokens ascending, then inactive tokens descending; and the active counts."""
    active = (head_mask != 0).transpose(1, 2)  # [B, G, T]
    q_len = active.shape[-1]
    t = torch.arange(q_len, device=head_mask.device).expand_as(active)
    key = torch.where(active, t, 2 * q_len - t)  # actives sort first (ascending), inactives after (descending)
    order = torch.sort(key, dim=-1).indices.to(torch.int32).contiguous()  # [B, G, T] in memory, as the kernel
    return order, active.sum(dim=-1, dtype=torch.int32)
