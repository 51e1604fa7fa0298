"""Attention cores with head-group skipping: ``scaled_dot_product_attention`` -> ``wide::group_attention``.

Runs for an attention whose query projection was lowered (``attention_lowering``): the dataflow analysis then gives
the layout of the query at the core, ``[batch, heads, tokens, head_dim]`` with head ``h`` = query features
``[h*D, (h+1)*D)``, and has checked that each head of the core's output reaches the masked value ``gm(attn, m, gs)``
at its own token and group. ``wide::group_attention(q, k, v, m, is_causal, scale)`` computes SDPA for the active
(token, group) pairs and zeros for the others, which ``gm`` zeroes anyway: the block's output is unchanged, and the
Triton templates skip the K/V reads of inactive groups (decode) and their FLOPs (prefill).

Lowered only when the templates compute exactly what SDPA does: no ``attn_mask`` or a boolean one (HF's padding /
packed-sequence / static-KV-cache masks; the templates read it and skip key blocks no row may see; additive float
masks stay on SDPA), no dropout, ``is_causal`` with as many queries as keys (SDPA aligns a causal mask top-left, the
templates bottom-right; they agree when ``T == S``) or not causal, k and v of one shape, a constant or graph-valued
scale. Eager ``softmax(QK^T)V`` cores stay as they are. Each refusal is reported with its reason.
"""

from __future__ import annotations

import torch
from torch import fx

import wide_compile.group_attention_op  # noqa: F401  (registers wide::group_attention)
from wide_compile.group_attention_op import token_major

from .group_locality import SDPA, AxisMap, Terminal, op_name, same_size
from .torch_patterns import arg, example_value

# SDPA(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def _sdpa_args(core: fx.Node) -> dict:
    defaults = dict(attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)
    return {name: arg(core, i, name, defaults.get(name)) for i, name in enumerate(_SDPA_ARGS)}


def _why_not(core: fx.Node, terminal: Terminal, flows: dict, skip: set[fx.Node]) -> str | None:
    if op_name(core) != SDPA:
        return "an eager softmax(QK^T)V core (only scaled_dot_product_attention is lowered)"
    if core in skip:
        return "inside an autocast region"
    a = _sdpa_args(core)
    if a["attn_mask"] is not None:
        mask = example_value(a["attn_mask"])
        if mask is None or mask.dtype != torch.bool:
            return "SDPA has an additive (non-boolean) attn_mask"
        if not 2 <= mask.dim() <= 4 or a["is_causal"] is not False:
            return "SDPA's attn_mask is not a [B, H, T, S]-broadcastable boolean mask without is_causal"
    if not (isinstance(a["dropout_p"], (int, float)) and a["dropout_p"] == 0):
        return "SDPA has dropout"
    if not isinstance(a["is_causal"], bool) or not isinstance(a["enable_gqa"], bool):
        return "is_causal / enable_gqa are not constants"
    if not (a["scale"] is None or isinstance(a["scale"], (int, float, fx.Node))):
        return f"unsupported scale {a['scale']!r}"
    q, k, v = (example_value(a[n]) for n in ("query", "key", "value"))
    if q is None or k is None or v is None or q.dim() != 4 or k.dim() != 4:
        return "query / key / value are not known 4-D tensors"
    if q.dtype != k.dtype or q.dtype != v.dtype or tuple(k.shape) != tuple(v.shape):
        return "query, key and value differ in dtype, or key and value in shape"
    if k.shape[1] != q.shape[1] and not a["enable_gqa"]:
        return "key/value heads differ from query heads without enable_gqa"
    if a["is_causal"] and not same_size(q.shape[2], k.shape[2]):
        return "causal with fewer queries than keys (SDPA aligns the causal mask top-left, the kernels bottom-right)"
    head_dim = q.shape[-1]
    if not isinstance(head_dim, int) or terminal.group_size % head_dim:
        return "head_dim is not a constant that divides the group size"
    flow = flows.get(a["query"])
    expected = (AxisMap(0), AxisMap(2), AxisMap(1, 1, head_dim))
    sizes = (q.shape[0], q.shape[2], None)  # a size-1 batch / token axis cannot be misplaced (decode at batch 1)
    if flow is None or len(flow.maps) != 3 or any(
            m != e for m, e, n in zip(flow.maps, expected, sizes) if n is None or not same_size(n, 1)):
        return "the query at the core is not [batch, heads, tokens, head_dim] with heads in feature order"
    return None


