"""One ``wide::group_rows`` per routed attention, shared by its query projection and its core (prefill graphs).

After ``dense_siblings`` a routed attention reads its router's mask ``m[B, T, G]`` twice: the joined q / k / v op
(``wide::output_group_linear_with_dense``), whose GEMM walks per-group token lists, and the lowered core
(``wide::group_attention``), whose prefill kernel walks each (sequence, group)'s rows, active first. For one
sequence both are the same order (``templates/row_order.py``), so this pass computes it once, before the projection,
and passes it to both (``row_order=`` / ``row_count=``): one scan launch per layer instead of two, the issue's
"ordering computed once and shared by the paired ops".

Applied where it pays and is exact: one sequence (``B == 1``: with several, the GEMM's lists run over all their
tokens while the core's order is per sequence) with a static token count above the query projection's GEMV range
(``MIN_TOKENS``: decode steps use neither order), in inference graphs (the ops it feeds are inference-only).
"""
from __future__ import annotations

import operator

import torch
from torch import fx

import wide_compile.dense_siblings_op  # noqa: F401  (registers wide::output_group_linear_with_dense)
import wide_compile.group_attention_op  # noqa: F401  (registers wide::group_attention)
import wide_compile.group_rows_op  # noqa: F401  (registers wide::group_rows)

from ..templates.group_linear import GEMV_MAX_TOKENS
from .torch_patterns import example_value

MIN_TOKENS = GEMV_MAX_TOKENS["output_group_linear"] + 1
_QKV = torch.ops.wide.output_group_linear_with_dense.default
_CORE = torch.ops.wide.group_attention.default
# (required arguments, defaults of the optional ones), the row order last
_QKV_SCHEMA = (7, (None, None, None, None))  # ..., dense_biases | cos, sin, row_order, row_count
_CORE_SCHEMA = (5, (None, None, None, None, None))  # ..., is_causal | scale, attn_mask, extents, row_order, row_count


def _shareable(mask: fx.Node) -> bool:
    value = example_value(mask)
    if value is None or value.dim() != 3 or value.requires_grad:
        return False
    batch, tokens = value.shape[:2]
    return batch == 1 and isinstance(tokens, int) and tokens >= MIN_TOKENS


def _full_args(node: fx.Node, schema: tuple[int, tuple]) -> tuple | None:
    """``node``'s positional arguments padded with the schema's defaults; None when it has keyword arguments, a
    count the schema does not allow, or a row order already."""
    required, defaults = schema
    if node.kwargs or not required <= len(node.args) <= required + len(defaults):
        return None
    args = tuple(node.args) + defaults[len(node.args) - required:]
    return args if args[-2:] == (None, None) else None


def share_row_orders(graph: fx.Graph) -> int:
    """Insert one ``wide::group_rows`` per mask read by both a joined q / k / v op and a lowered core (see module
    docstring); returns how many."""
    pairs: dict[fx.Node, tuple[list[fx.Node], list[fx.Node]]] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is _QKV and _full_args(node, _QKV_SCHEMA) is not None:
            pairs.setdefault(node.args[1], ([], []))[0].append(node)
        elif node.target is _CORE and _full_args(node, _CORE_SCHEMA) is not None:
            pairs.setdefault(node.args[3], ([], []))[1].append(node)
    shared = 0
    for mask, (projections, cores) in pairs.items():
        if not (isinstance(mask, fx.Node) and len(projections) == 1 and len(cores) == 1 and _shareable(mask)):
            continue
        with graph.inserting_before(projections[0]):  # the core reads the projection's query: it comes later
            rows = graph.call_function(torch.ops.wide.group_rows.default, (mask,))
            order = graph.call_function(operator.getitem, (rows, 0))
            count = graph.call_function(operator.getitem, (rows, 1))
        for node, schema in ((projections[0], _QKV_SCHEMA), (cores[0], _CORE_SCHEMA)):
            node.args = (*_full_args(node, schema)[:-2], order, count)
        shared += 1
    return shared


__all__ = ["MIN_TOKENS", "share_row_orders"]
