"""Find self-attention blocks by dataflow: core (SDPA or softmax(QK^T)V), q/k/v/o projections, heads."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch import fx

from .errors import DiscoveryError
from .graph_utils import LAYOUT_OPS, bfs, shape, tensor_inputs, tensor_users
from .projections import Projection

aten = torch.ops.aten

_SOFTMAX = {aten.softmax.int, aten._softmax.default, aten._safe_softmax.default}
_PASS_THROUGH = {aten.to.dtype, aten.to.dtype_layout, aten._to_copy.default, aten.dropout.default,
                 aten.clone.default, aten.contiguous.default, aten.type_as.default}
_MATMULS = {aten.matmul.default, aten.bmm.default}


@dataclass
class AttentionMatch:
    """Graph-level view of one attention block."""

    core: fx.Node
    kind: str
    q_proj: Projection
    k_proj: Projection
    v_proj: Projection
    o_proj: Projection
    num_heads: int
    num_kv_heads: int
    head_dim: int


def _is_sdpa(node: fx.Node) -> bool:
    return node.op == "call_function" and "scaled_dot_product" in str(node.target) and "backward" not in str(node.target)


def _back_through(node, ops, limit: int = 6):
    for _ in range(limit):
        if isinstance(node, fx.Node) and node.op == "call_function" and node.target in ops:
            node = node.args[0]
        else:
            break
    return node


def _eager_core(node: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node] | None:
    """(q, k, v) when ``node`` is the ``probs @ V`` matmul of an eager attention."""
    if node.op != "call_function" or node.target not in _MATMULS:
        return None
    probs = _back_through(node.args[0], _PASS_THROUGH)
    if not isinstance(probs, fx.Node) or probs.target not in _SOFTMAX:
        return None
    scores = bfs([probs.args[0]], tensor_inputs, stop=lambda n: n.target in _MATMULS)
    qk = [n for n in scores if n.op == "call_function" and n.target in _MATMULS]
    if not qk:
        return None
    q, kt = qk[0].args[0], qk[0].args[1]
    k = kt.args[0] if kt.target in (aten.transpose.int, aten.t.default, aten.permute.default) else kt
    return q, k, node.args[1]


def _single_projection(start: fx.Node, projections: dict, what: str, where: str) -> Projection:
    reached = bfs([start], tensor_inputs, stop=lambda n: n in projections)
    found = [projections[n] for n in reached if n in projections]
    if len(found) != 1:
        raise DiscoveryError(
            f"attention at {where}: expected exactly one weight projection feeding {what}, found "
            f"{[p.module_path for p in found] or 'none'}"
        )
    return found[0]


def _output_projection(core: fx.Node, projections: dict, where: str) -> tuple[Projection, list[fx.Node]]:
    """Follow layout-only ops from the attention output to the output projection."""
    path, frontier = [], [core]
    while frontier:
        node = frontier.pop()
        for user in tensor_users(node):
            if user in projections and projections[user].input is node:
                return projections[user], path
            if user.target is operator.getitem and user.args[1] == 0 or user.target in LAYOUT_OPS:
                path.append(user)
                frontier.append(user)
    raise DiscoveryError(
        f"attention at {where}: the attention output does not reach an output projection through "
        "reshape/transpose only (unsupported block pattern)"
    )


def _check_head_major(core: fx.Node, path: list[fx.Node], heads: int, head_dim: int, where: str) -> None:
    """Replay the layout ops on a probe whose values are channel ids; they must come out h*D + d."""
    value = core.meta["val"]
    b, h, t, d = (value[0] if isinstance(value, (tuple, list)) else value).shape
    probe = torch.arange(h * d, dtype=torch.float64).view(1, h, 1, d).expand(b, h, t, d).contiguous()
    values = {core: probe}
    for node in path:
        if node.target is operator.getitem:
            values[node] = values[node.args[0]]
            continue
        args = [values.get(a, a) if isinstance(a, fx.Node) else a for a in node.args]
        kwargs = dict(node.kwargs)
        if node.target is aten.dropout.default:
            values[node] = args[0]
            continue
        if node.target in (aten.to.dtype, aten.to.dtype_layout, aten._to_copy.default, aten.to.device):
            values[node] = args[0]
            continue
        values[node] = node.target(*args, **kwargs)
    flat = values[path[-1]] if path else probe
    expected = torch.arange(heads * head_dim, dtype=torch.float64)
    if flat.shape[-1] != heads * head_dim or not torch.equal(flat.reshape(-1, flat.shape[-1])[0], expected):
        raise DiscoveryError(
            f"attention at {where}: the output projection's input is not laid out head-major "
            "([..., heads * head_dim]); unsupported block pattern"
        )


def _kv_heads(q_p: Projection, k_p: Projection, v_p: Projection, k_core: fx.Node, heads: int, head_dim: int,
              where: str) -> int:
    k_heads_at_core = shape(k_core)[1]
    if k_heads_at_core != heads:
        kv = k_heads_at_core
    elif q_p is k_p and k_p is v_p:
        kv = (q_p.out_features // head_dim - heads) // 2
    elif k_p is v_p:
        kv = k_p.out_features // (2 * head_dim)
    else:
        kv = k_p.out_features // head_dim
    if kv <= 0 or heads % kv:
        raise DiscoveryError(f"attention at {where}: could not infer key/value heads ({kv}) for {heads} query heads")
    return kv


def find_attention(graph: fx.Graph, projections: dict[fx.Node, Projection]) -> list[AttentionMatch]:
    """Every attention block of the graph, in graph order."""
    matches = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if _is_sdpa(node):
            q, k, v, kind = node.args[0], node.args[1], node.args[2], "sdpa"
        else:
            qkv = _eager_core(node)
            if qkv is None:
                continue
            (q, k, v), kind = qkv, "eager"
        where = (node.meta.get("nn_module_stack") and list(node.meta["nn_module_stack"].values())[-1][0]) or node.name
        q_shape = shape(q)
        if len(q_shape) != 4:
            raise DiscoveryError(f"attention at {where}: query is not [batch, heads, tokens, head_dim]")
        heads, head_dim = q_shape[1], q_shape[3]
        q_p = _single_projection(q, projections, "the query", where)
        k_p = _single_projection(k, projections, "the key", where)
        v_p = _single_projection(v, projections, "the value", where)
        o_p, path = _output_projection(node, projections, where)
        if o_p.in_features != heads * head_dim:
            raise DiscoveryError(
                f"attention at {where}: output projection {o_p.module_path} takes {o_p.in_features} features, "
                f"expected heads*head_dim = {heads}*{head_dim}"
            )
        _check_head_major(node, path, heads, head_dim, where)
        kv = _kv_heads(q_p, k_p, v_p, k, heads, head_dim, where)
        matches.append(AttentionMatch(node, kind, q_p, k_p, v_p, o_p, heads, kv, head_dim))
    return matches


__all__ = ["AttentionMatch", "find_attention"]
