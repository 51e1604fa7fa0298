"""One ``wide::attn_mask_extents`` per attention mask, shared by every lowered attention core that uses the mask.

The prefill attention template derives the row extents of an explicit boolean mask (first / last visible key of
each query row: ``templates/attention_mask_extents.py``) before its main loop, one launch that reads the whole mask.
In a transformers model every layer attends with the same mask (a static cache's causal mask over its slots), so
after ``attention_core_lowering`` this pass computes the extents once, just before the first core that uses the
mask, and passes them to each (``wide::group_attention(..., attn_mask_extents=...)``): one launch per forward
instead of one per layer (32 for Llama-3-8B).

Left alone: cores without an explicit mask, masks broadcast over keys (the extents are taken over the mask's own key
axis), and graphs whose example query length is at most ``MAX_DECODE_TOKENS`` (the decode kernel reads the mask
itself and has no use for extents).
"""
from __future__ import annotations

import torch
from torch import fx

import wide_compile.group_attention_op  # noqa: F401  (registers wide::group_attention)
import wide_compile.mask_extents_op  # noqa: F401  (registers wide::attn_mask_extents)
from wide_compile.templates.attention import MAX_DECODE_TOKENS

from .group_flow import same_size
from .torch_patterns import example_value

_ARGS = ("q", "k", "v", "mask", "is_causal", "scale", "attn_mask", "attn_mask_extents", "row_order",
         "row_count")  # wide::group_attention
_DEFAULTS = {"scale": None, "attn_mask": None, "attn_mask_extents": None, "row_order": None, "row_count": None}


def _args(core: fx.Node) -> dict:
    return {**_DEFAULTS, **dict(zip(_ARGS, core.args)), **core.kwargs}


def _shares(core: fx.Node) -> fx.Node | None:
    """The mask node of a core that may take shared extents, or None."""
    a = _args(core)
    mask = a["attn_mask"]
    if not isinstance(mask, fx.Node) or a["attn_mask_extents"] is not None:
        return None
    m, q, k = example_value(mask), example_value(a["q"]), example_value(a["k"])
    if m is None or q is None or k is None or not 2 <= m.dim() <= 4:
        return None
    if isinstance(q.shape[2], int) and q.shape[2] <= MAX_DECODE_TOKENS:
        return None
    if not same_size(m.shape[-1], k.shape[2]):  # broadcast over keys, or another length
        return None
    return mask


def share_mask_extents(graph: fx.Graph) -> int:
    """Insert one ``wide::attn_mask_extents`` per explicit mask of the lowered attention cores; returns how many."""
    users: dict[fx.Node, list[fx.Node]] = {}
    for node in graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.wide.group_attention.default:
            mask = _shares(node)
            if mask is not None:
                users.setdefault(mask, []).append(node)
    for mask, cores in users.items():
        value = example_value(mask)
        with graph.inserting_before(cores[0]):
            kv_len = value.shape[-1]
            if not isinstance(kv_len, int):
                kv_len = graph.call_function(torch.ops.aten.sym_size.int, (mask, value.dim() - 1))
            extents = graph.call_function(torch.ops.wide.attn_mask_extents.default, (mask, kv_len))
        for core in cores:
            a = _args(core)
            a["attn_mask_extents"] = extents
            core.args, core.kwargs = tuple(a[name] for name in _ARGS), {}
    return len(users)


__all__ = ["share_mask_extents"]
