"""Dense linears beside a lowered query projection -> one ``wide::output_group_linear_with_dense`` (inference).

After ``attention_lowering`` put ``q = wide::output_group_linear(x, m, Wq, bq, gs)`` in place of a query projection,
the other linears of the same ``x`` are usually the key and value projections (dense: the KV cache stays complete).
At batch-1 decode each is a cuBLAS GEMV plus its split-K reduction; as dense outputs of the query's op they become
more programs of one launch (``wide_compile/dense_siblings_op.py``). The rewrite is exact whatever the siblings are
(each output is the same linear of ``x``), so it needs no architecture knowledge. Fused per query projection: up to
two linears of ``x`` whose weights share one shape (a pair first, then the most output rows: the key and value
projections, not a parallel MLP's input projection as in Phi or GPT-J, nor the down-projections of LoRA adapters),
the query's dtype and device, and whose bias presence equals the query's. Kept apart, with the reason in
``LoweringResult.generic`` where one applies: anything that needs a gradient (training: the op has no backward),
linears in autocast regions, and projections whose weights or mask are computed after the earliest of them and cannot
move.
"""
from __future__ import annotations

import operator

import torch
from torch import fx

import wide_compile.dense_siblings_op  # noqa: F401  (registers wide::output_group_linear_with_dense)

from .attention_lowering import _node_order, _nodes_to_hoist
from .torch_patterns import arg, example_value, is_linear

MAX_SIBLINGS = 2  # what one launch takes (templates/group_linear_with_dense.py)
_QUERY = torch.ops.wide.output_group_linear.default
_FUSED = torch.ops.wide.output_group_linear_with_dense.default


def _needs_grad(node: fx.Node) -> bool:
    value = example_value(node)
    return value is None or value.requires_grad


def _weight_key(linear: fx.Node) -> tuple | None:
    w = example_value(arg(linear, 1, "weight"))
    return None if w is None or w.dim() != 2 else (tuple(w.shape), w.dtype, w.device)


def _siblings(query: fx.Node, skip: set[fx.Node], order: dict) -> list[fx.Node]:
    x, bias = query.args[0], arg(query, 3, "bias")
    q_weight = example_value(query.args[2])
    by_shape: dict[tuple, list[fx.Node]] = {}
    for user in sorted(x.users, key=order.__getitem__):
        if user is query or not is_linear(user) or user in skip or arg(user, 0, "input") is not x or _needs_grad(user):
            continue
        key = _weight_key(user)
        if key is None or q_weight is None or key[1:] != (q_weight.dtype, q_weight.device):
            continue
        if (arg(user, 2, "bias") is None) != (bias is None):
            continue
        by_shape.setdefault(key, []).append(user)
    # one weight shape: a pair before a single linear (key and value projections, not a parallel MLP's input
    # projection), then the most output rows (key / value rather than LoRA adapters' down-projections of x)
    best = max(by_shape.items(), key=lambda kv: (min(len(kv[1]), MAX_SIBLINGS), kv[0][0][0]), default=(None, []))[1]
    return best[:MAX_SIBLINGS]


def _weight_and_bias(node: fx.Node) -> tuple:
    """(weight, bias) arguments of a linear or of the query's ``output_group_linear``."""
    if is_linear(node):
        return arg(node, 1, "weight"), arg(node, 2, "bias")
    return arg(node, 2, "weight"), arg(node, 3, "bias")


def _late_weight(linears: tuple[fx.Node, ...], first: fx.Node, order: dict) -> str | None:
    """Why the joined op cannot go before ``first``: a weight or bias computed after it (e.g. a cast), or None."""
    late = [n for node in linears for n in _weight_and_bias(node)
            if isinstance(n, fx.Node) and order[n] >= order[first]]
    return f"{late[0].name} (a weight or bias) is computed after {first.name}" if late else None


def fuse_dense_siblings(graph: fx.Graph, skip: set[fx.Node]) -> tuple[int, list[str]]:
    """Rewrite every lowered query projection with dense siblings (see module docstring); returns (number of fused
    ops inserted, ``"node: reason"`` for queries whose siblings stay apart)."""
    fused, reasons = 0, []
    for query in [n for n in graph.nodes if n.op == "call_function" and n.target is _QUERY]:
        if _needs_grad(query):
            continue  # training graph: the fused op has no backward
        order = _node_order(graph)  # (fresh: each rewrite changes the graph)
        siblings = _siblings(query, skip, order)
        if not siblings:
            continue
        first = min((query, *siblings), key=order.__getitem__)
        why = _late_weight((query, *siblings), first, order)
        hoist = _nodes_to_hoist(query.args[1], first, order) if why is None else why
        if isinstance(hoist, str):
            reasons.append(f"{query.name}: dense linears {[s.name for s in siblings]} stay apart: {hoist}")
            continue
        for node in hoist:
            first.prepend(node)
        x, mask, weight, bias, group_size = (arg(query, i, n) for i, n in
                                             enumerate(("x", "mask", "weight", "bias", "group_size")))
        dense_w = [arg(s, 1, "weight") for s in siblings]
        dense_b = [arg(s, 2, "bias") for s in siblings]
        with graph.inserting_before(first):
            new = graph.call_function(_FUSED, (x, mask, weight, bias, group_size, dense_w, dense_b))
            new.meta = {k: v for k, v in query.meta.items() if k not in ("val", "example_value")}
            new.meta["example_value"] = [example_value(n) for n in (query, *siblings)]
            for i, old in enumerate((query, *siblings)):
                item = graph.call_function(operator.getitem, (new, i))
                item.meta = dict(old.meta)
                old.replace_all_uses_with(item)
        for old in (query, *siblings):
            graph.erase_node(old)
        fused += 1
    return fused, reasons


__all__ = ["fuse_dense_siblings"]
