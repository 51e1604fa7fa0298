"""Group-locality dataflow analysis on a Dynamo (torch-level) FX graph.

Question answered: starting from the output ``y[*lead, N]`` of one ``linear`` node, which values of the graph depend
on ``y``, and does each element of a masked value ``group_mask(x, m, gs)`` depend only on ``y`` at the *same* token
(the same ``lead`` coordinates) and within the *same* group of ``gs`` features? If so, the linear may compute only the
groups that ``m`` marks active (zeros elsewhere): elements of inactive groups are zeroed by the ``group_mask``, and
elements of active groups only read ``y`` in their own, active, group. This is how the query projection of an
attention block is recognised, from dataflow alone: ``view -> transpose -> RoPE / q-norm -> SDPA or softmax(QK^T)V
-> transpose -> reshape`` keeps heads and tokens apart, while a fused q/k/v projection (its output also reaches the
keys / values), a q-norm over all heads (OLMo2) or anything unknown is refused with the reason.

The abstract value of a tensor is a :class:`Flow`: for every axis of ``y`` (the lead axes, then the feature axis) an
:class:`AxisMap` saying where that axis went and how coarse it became: an element whose coordinate along
``AxisMap.axis`` is ``p`` depends only on ``y`` coordinates in ``[(p // k) * width, (p // k + 1) * width)`` along
that ``y`` axis. Axes of a tensor not named in the flow may mix freely (head_dim, key positions). Each supported op
has a transfer function; an op that mixes a tracked axis (a reduction, a slice, a contraction over it, a reshape
that cannot be followed) or any op not listed stops the analysis with a reason.
"""

from __future__ import annotations

import heapq
import types
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import fx

from .group_flow import (
    AxisMap,
    Flow,
    NotLocal,
    broadcast_in,
    check_not_tracked,
    dim_list,
    dims_of,
    getitem_tensor,
    merge,
    norm_dim,
    same_size,
    view_axis,
)
from .torch_patterns import arg, example_value, wide_op_name

MAX_PATH_NODES = 400  # a query path is a few dozen nodes; longer slices are not attention blocks

ELEMENTWISE = {
    "add", "sub", "mul", "truediv", "div", "neg", "rsub", "tanh", "exp", "sigmoid", "rsqrt", "sqrt", "pow",
    "reciprocal", "abs", "square", "clamp", "float", "half", "bfloat16", "double", "to", "type_as", "contiguous",
    "clone", "detach", "alias", "dropout", "masked_fill", "where", "sin", "cos", "erf",
}
REDUCTIONS = {"mean", "sum", "amax", "amin", "var", "std", "logsumexp", "prod"}
SOFTMAX = {"softmax", "log_softmax", "_softmax", "_safe_softmax"}
NORMS = {"layer_norm", "rms_norm"}
RESHAPES = {"view", "reshape", "_unsafe_view", "flatten", "unflatten", "view_as", "reshape_as"}
EXPANDS = {"expand", "expand_as", "broadcast_to"}
SPLITS = {"split", "chunk", "split_with_sizes", "tensor_split", "unbind"}
CATS = {"cat", "concat", "concatenate", "stack"}
MATMULS = {"matmul", "bmm"}
SDPA = "scaled_dot_product_attention"
SIZE_QUERIES = {"size", "dim", "numel", "stride", "sym_size", "sym_numel", "sym_stride", "getattr"}
TERMINALS = {"wide::group_mask", "wide::masked_input_linear"}


@dataclass(frozen=True)
class Terminal:
    """A masked value reached by the source, with the source's flow at its input."""

    node: fx.Node  # the group_mask / masked_input_linear node
    mask: fx.Node
    group_size: int
    flow: Flow


# ----------------------------------------------------------------------------------------------- helpers
def op_name(node: fx.Node) -> str | None:
    """A plain name for torch-level ops: method name, function name, or ``wide::name`` (None: unknown callable)."""
    if node.op == "call_method":
        return node.target
    if node.op != "call_function":
        return None
    wide = wide_op_name(node)
    if wide is not None:
        return f"wide::{wide}"
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket.__name__
    if isinstance(target, types.FunctionType) and not (target.__module__ or "").startswith("torch"):
        return None  # a user function: unknown semantics
    return getattr(target, "__name__", None)


