"""Query projections with output-group skipping: ``linear(x, Wq, bq)`` -> ``wide::output_group_linear``.

In a routed attention block the attention output is masked before the output projection,
``group_mask(attn, m, gs)`` (or its lowered form ``masked_input_linear(attn, m, Wo, bo, gs)``). Heads of a skipped
group are zeroed there, and each head of the attention output reads only its own query head at its own token. So
the query projection may compute only the active groups of each token (exact zeros elsewhere) without changing the
block's output: ``q = wide::output_group_linear(x, m, Wq, bq, gs)``. The group width of ``q`` equals the masked
value's (``gs`` = heads per group x head_dim).

Which linear is the query projection is decided by dataflow (``group_locality``): the candidates are the linears
feeding the query operand of the attention core (SDPA's ``query``, or the first operand of ``Q @ K^T`` in eager
attention) that is masked; one is rewritten only if every use of its output is group- and token-local up to that
mask. What stays dense, with the reason in ``LoweringResult.generic``:
- fused q/k/v projections (GPT-2 ``c_attn`` is an ``addmm``; Phi-3 ``qkv_proj``, NeoX / Falcon
  ``query_key_value`` slice or chunk one output into q, k and v, so it also reaches the keys and values);
- q-norms over all heads at once (OLMo2: a reduction over the head axis); any op the analysis does not know;
- masks that need a gradient (router training): the straight-through gradient of a skipped group is
  ``sum(grad * attn)`` over its heads, and ``attn`` of a skipped head needs that head's dense query, so the
  dense projection is kept to give exactly the eager router gradients;
- linears inside autocast regions (the lowered op does not follow autocast's casts).

After the query projection of an attention is rewritten, its core is offered to ``attention_core_lowering``
(``scaled_dot_product_attention`` -> ``wide::group_attention``, which skips inactive head groups), using the layout
of the query that the analysis found.
"""

from __future__ import annotations

from collections import deque

import torch
from torch import fx

import wide_compile.kernel_ops  # noqa: F401  (registers the lowered ops)

from .attention_core_lowering import lower_attention_core
from .graph_utils import tensor_inputs
from .group_locality import SDPA, NotLocal, Terminal, is_group_local, op_name, same_size, trace_group_local
from .torch_patterns import arg, example_value, is_linear, same_dtype_and_device

LAYOUT_BACK = {"view", "reshape", "_unsafe_view", "transpose", "permute", "contiguous", "to", "clone", "flatten",
               "float", "type_as"}
MAX_BACK_NODES = 200


def attention_core(masked_input: fx.Node) -> fx.Node | None:
    """The SDPA / ``probs @ V`` node that ``masked_input`` is a re-layout of, or None."""
    node = masked_input
    for _ in range(12):
        if not isinstance(node, fx.Node):
            return None
        name = op_name(node)
        if name == SDPA or (name in ("matmul", "bmm") and _scores_matmul(node) is not None):
            return node
        if name not in LAYOUT_BACK:
            return None
        node = node.args[0]
    return None


def _scores_matmul(probs_v: fx.Node) -> fx.Node | None:
    """For ``probs @ V``: the ``Q @ K^T`` matmul behind ``probs`` (through softmax, scaling, masking), if any."""
    probs = arg(probs_v, 0, "input")
    if not isinstance(probs, fx.Node):
        return None
    seen, queue, softmax = {probs}, deque([probs]), False
    while queue and len(seen) < MAX_BACK_NODES:
        node = queue.popleft()
        name = op_name(node)
        if name in ("matmul", "bmm"):
            return node if softmax else None
        softmax = softmax or name in ("softmax", "_softmax", "_safe_softmax")
        for a in tensor_inputs(node):
            if a not in seen:
                seen.add(a)
                queue.append(a)
    return None


def query_operand(core: fx.Node) -> fx.Node:
    if op_name(core) == SDPA:
        return arg(core, 0, "query")
    return arg(_scores_matmul(core), 0, "input")


def query_linears(core: fx.Node) -> list[fx.Node]:
    """Linears reached backward from the core's query operand (the walk stops at linears and graph inputs)."""
    start = query_operand(core)
    seen, queue, found = {start}, deque([start]), []
    while queue and len(seen) < MAX_BACK_NODES:
        node = queue.popleft()
        if is_linear(node):
            found.append(node)
            continue
        if node.op != "call_function" and node.op != "call_method" or op_name(node) is None:
            continue
        if op_name(node).startswith("wide::"):
            continue
        for a in tensor_inputs(node):
            if a not in seen:
                seen.add(a)
                queue.append(a)
    return found


def masked_attention_outputs(graph: fx.Graph) -> list[fx.Node]:
    """``group_mask`` / ``masked_input_linear(x_is_masked=False)`` nodes whose input is an attention output."""
    found = []
    for node in graph.nodes:
        name = op_name(node)
        if name == "wide::group_mask" or (name == "wide::masked_input_linear" and not arg(node, 5, "x_is_masked")):
            if attention_core(arg(node, 0, "x")) is not None:
                found.append(node)
    return found


def _mask_needs_grad(mask: fx.Node) -> bool:
    value = example_value(mask)
    return value is not None and value.requires_grad


