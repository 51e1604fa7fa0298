"""``wide::group_rows``: each (sequence, group)'s tokens with the active ones first, computed once per routed attention.

``wide::group_rows(mask) -> (order, count)`` for a head-group mask ``[B, T, G]`` (nonzero = active): int32
``order[B, G, T]`` lists each (sequence, group)'s token indices with the active tokens first in ascending order and
the inactive ones after them in descending order, and int32 ``count[B, G]`` the active tokens. It is the row order
the prefill attention's tiles walk (``templates/row_order.py``, ``templates/attention_compact.py``) and, for one
sequence, exactly the per-group token lists the query projection's GEMM walks (``templates/group_plan.py``). ``passes/row_order_sharing.py`` computes
it once per attention and passes it to both ops (the issue's "ordering computed once and shared by the paired ops").

On CUDA the Triton scan (one launch); elsewhere the PyTorch reference. No gradient: integers out.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _check(mask: Tensor) -> None:
    if mask.dim() != 3:
        raise ValueError(f"group_rows: mask must be [batch, tokens, groups], got shape {tuple(mask.shape)}")


@torch.library.custom_op("wide::group_rows", mutates_args=())
def group_rows(mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(order[B, G, T], count[B, G])``, int32 (see the module docstring)."""
    _check(mask)
    from wide_compile.templates.row_order import compact_active_rows_reference

    return compact_active_rows_reference(mask)


@group_rows.register_kernel("cuda")
def _(mask):
    _check(mask)
    from wide_compile.templates.attention_compact import compact_active_rows

    return compact_active_rows(mask)


@group_rows.register_fake
def _(mask):
    _check(mask)
    batch, tokens, groups = mask.shape
    return (mask.new_empty((batch, groups, tokens), dtype=torch.int32),
            mask.new_empty((batch, groups), dtype=torch.int32))


__all__ = ["group_rows"]
