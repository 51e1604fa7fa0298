"""The query's rotary embedding moved into its projection's GEMM (prefill-sized inference graphs).

Pattern, on a Dynamo torch-level graph after ``dense_siblings`` (HF attention: the projection, the head split, then
``apply_rotary_pos_emb``, ``rotary_pattern``)::

    qkv = wide::output_group_linear_with_dense(x, m, Wq, bq, gs, [Wk, Wv], [bk, bv])
    q = qkv[0].view(B, T, H, D).transpose(1, 2)
    q_embed = q * cos.unsqueeze(1) + torch.cat((-q[..., D/2:], q[..., :D/2]), dim=-1) * sin.unsqueeze(1)

-> ``qkv = wide::output_group_linear_with_dense(..., cos, sin)`` and every user of ``q_embed`` reads ``q``: the op
returns the rotated query (``wide_compile/dense_siblings_op.py``), which its prefill GEMM rotates before its one store
(``templates/rotary_epilogue.py``), so Inductor's RoPE kernel no longer reads and writes the whole query. The keys'
rotation stays where it is (it feeds the KV cache).

Rewritten only where it is the same computation and the GEMM will rotate: the rotated query is HF's formula on
exactly this projection's output, nothing else reads the unrotated query, nothing needs a gradient, the tables come
before the projection in the graph, the token count is static and above the range where the query projection runs
a GEMV or cuBLAS (``MIN_TOKENS``: both would rotate afterwards, gaining nothing), and the head dim and
group size let the epilogue run (``rotary_epilogue.epilogue_applies``; elsewhere Inductor's fused RoPE kernel is
faster than a rotation after the GEMM). The backend option ``"wide.fuse_query_rope"`` turns it off.
"""
from __future__ import annotations

import operator

import torch
from torch import fx

import wide_compile.dense_siblings_op  # noqa: F401  (registers wide::output_group_linear_with_dense)

from ..templates.group_linear import DENSE_OUTPUT_MAX_TOKENS
from ..templates.rotary_epilogue import epilogue_applies
from .rotary_pattern import match_rotation
from .torch_patterns import example_value

MIN_TOKENS = DENSE_OUTPUT_MAX_TOKENS + 1
_QKV = torch.ops.wide.output_group_linear_with_dense.default
_NUM_ARGS = 7  # the op's arguments before the optional tables


def _is_method(node, names: tuple[str, ...]) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_method" and node.target in names


def _projection_of(q: fx.Node) -> fx.Node | None:
    """The ``output_group_linear_with_dense`` node of ``q = qkv[0].view(B, T, H, D).transpose(1, 2)``, or None."""
    if not (_is_method(q, ("transpose",)) and tuple(q.args[1:]) == (1, 2)):
        return None
    heads = q.args[0]
    if not (_is_method(heads, ("view", "reshape")) and len(heads.users) == 1):
        return None
    item = heads.args[0]
    if not (isinstance(item, fx.Node) and item.op == "call_function" and item.target is operator.getitem
            and item.args[1] == 0 and len(item.users) == 1):
        return None
    qkv = item.args[0]
    if not (isinstance(qkv, fx.Node) and qkv.op == "call_function" and qkv.target is _QKV
            and len(qkv.args) == _NUM_ARGS and not qkv.kwargs):
        return None
    flat, split, rotated = (example_value(n) for n in (item, heads, q))
    if flat is None or split is None or rotated is None or flat.dim() != 3 or split.dim() != 4:
        return None
    batch, tokens = flat.shape[:2]
    if tuple(split.shape[:2]) != (batch, tokens) or split.shape[2] * split.shape[3] != flat.shape[2]:
        return None
    return qkv


def _tokens(node: fx.Node) -> int | None:
    value = example_value(node)
    tokens = value.shape[1] if value is not None and value.dim() == 3 else None
    return tokens if isinstance(tokens, int) else None


def move_query_rotations(graph: fx.Graph, min_tokens: int = MIN_TOKENS) -> int:
    """Rewrite every matching query rotation of ``graph`` in place (see module docstring); returns how many
    projections now rotate their output."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    moved = 0
    for q_embed in list(graph.nodes):
        if q_embed not in order or q_embed.op != "call_function":
            continue
        match = match_rotation(q_embed)
        if match is None:
            continue
        q, cos, sin, pattern = match
        qkv = _projection_of(q)
        if qkv is None or any(user not in pattern for user in q.users):
            continue
        value = example_value(q_embed)
        tokens = _tokens(qkv.args[0])
        if value is None or value.requires_grad or tokens is None or tokens < min_tokens:
            continue
        if max(order[cos], order[sin]) > order[qkv] or not epilogue_applies(value.shape[-1], qkv.args[4]):
            continue
        qkv.args = (*qkv.args, cos, sin)
        q_embed.replace_all_uses_with(q)
        for node in pattern:  # the rotation's nodes, where nothing else (the keys' rotation) still reads them
            if not node.users:
                graph.erase_node(node)
                order.pop(node, None)
        moved += 1
    return moved


__all__ = ["move_query_rotations", "MIN_TOKENS"]
