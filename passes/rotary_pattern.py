"""HF's rotary embedding of the query, found in a Dynamo torch-level graph (``apply_rotary_pos_emb``)::

    x1 = q[..., :D/2];  x2 = q[..., D/2:]
    q_embed = q * cos.unsqueeze(1) + torch.cat((-x2, x1), dim=-1) * sin.unsqueeze(1)   # either order of + and *

:func:`match_rotation` returns ``q``, the tables ``cos`` / ``sin`` (``[B or 1, T, D]`` in ``q``'s dtype) and the
pattern's nodes. Used by ``query_rope_epilogue``.
"""
from __future__ import annotations

import operator

import torch
from torch import fx

from .torch_patterns import arg, example_value, is_mul

_ADD = {operator.add, torch.add}
_NEG = {operator.neg, torch.neg}


def _is_call(node, functions: set, method: str) -> bool:
    if not isinstance(node, fx.Node):
        return False
    return (node.op == "call_function" and node.target in functions) or (node.op == "call_method"
                                                                         and node.target == method)


def _half_slice(node, base: fx.Node, upper: bool, half: int) -> bool:
    """``base[..., half:]`` (``upper``) or ``base[..., :half]``."""
    if not (_is_call(node, {operator.getitem}, "__getitem__") and node.args[0] is base):
        return False
    index = node.args[1]
    if not (isinstance(index, tuple) and len(index) == 2 and index[0] is Ellipsis and isinstance(index[1], slice)):
        return False
    piece = index[1]
    want = (half, None) if upper else (None, half)
    return (piece.start, piece.stop) == want and piece.step in (None, 1)


def _rotated_half_of(cat: fx.Node, half: int) -> fx.Node | None:
    """``q`` of ``torch.cat((-q[..., half:], q[..., :half]), dim=-1)``, or None."""
    if not (isinstance(cat, fx.Node) and cat.op == "call_function" and cat.target is torch.cat):
        return None
    parts = cat.args[0] if cat.args else None
    if arg(cat, 1, "dim", 0) != -1 or not (isinstance(parts, (tuple, list)) and len(parts) == 2):
        return None
    neg, lower = parts
    if not _is_call(neg, _NEG, "neg") or len(neg.args) != 1 or not isinstance(lower, fx.Node):
        return None
    base = lower.args[0] if lower.args else None
    if not (_half_slice(neg.args[0], base, True, half) and _half_slice(lower, base, False, half)):
        return None
    return base


def _table_of(unsqueezed, q_value: torch.Tensor) -> fx.Node | None:
    """``t`` of ``t.unsqueeze(1)`` when ``t`` is a ``[B or 1, T, D]`` table in ``q``'s dtype and device."""
    if not _is_call(unsqueezed, {torch.unsqueeze}, "unsqueeze") or arg(unsqueezed, 1, "dim") != 1:
        return None
    table = unsqueezed.args[0]
    value = example_value(table)
    batch, _, tokens, dim = q_value.shape
    if value is None or value.dtype != q_value.dtype or value.device != q_value.device or value.dim() != 3:
        return None
    return table if value.shape[0] in (1, batch) and tuple(value.shape[1:]) == (tokens, dim) else None


def match_rotation(q_embed) -> tuple[fx.Node, fx.Node, fx.Node, list[fx.Node]] | None:
    """``(q, cos, sin, pattern nodes)`` of HF's query rotation ending at ``q_embed``, or None."""
    if not (_is_call(q_embed, _ADD, "add") and len(q_embed.args) == 2 and not q_embed.kwargs):
        return None
    value = example_value(q_embed)
    if value is None or value.dim() != 4 or value.shape[-1] % 2:
        return None
    half = value.shape[-1] // 2
    products = q_embed.args
    if not all(is_mul(p) for p in products):
        return None
    for with_cos, with_sin in (products, products[::-1]):
        for rot, sin_u in (with_sin.args, with_sin.args[::-1]):
            q = _rotated_half_of(rot, half)
            if q is None or q not in with_cos.args:
                continue
            cos_u = with_cos.args[1] if with_cos.args[0] is q else with_cos.args[0]
            q_value = example_value(q)
            if q_value is None or q_value.dtype != value.dtype or tuple(q_value.shape) != tuple(value.shape):
                return None
            cos, sin = _table_of(cos_u, q_value), _table_of(sin_u, q_value)
            if cos is None or sin is None:
                return None
            neg, lower = rot.args[0]
            return q, cos, sin, [q_embed, with_cos, with_sin, rot, neg, neg.args[0], lower, cos_u, sin_u]
    return None


__all__ = ["match_rotation"]