def _flat_args(node: fx.Node) -> list:
    out = []

    def visit(a):
        if isinstance(a, (list, tuple)):
            for item in a:
                visit(item)
        elif isinstance(a, dict):
            for item in a.values():
                visit(item)
        else:
            out.append(a)

    visit(node.args)
    visit(node.kwargs)
    return out


def _permutation(node: fx.Node, rank: int) -> list[int]:
    dims = node.args[1:] if node.op == "call_method" else node.args[1:2]
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = dims[0]
    if not dims:
        dims = node.kwargs.get("dims", ())
    return [norm_dim(d, rank) for d in dims]


class _Analysis:
    def __init__(self, source: fx.Node, order: dict[fx.Node, int]):
        self.source, self.order = source, order
        self.flows: dict[fx.Node, Any] = {}
        self.terminals: list[Terminal] = []

    def flow(self, node: Any) -> Flow | None:
        return self.flows.get(node) if isinstance(node, fx.Node) else None

    def run(self) -> list[Terminal]:
        value = example_value(self.source)
        if value is None or value.dim() < 1:
            raise NotLocal("the linear has no known output shape")
        rank = value.dim()
        self.flows[self.source] = Flow(tuple(AxisMap(a) for a in range(rank)))
        heap, pushed = [], {self.source}
        self._push_users(self.source, heap, pushed)
        while heap:
            _, node = heapq.heappop(heap)
            if len(pushed) > MAX_PATH_NODES:
                raise NotLocal(f"more than {MAX_PATH_NODES} nodes depend on it (not a query path)")
            result = self.transfer(node)
            if result is not None:
                self.flows[node] = result
                self._push_users(node, heap, pushed)
        return self.terminals

    def _push_users(self, node, heap, pushed) -> None:
        for user in node.users:
            if user not in pushed:
                pushed.add(user)
                heapq.heappush(heap, (self.order[user], user))

    def transfer(self, node: fx.Node):
        """The flow of ``node`` (None: a value that does not carry the source onward); raises :class:`NotLocal`."""
        where = f"{node.name} ({op_name(node) or node.target})"
        try:
            return self._transfer(node)
        except NotLocal as e:
            raise NotLocal(f"{where}: {e}") from None
        except Exception as e:  # an argument layout the transfer functions do not expect: refuse, never crash
            raise NotLocal(f"{where}: could not analyse ({type(e).__name__}: {e})") from None

    def _transfer(self, node: fx.Node):
        if node.op == "output":
            raise NotLocal("the value reaches a graph output")
        name = op_name(node)
        if name in SIZE_QUERIES and not isinstance(example_value(node), torch.Tensor):
            return None
        if name in TERMINALS:
            return self._terminal(node, name)
        out = example_value(node)
        inputs = [a for a in _flat_args(node) if self.flow(a) is not None]
        if name == "getitem":
            return self._getitem(node)
        if name is None:
            raise NotLocal("unknown operation")
        if name in SPLITS:
            return self._split(node, name)
        if not isinstance(out, torch.Tensor):
            raise NotLocal("unsupported operation with a non-tensor result")
        if name in ELEMENTWISE:
            flows = [broadcast_in(self.flows[a], example_value(a), out) for a in inputs]
            return merge(flows)
        x = node.args[0] if node.args else node.kwargs.get("input")
        if name in MATMULS or name == SDPA:
            return self._contraction(node, name, inputs)
        if name in CATS:
            return self._cat(node, name, out)
        if self.flow(x) is None or len(inputs) != 1:
            raise NotLocal("the source enters an operand other than the first")
        flow, value = self.flows[x], example_value(x)
        rank = value.dim()
        if name in RESHAPES:
            return replace(flow, maps=tuple(view_axis(m, dims_of(value), dims_of(out)) for m in flow.maps))
        if name in EXPANDS:
            return broadcast_in(flow, value, out)
        if name in ("transpose", "swapaxes", "swapdims"):
            d0, d1 = norm_dim(arg(node, 1, "dim0"), rank), norm_dim(arg(node, 2, "dim1"), rank)
            return flow.moved(lambda a: d1 if a == d0 else d0 if a == d1 else a)
        if name == "permute":
            perm = _permutation(node, rank)
            return flow.moved(lambda a: perm.index(a))
        if name == "unsqueeze":
            d = norm_dim(arg(node, 1, "dim"), rank + 1)
            return flow.moved(lambda a: a + 1 if a >= d else a)
        if name in ("squeeze", "select", "narrow"):
            if arg(node, 1, "dim") is None:
                raise NotLocal("squeeze without a dim")
            d = norm_dim(arg(node, 1, "dim"), rank)
            check_not_tracked(flow, [d], name)
            drop = name != "narrow" and (name == "select" or same_size(value.shape[d], 1))
            return flow.moved(lambda a: a - 1 if drop and a > d else a)
        if name in REDUCTIONS:
            dim = arg(node, 1, "dim")
            if dim is None:
                raise NotLocal("full reduction")
            dims = dim_list(dim, rank)
            check_not_tracked(flow, dims, "reduces")
            if out.dim() == rank:
                return flow
            return flow.moved(lambda a: a - sum(d < a for d in dims))
        if name in SOFTMAX:
            check_not_tracked(flow, [norm_dim(arg(node, 1, "dim"), rank)], "softmax")
            return flow
        if name in NORMS:
            shape = arg(node, 1, "normalized_shape")
            n = len(shape) if isinstance(shape, (list, tuple, torch.Size)) else 1
            check_not_tracked(flow, range(rank - n, rank), "normalises")
            return flow
        raise NotLocal("unsupported operation")

    def _terminal(self, node: fx.Node, name: str):
        x, mask = arg(node, 0, "x"), arg(node, 1, "mask")
        group_size = arg(node, 2 if name == "wide::group_mask" else 4, "group_size")
        if name == "wide::masked_input_linear" and arg(node, 5, "x_is_masked", False):
            raise NotLocal("x_is_masked=True: the input was already masked")
        others = [a for a in _flat_args(node) if a is not x and self.flow(a) is not None]
        if self.flow(x) is None or others:
            raise NotLocal("the source reaches the mask or weights, not the masked input")
        if not isinstance(group_size, int):
            raise NotLocal("group size is not a constant int")
        self.terminals.append(Terminal(node, mask, group_size, self.flows[x]))
        return None  # the masked value (and what follows) no longer depends on skipped groups

    def _getitem(self, node: fx.Node):
        src, index = node.args[0], node.args[1]
        flow = self.flow(src)
        if flow is None:
            raise NotLocal("indexing with a tensor")
        if isinstance(flow, list):  # element of a split
            if not isinstance(index, int):
                raise NotLocal("non-constant index into a split")
            return flow[index]
        if self.flow(index) is not None or isinstance(index, fx.Node) or (
                isinstance(index, tuple) and any(isinstance(i, fx.Node) for i in index)):
            raise NotLocal("indexing with a tensor")
        return getitem_tensor(flow, index, example_value(src))

    def _split(self, node: fx.Node, name: str):
        x = node.args[0]
        if self.flow(x) is None or any(self.flow(a) is not None for a in _flat_args(node)[1:]):
            raise NotLocal("the source is not the split tensor")
        flow, rank = self.flows[x], example_value(x).dim()
        dim = arg(node, 1 if name == "unbind" else 2, "dim", 0)
        d = norm_dim(dim, rank)
        check_not_tracked(flow, [d], "splits")
        parts = node.meta.get("example_value", node.meta.get("val"))
        count = len(parts) if isinstance(parts, (list, tuple)) else 0
        if name == "unbind":
            flow = flow.moved(lambda a: a - 1 if a > d else a)
        return [flow] * count

    def _cat(self, node: fx.Node, name: str, out: torch.Tensor):
        tensors = list(arg(node, 0, "tensors"))
        q_parts = [t for t in tensors if self.flow(t) is not None]
        if not q_parts or any(self.flow(a) is not None and a not in tensors for a in _flat_args(node)):
            raise NotLocal("the source is not among the concatenated tensors")
        rank = example_value(q_parts[0]).dim()
        dim = arg(node, 1, "dim", 0)
        if name == "stack":
            d = norm_dim(dim, rank + 1)
            return merge([self.flows[t] for t in q_parts]).moved(lambda a: a + 1 if a >= d else a)
        d = norm_dim(dim, rank)
        flow = merge([self.flows[t] for t in q_parts])
        check_not_tracked(flow, [d], "concatenates")
        return flow

    def _contraction(self, node: fx.Node, name: str, inputs: list) -> Flow:
        first = arg(node, 0, "query" if name == SDPA else "input")
        if self.flow(first) is None or len(inputs) != 1 or inputs[0] is not first:
            raise NotLocal("the source reaches the keys / values (or the second operand) of an attention "
                           "core or matmul (a fused q/k/v projection?)")
        flow, value, out = self.flows[first], example_value(first), example_value(node)
        rank, out_rank = value.dim(), out.dim()
        if rank < 2:
            raise NotLocal("1-D operand")
        check_not_tracked(flow, [rank - 1], "contracts")

        def where(a: int) -> int:
            return out_rank - 2 if a == rank - 2 else a + out_rank - rank

        moved = flow.moved(where)
        for m_in, m_out in zip(flow.maps, moved.maps):
            if not same_size(value.shape[m_in.axis], out.shape[m_out.axis]):
                raise NotLocal("broadcasts a head/token axis")
        return replace(moved, core=True)


