"""Rewrite the WIDE patterns of a torch-level FX graph into the lowered ``wide::`` ops (``wide_compile.kernel_ops``).

Patterns (``gm = wide::group_mask``; every rewrite keeps the graph's values and gradients):

1. Gated MLP: ``gm(mul(act(linear(x, Wg)), linear(x, Wu)), m, gs)`` with ``act`` in silu / gelu / gelu-tanh,
   no biases, and every intermediate used only inside the pattern
   -> ``h = wide::gated_up_groups(x, Wg, Wu, m, gs, act)``; each linear consuming ``h`` (the down projection)
   -> ``wide::masked_input_linear(h, m, Wd, bd, gs, x_is_masked=True)`` (``h`` is already zero in skipped groups).
2. Masked linear: ``linear(gm(x, m, gs), W, b)`` -> ``wide::masked_input_linear(x, m, W, b, gs)``
   (attention output projections, non-gated or fused-gate/up MLP down projections, LoRA adapters on them).
3. Attention query: ``q = linear(x, Wq, bq)`` whose output reaches ``gm(attn, m, gs)`` only through the attention
   core as the query, head- and token-locally (view / transpose / RoPE / per-head q-norm / SDPA or eager
   ``softmax(QK^T)V`` / transpose / reshape) -> ``wide::output_group_linear(x, m, Wq, bq, gs)`` (each token computes
   only the query heads of its active groups; the others are zeroed by ``gm`` anyway). Decided by dataflow
   (``attention_lowering`` / ``group_locality``); fused q/k/v projections, q-norms over all heads, masks that need a
   gradient (router training: the straight-through gradient needs the dense attention of skipped heads) stay dense.
4. Attention core, for an attention whose query was lowered in 3:
   ``scaled_dot_product_attention(q, k, v, attn_mask=a, is_causal=c, scale=s)`` with no mask or a boolean one
   (padding, static KV caches), no dropout and (when causal) as many queries as keys
   -> ``wide::group_attention(q, k, v, m, c, s, a)`` (zeros for the heads of inactive groups, which ``gm`` zeroes
   anyway; the templates skip their K/V reads and FLOPs, and key blocks the mask hides). Additive float masks and
   eager ``softmax(QK^T)V`` keep the core as it is (``attention_core_lowering``). The output projection after a
   lowered core gets ``x_is_masked=True`` (its input already has those zeros). Cores that share an explicit mask
   then share its row extents: one ``wide::attn_mask_extents`` per mask (``mask_extents_sharing``).
5. Router decisions at inference (no noise, no gradient), where ``router_mask_op.fused_for`` says it pays:
   ``threshold_gate(router_logits(...))`` -> ``wide::router_mask`` (``router_lowering``; the ``wide.fuse_routers``
   backend option).
6. The rotary embedding's cos / sin table, when several layers read it: ``wide::realize`` after it, so Inductor
   computes it once per forward instead of inside every layer's RoPE (``rotary_realize``).
7. The query's rotary embedding after a joined q / k / v op of 3 (prefill-sized inference graphs): the op takes the
   tables and returns the rotated query, which its GEMM rotates before storing it (``query_rope_epilogue``; the
   ``wide.fuse_query_rope`` backend option).
8. The mask's row order, when a joined q / k / v op and its core read the same mask of one sequence (prefill-sized
   inference graphs): ``wide::group_rows`` once, passed to both (``row_order_sharing``).
9. Each prefill-sized ``wide::router_mask`` of 5 on CUDA gets its ``W_in`` split into two 16-bit parts, computed once
   per forward at the top of the graph instead of per K step inside the kernel (``router_weight_split``; the
   ``wide.presplit_routers`` backend option).
10. A residual connection after a prefill-sized output / down projection on CUDA, ``r + masked_input_linear(...)``
   -> ``wide::masked_input_linear_add_(r, ...)``: the GEMM adds ``r`` in its epilogue, in place
   (``residual_add_fusion``; the ``wide.fuse_residual_adds`` backend option).

Anything else (other activations, biased gate/up, fused gate_up weights, Conv1D ``addmm`` projections, a
``group_mask`` whose value is also used elsewhere) stays as it is and runs on the generic path; the result
lists why for each ``group_mask`` that was not fully lowered, and for each attention whose query projection stays
dense. Patterns inside autocast regions are not rewritten
(the lowered ops do not follow autocast's casts); the rest of such a graph is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import fx

import wide_compile.kernel_ops  # noqa: F401  (registers the lowered ops)
import wide_compile.router_mask_op  # noqa: F401  (registers wide::router_mask)

from .attention_lowering import lower_attention_queries
from .mask_extents_sharing import share_mask_extents
from .rotary_realize import realize_rotary_tables
from .dense_siblings import fuse_dense_siblings
from .query_rope_epilogue import move_query_rotations
from .row_order_sharing import share_row_orders
from .router_lowering import lower_router_decisions
from .residual_add_fusion import fuse_residual_adds
from .router_weight_split import split_router_weights_once
from .torch_patterns import (
    activation_name, arg, is_group_mask, is_linear, is_mul, same_dtype_and_device, tensor_rank, wide_op_name,
)


@dataclass
class LoweringResult:
    """What one run of :func:`lower_wide_patterns` did."""

    lowered: dict[str, int] = field(default_factory=dict)  # lowered op name -> number of calls inserted
    generic: list[str] = field(default_factory=list)  # "node: reason" for masks left (partly) on the generic path
    stored: dict[str, int] = field(default_factory=dict)  # values stored once instead of inlined ("rotary tables")

    def count(self, op: str) -> None:
        self.lowered[op] = self.lowered.get(op, 0) + 1

    def record(self, op: str, calls: int) -> None:
        """``lowered[op] = calls`` when a pass inserted any."""
        if calls:
            self.lowered[op] = calls


@dataclass
class GatedMatch:
    mask_node: fx.Node
    x: fx.Node
    w_gate: fx.Node
    w_up: fx.Node
    activation: str
    pattern_nodes: tuple[fx.Node, ...]  # group_mask, mul, act, gate linear, up linear (erased after the rewrite)


def autocast_region_nodes(graph: fx.Graph) -> set[fx.Node]:
    """Nodes between ``_enter_autocast`` and ``_exit_autocast`` (Dynamo keeps program order)."""
    inside, depth = set(), 0
    for node in graph.nodes:
        name = getattr(node.target, "__name__", "") if node.op == "call_function" else ""
        if name == "_enter_autocast":
            depth += 1
        elif name == "_exit_autocast":
            depth = max(0, depth - 1)
        elif depth:
            inside.add(node)
    return inside


def match_gated_mlp(mask_node: fx.Node) -> GatedMatch | str:
    """The gated-MLP pattern ending at ``mask_node`` (a ``group_mask``), or the reason it does not match."""
    product = arg(mask_node, 0, "x")
    if not isinstance(arg(mask_node, 2, "group_size"), int):
        return "group size is not a constant int"
    if not is_mul(product):
        return "input is not a product act(gate) * up"
    for act_node, up in (product.args, product.args[::-1]):
        activation = activation_name(act_node)
        if activation is not None and is_linear(up) and is_linear(arg(act_node, 0, "input")):
            break
    else:
        return "input is not act(linear) * linear with act in silu / gelu / gelu-tanh"
    gate = arg(act_node, 0, "input")
    x, w_gate, w_up = arg(gate, 0, "input"), arg(gate, 1, "weight"), arg(up, 1, "weight")
    if gate is up or arg(up, 0, "input") is not x:
        return "gate and up projections do not read the same input"
    if arg(gate, 2, "bias") is not None or arg(up, 2, "bias") is not None:
        return "gate / up projection has a bias"
    if any(len(n.users) != 1 for n in (product, act_node, gate, up)):
        return "an intermediate of act(gate) * up is used outside the pattern"
    if tensor_rank(w_gate) not in (2, None) or tensor_rank(w_up) not in (2, None):
        return "gate / up weight is not 2-D"
    if not same_dtype_and_device(x, w_gate, w_up):
        return "input and weights differ in dtype or device"
    return GatedMatch(mask_node, x, w_gate, w_up, activation, (mask_node, product, act_node, gate, up))


def _lower_linear_user(graph: fx.Graph, linear: fx.Node, x: fx.Node, mask, group_size: int,
                       x_is_masked: bool) -> str | None:
    """Replace ``linear`` (whose input is the masked ``x``) by ``masked_input_linear``; returns why not, or None."""
    weight, bias = arg(linear, 1, "weight"), arg(linear, 2, "bias")
    masked = arg(linear, 0, "input")
    if weight is masked or bias is masked:
        return f"{linear.name}: the masked value is a weight / bias"
    if tensor_rank(weight) not in (2, None):
        return f"{linear.name}: weight is not 2-D"
    if not same_dtype_and_device(x, weight, bias):
        return f"{linear.name}: input, weight and bias differ in dtype or device"
    with graph.inserting_before(linear):
        new = graph.call_function(torch.ops.wide.masked_input_linear.default,
                                  (x, mask, weight, bias, group_size, x_is_masked))
    new.meta = dict(linear.meta)
    linear.replace_all_uses_with(new)
    graph.erase_node(linear)
    return None


def _linear_users(node: fx.Node) -> list[fx.Node]:
    return [u for u in node.users if is_linear(u) and arg(u, 0, "input") is node]


def lower_gated_mlps(graph: fx.Graph, result: LoweringResult, skip: set[fx.Node]) -> None:
    """Pattern 1 (see module docstring); nodes in ``skip`` (autocast regions) are left alone."""
    for mask_node in [n for n in graph.nodes if is_group_mask(n)]:
        match = match_gated_mlp(mask_node)
        if isinstance(match, str) or any(n in skip for n in match.pattern_nodes):
            continue
        mask, group_size = arg(mask_node, 1, "mask"), arg(mask_node, 2, "group_size")
        with graph.inserting_before(mask_node):
            h = graph.call_function(torch.ops.wide.gated_up_groups.default,
                                    (match.x, match.w_gate, match.w_up, mask, group_size, match.activation))
        h.meta = dict(mask_node.meta)
        mask_node.replace_all_uses_with(h)
        for node in match.pattern_nodes:  # users first: group_mask, mul, act, gate, up
            graph.erase_node(node)
        result.count("gated_up_groups")
        for linear in _linear_users(h):
            if linear in skip:
                result.generic.append(f"{linear.name}: inside an autocast region")
                continue
            why = _lower_linear_user(graph, linear, h, mask, group_size, x_is_masked=True)
            if why is None:
                result.count("masked_input_linear")
            else:
                result.generic.append(why)


ZERO_PRESERVING_VIEWS = {"view", "reshape", "_unsafe_view", "flatten", "transpose", "permute", "contiguous"}


def comes_masked_from_group_attention(x: fx.Node, mask: fx.Node) -> bool:
    """Whether ``x`` is a ``wide::group_attention`` output with ``mask`` seen through views only (transpose, reshape,
    ...): that op writes exact zeros for the heads of inactive groups, so ``x`` is already masked (the dataflow analysis
    that lowered the core proved heads line up with ``mask``'s groups)."""
    node = x
    for _ in range(8):
        if not isinstance(node, fx.Node):
            return False
        if wide_op_name(node) == "group_attention":
            return arg(node, 3, "mask") is mask
        target = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
        if node.op not in ("call_method", "call_function") or target not in ZERO_PRESERVING_VIEWS:
            return False
        node = node.args[0] if node.args else None
    return False


def lower_masked_linears(graph: fx.Graph, result: LoweringResult, skip: set[fx.Node]) -> None:
    """Pattern 2 (see module docstring), for the ``group_mask`` nodes pattern 1 left; ``skip`` as above. An input that
    comes from a lowered attention core with the same mask is passed as already masked (no masking pass)."""
    for mask_node in [n for n in graph.nodes if is_group_mask(n)]:
        x, mask, group_size = arg(mask_node, 0, "x"), arg(mask_node, 1, "mask"), arg(mask_node, 2, "group_size")
        if not isinstance(group_size, int):
            result.generic.append(f"{mask_node.name}: group size is not a constant int")
            continue
        pre_masked = comes_masked_from_group_attention(x, mask)
        for linear in [u for u in _linear_users(mask_node) if u not in skip]:
            why = _lower_linear_user(graph, linear, x, mask, group_size, x_is_masked=pre_masked)
            if why is None:
                result.count("masked_input_linear")
            else:
                result.generic.append(why)
        if not mask_node.users:
            graph.erase_node(mask_node)
        else:
            users = ", ".join(f"{u.name}({getattr(u.target, '__name__', u.target)})" for u in mask_node.users)
            in_autocast = any(u in skip for u in mask_node.users)
            why = "inside an autocast region" if in_autocast else "not a linear of its input"
            result.generic.append(f"{mask_node.name}: kept, its value feeds {users} ({why})")


def lower_wide_patterns(gm: fx.GraphModule, fuse_routers: bool = True, one_token_routers: str = "reduction",
                        dense_siblings: bool = True, query_rope: bool = True,
                        presplit_routers: bool = True, residual_adds: bool = True) -> LoweringResult:
    """Run the rewrites on ``gm`` in place (graph nodes only; placeholders untouched) and recompile it.

    ``fuse_routers``: also replace noise-free router decisions by ``wide::router_mask`` (one Triton launch) where the
    token count is in the range where it measured faster, and one-token decisions as ``one_token_routers`` says
    (``passes/router_lowering.py``). ``dense_siblings``: last, join each lowered query projection and the dense
    linears of its input (key, value) into one op (``passes/dense_siblings.py``; inference graphs only).
    ``query_rope``: then move each query's rotary embedding into that op (``passes/query_rope_epilogue.py``). With
    ``dense_siblings`` each such op and its attention core share one row order (``passes/row_order_sharing.py``).
    ``presplit_routers``: prefill-sized router ops on CUDA read ``W_in``'s 16-bit parts, made once per forward
    (``passes/router_weight_split.py``). ``residual_adds``: prefill-sized output / down projections on CUDA add
    the residual connection after them in their GEMM (``passes/residual_add_fusion.py``)."""
    result = LoweringResult()
    skip = autocast_region_nodes(gm.graph)
    if fuse_routers:
        routers, router_reasons = lower_router_decisions(gm.graph, one_token_routers)  # noise-free decisions
        result.lowered.update(routers)
        result.generic.extend(router_reasons)
    attention, reasons = lower_attention_queries(gm.graph, skip)  # first: it reads the attention group_masks
    result.lowered.update(attention)
    result.generic.extend(reasons)
    result.record("attn_mask_extents", share_mask_extents(gm.graph))
    lower_gated_mlps(gm.graph, result, skip)
    lower_masked_linears(gm.graph, result, skip)
    if dense_siblings:
        fused, sibling_reasons = fuse_dense_siblings(gm.graph, skip)
        result.record("output_group_linear_with_dense", fused)
        result.generic.extend(sibling_reasons)
    tables = realize_rotary_tables(gm.graph)
    if tables:
        result.stored["rotary tables"] = tables
    if dense_siblings and query_rope:
        result.record("query_rope_epilogue", move_query_rotations(gm.graph))
    if dense_siblings:
        result.record("shared_row_order", share_row_orders(gm.graph))
    if fuse_routers and presplit_routers:
        result.record("router_weight_split", split_router_weights_once(gm.graph))
    if residual_adds:
        result.record("residual_add", fuse_residual_adds(gm.graph))
    gm.graph.lint()
    gm.recompile()
    return result