def _call_name(node) -> str:
    if not isinstance(node, fx.Node) or node.op not in ("call_method", "call_function"):
        return ""
    return node.target if node.op == "call_method" else getattr(node.target, "__name__", "")


def _single_head_axis_insert(node: fx.Node) -> fx.Node | None:
    """``src`` when ``node`` is ``src[:, :, None]`` (getitem with a None at axis 2 and full slices) or
    ``src.unsqueeze(2)``."""
    name = _call_name(node)
    if name == "unsqueeze" and len(node.args) > 1 and node.args[1] == 2:
        return node.args[0]
    if name == "getitem" and len(node.args) == 2 and isinstance(node.args[1], tuple):
        index = node.args[1]
        full = [i for i in index if i is not Ellipsis]
        if len(full) >= 3 and full[2] is None and all(i == slice(None) for i in full[:2] + full[3:]):
            return node.args[0]
    return None


def kv_before_head_repeat(node: fx.Node) -> fx.Node | None:
    """The ``[B, Hkv, S, D]`` source of a K/V tensor that was repeated to ``[B, Hkv * r, S, D]`` by
    ``src[:, :, None].expand(B, Hkv, r, S, D).reshape(B, Hkv * r, S, D)`` (HF's ``repeat_kv``, used with an explicit
    SDPA mask), else None. Output head ``h`` of that chain is source head ``h // r``: GQA's grouping, which
    ``wide::group_attention`` applies itself, so the repeated copy never has to be made."""
    while _call_name(node) == "contiguous":
        node = node.args[0]
    if _call_name(node) not in ("reshape", "view", "_unsafe_view"):
        return None
    expand = node.args[0]
    if _call_name(expand) != "expand":
        return None
    src = _single_head_axis_insert(expand.args[0])
    out, mid, val = example_value(node), example_value(expand), example_value(src) if src is not None else None
    if out is None or mid is None or val is None or out.dim() != 4 or mid.dim() != 5 or val.dim() != 4:
        return None
    b, hkv, s, d = val.shape
    rep = mid.shape[2]
    expected_mid, expected_out = (b, hkv, rep, s, d), (b, hkv * rep, s, d)
    if not all(same_size(x, y) for x, y in zip(mid.shape, expected_mid)) or \
            not all(same_size(x, y) for x, y in zip(out.shape, expected_out)):
        return None
    return src


def lower_attention_core(graph: fx.Graph, core: fx.Node, terminal: Terminal, flows: dict,
                         skip: set[fx.Node]) -> str | None:
    """Replace ``core`` by ``wide::group_attention`` with ``terminal``'s mask; returns why not, or None when done.

    ``flows`` is the dataflow analysis of the (lowered) query projection that reaches ``terminal`` through ``core``.
    """
    why = _why_not(core, terminal, flows, skip)
    if why is not None:
        return why
    a = _sdpa_args(core)
    key, value = a["key"], a["value"]
    k_src, v_src = kv_before_head_repeat(key), kv_before_head_repeat(value)
    if k_src is not None and v_src is not None and \
            tuple(example_value(k_src).shape) == tuple(example_value(v_src).shape):
        key, value = k_src, v_src  # GQA in the kernel: no repeated K/V copy (it would be read in full every step)
    with graph.inserting_before(core):
        new = graph.call_function(torch.ops.wide.group_attention.default,
                                  (a["query"], key, value, terminal.mask, a["is_causal"], a["scale"], a["attn_mask"]))
    new.meta = dict(core.meta)
    for key in ("example_value", "val"):  # the op's output layout (token_major), not SDPA's
        if isinstance(new.meta.get(key), torch.Tensor):
            new.meta[key] = token_major(new.meta[key])
    core.replace_all_uses_with(new)
    graph.erase_node(core)
    return None


__all__ = ["lower_attention_core"]