def trace_group_local(linear: fx.Node, order: dict[fx.Node, int]) -> tuple[Terminal, dict[fx.Node, Any]]:
    """The single masked value that the output of ``linear`` reaches group-locally (see module docstring), and the
    flow of every node on the way.

    ``order`` maps every node of the graph to its position. Raises :class:`NotLocal` (with the offending node) when
    some use of the output is not group-local, or when it reaches no or several masked values.
    """
    analysis = _Analysis(linear, order)
    terminals = analysis.run()
    if len(terminals) != 1:
        raise NotLocal(f"its output reaches {len(terminals)} masked values (expected 1)")
    return terminals[0], analysis.flows


def is_group_local(terminal: Terminal, source_value: torch.Tensor) -> str | None:
    """Why the flow at ``terminal`` does not allow group skipping of the source's output (None when it does)."""
    rank = source_value.dim()
    x = example_value(arg(terminal.node, 0, "x"))
    maps = terminal.flow.maps
    if x is None or x.dim() != rank:
        return "the masked value does not have the linear output's rank"
    # A lead axis of size 1 has a single token coordinate, so wherever the analysis placed it (size-1 axes are
    # ambiguous through reshapes: decode at batch 1) it cannot mix tokens; every other lead axis must map to itself.
    if any(m != AxisMap(j) for j, m in enumerate(maps[:-1]) if not same_size(source_value.shape[j], 1)):
        return "tokens of the masked value do not line up with the linear output's tokens"
    feature = maps[-1]
    if feature.axis != rank - 1 or feature.k != feature.width:
        return "heads of the masked value do not line up with the linear output's features"
    if terminal.group_size % feature.width:
        return f"a head ({feature.width} features) straddles groups of {terminal.group_size}"
    if not same_size(x.shape[-1], source_value.shape[-1]):
        return "the masked value and the linear output differ in width"
    if not terminal.flow.core:
        return "the path does not pass an attention core"
    return None


__all__ = ["AxisMap", "Flow", "NotLocal", "Terminal", "is_group_local", "op_name", "same_size", "trace_group_local"]