def _check_mask_shape(mask: fx.Node, out: torch.Tensor, group_size: int) -> str | None:
    value = example_value(mask)
    if value is None:
        return "the mask has no known shape"
    if value.dim() != out.dim() or any(
            not same_size(a, b) for a, b in zip(value.shape[:-1], out.shape[:-1])):
        return f"the mask shape {tuple(value.shape)} does not line up with the projection output {tuple(out.shape)}"
    if not same_size(value.shape[-1] * group_size, out.shape[-1]):
        return f"{value.shape[-1]} groups of {group_size} do not cover the projection's {out.shape[-1]} features"
    return None


def _nodes_to_hoist(mask: fx.Node, before: fx.Node, order: dict[fx.Node, int]) -> list[fx.Node] | str:
    """The nodes computing ``mask`` that come after ``before`` (to be moved ahead of it), or why they cannot move."""
    limit = order[before]
    needed, stack = set(), [mask]
    while stack:
        node = stack.pop()
        if not isinstance(node, fx.Node) or node in needed or order[node] < limit:
            continue
        if node is before:
            return "the mask is computed from the projection's output"
        name = op_name(node) or ""
        if node.op not in ("call_function", "call_method") or name.endswith("_") or "autocast" in name:
            return f"the mask is computed after the projection by {node.name}, which cannot move"
        needed.add(node)
        stack.extend(n for n in node.all_input_nodes)
    return sorted(needed, key=order.__getitem__)


def _node_order(graph: fx.Graph) -> dict[fx.Node, int]:
    return {n: i for i, n in enumerate(graph.nodes)}


def _why_not(linear: fx.Node, masked: fx.Node, order: dict[fx.Node, int], skip: set[fx.Node]
             ) -> str | tuple[Terminal, dict]:
    """(terminal, flows) of ``linear`` when it can be rewritten for ``masked``, else the reason it cannot."""
    if linear in skip:
        return "inside an autocast region"
    weight, bias = arg(linear, 1, "weight"), arg(linear, 2, "bias")
    out = example_value(linear)
    if out is None or example_value(weight) is None or example_value(weight).dim() != 2:
        return "weight is not a known 2-D tensor"
    if not same_dtype_and_device(arg(linear, 0, "input"), weight, bias):
        return "input, weight and bias differ in dtype or device"
    try:
        terminal, flows = trace_group_local(linear, order)
    except NotLocal as e:
        return str(e)
    if terminal.node is not masked:
        return f"its output reaches {terminal.node.name}, not this attention's mask"
    why = is_group_local(terminal, out) or _check_mask_shape(terminal.mask, out, terminal.group_size)
    if why:
        return why
    if _mask_needs_grad(terminal.mask):
        return ("the mask needs a gradient (router training, or routers with requires_grad outside torch.no_grad()): "
                "its straight-through gradient needs the dense attention output of skipped heads")
    return terminal, flows


def _rewrite(graph: fx.Graph, linear: fx.Node, terminal: Terminal, hoist: list[fx.Node]) -> None:
    for node in hoist:
        linear.prepend(node)
    x, weight, bias = arg(linear, 0, "input"), arg(linear, 1, "weight"), arg(linear, 2, "bias")
    with graph.inserting_before(linear):
        new = graph.call_function(torch.ops.wide.output_group_linear.default,
                                  (x, terminal.mask, weight, bias, terminal.group_size))
    new.meta = dict(linear.meta)
    linear.replace_all_uses_with(new)
    graph.erase_node(linear)


def _lower_queries_of(graph: fx.Graph, masked: fx.Node, core: fx.Node, skip: set[fx.Node], lowered: dict,
                      generic: list[str]) -> tuple[Terminal, dict] | None:
    """Rewrite the query projections of one attention; returns a (terminal, flows) of a rewritten one, or None."""
    linears = query_linears(core)
    if not linears:
        generic.append(f"{masked.name}: query projection stays dense: no linear feeds the attention query "
                       "(e.g. a Conv1D / addmm or matmul projection)")
        return None
    done = None
    for linear in linears:
        order = _node_order(graph)
        result = _why_not(linear, masked, order, skip)
        if not isinstance(result, str):
            hoist = _nodes_to_hoist(result[0].mask, linear, order)
            if isinstance(hoist, list):
                _rewrite(graph, linear, result[0], hoist)
                lowered["output_group_linear"] = lowered.get("output_group_linear", 0) + 1
                done = result
                continue
            result = hoist
        generic.append(f"{masked.name}: query projection {linear.name} stays dense: {result}")
    return done


def lower_attention_queries(graph: fx.Graph, skip: set[fx.Node], cores: bool = True) -> tuple[dict, list[str]]:
    """Rewrite every query projection that may skip groups, and then (``cores``) its attention core;
    returns ({lowered op: count}, reasons for what stays dense)."""
    lowered, generic = {}, []
    for masked in masked_attention_outputs(graph):
        core = attention_core(arg(masked, 0, "x"))
        done = _lower_queries_of(graph, masked, core, skip, lowered, generic)
        if not cores:
            continue
        if done is None:  # (the query projection's reason covers the core too)
            continue
        why = lower_attention_core(graph, core, done[0], done[1], skip)
        if why is None:
            lowered["group_attention"] = lowered.get("group_attention", 0) + 1
        else:
            generic.append(f"{masked.name}: attention core {core.name} stays dense: {why}")
    return lowered, generic


__all__ = ["attention_core", "lower_attention_queries", "masked_attention_outputs", "query_linears"]
