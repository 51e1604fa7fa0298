"""Node predicates for torch-level FX graphs (what Dynamo hands a backend; also aten-level export graphs).

Dynamo graphs call Python-level functions (``torch._C._nn.linear``, ``torch.nn.functional.silu``,
``operator.mul``) or methods (``x.mul(y)``); export graphs call aten overloads. The predicates accept both, and
read arguments by position or keyword.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

aten = torch.ops.aten

LINEAR_TARGETS = {torch._C._nn.linear, F.linear, aten.linear.default}
MUL_TARGETS = {operator.mul, torch.mul, aten.mul.Tensor}
SILU_TARGETS = {F.silu, aten.silu.default}
GELU_TARGETS = {F.gelu, torch._C._nn.gelu, aten.gelu.default}


def group_mask_targets() -> set:
    return {torch.ops.wide.group_mask, torch.ops.wide.group_mask.default}


def wide_op_names(graph: fx.Graph) -> dict[str, int]:
    """Count of ``wide::`` op calls in ``graph`` by op name (``{"group_mask": 4, ...}``)."""
    counts: dict[str, int] = {}
    for node in graph.nodes:
        name = wide_op_name(node)
        if name is not None:
            counts[name] = counts.get(name, 0) + 1
    return counts


def wide_op_name(node: fx.Node) -> str | None:
    """``"group_mask"`` for a ``torch.ops.wide.group_mask[.default]`` call, None for other nodes."""
    if node.op != "call_function":
        return None
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        target = target.overloadpacket
    if isinstance(target, torch._ops.OpOverloadPacket) and target._qualified_op_name.startswith("wide::"):
        return target._qualified_op_name.split("::", 1)[1]
    return None


def arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """Argument ``index`` / keyword ``name`` of a call node."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def is_call(node: Any, targets: set) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def is_group_mask(node: Any) -> bool:
    return is_call(node, group_mask_targets())


def is_linear(node: Any) -> bool:
    return is_call(node, LINEAR_TARGETS)


def is_mul(node: Any) -> bool:
    if isinstance(node, fx.Node) and node.op == "call_method" and node.target == "mul":
        return not node.kwargs and len(node.args) == 2
    return is_call(node, MUL_TARGETS) and not node.kwargs and len(node.args) == 2


def activation_name(node: Any) -> str | None:
    """``"silu"``, ``"gelu"`` or ``"gelu_tanh"`` for a (non-inplace) activation call, else None."""
    if is_call(node, SILU_TARGETS):
        return None if arg(node, 1, "inplace", False) else "silu"
    if is_call(node, GELU_TARGETS):
        approximate = arg(node, 1, "approximate", "none")
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate)
    return None


def example_value(node: Any) -> torch.Tensor | None:
    """The fake tensor a node produces (Dynamo: ``example_value``; export: ``val``), or None."""
    if not isinstance(node, fx.Node):
        return None
    val = node.meta.get("example_value", node.meta.get("val"))
    return val if isinstance(val, torch.Tensor) else None


def static_tokens(value: torch.Tensor, trailing: int = 1) -> int | None:
    """Tokens of ``value`` (the product of its sizes before the last ``trailing`` ones) when those sizes are plain ints
    (static shapes), else None."""
    sizes = value.shape[:-trailing]
    return math.prod(sizes) if all(isinstance(d, int) for d in sizes) else None


def same_dtype_and_device(*nodes: Any) -> bool:
    """True when every node with a known tensor value has the same dtype and device (unknown: not checked)."""
    values = [v for v in (example_value(n) for n in nodes if n is not None) if v is not None]
    return all(v.dtype == values[0].dtype and v.device == values[0].device for v in values)


def tensor_rank(node: Any) -> int | None:
    value = example_value(node)
    return None if value is None else value.dim()
