"""Find the weight projections (Linear, Conv1D, ``x @ W.T``) of a captured graph."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx

from .capture import CapturedGraph

aten = torch.ops.aten

_TRANSPOSES = {aten.t.default, aten.transpose.int, aten.permute.default, aten.numpy_T.default}


@dataclass(frozen=True)
class Projection:
    """One weight projection: ``out = input @ W^T (+ b)`` whatever the op that spells it."""

    node: fx.Node  # the node producing the projection's output
    input: fx.Node  # the activation operand
    weight_name: str  # FQN of the weight parameter
    module_path: str  # FQN of the module owning the weight
    in_features: int
    out_features: int

    def __repr__(self) -> str:  # keep error messages short
        return f"Projection({self.module_path}, {self.in_features}->{self.out_features})"


def _param_name(node, captured: CapturedGraph) -> str | None:
    if isinstance(node, fx.Node) and node.op == "placeholder":
        return captured.param_of_placeholder.get(node.name)
    return None


def _weight_operand(arg, captured: CapturedGraph) -> tuple[str, bool] | None:
    """(parameter name, transposed?) when ``arg`` is a parameter, possibly through one transpose."""
    name = _param_name(arg, captured)
    if name is not None:
        return name, False
    if isinstance(arg, fx.Node) and arg.op == "call_function" and arg.target in _TRANSPOSES:
        name = _param_name(arg.args[0], captured)
        if name is not None:
            return name, True
    return None


def _as_projection(node: fx.Node, captured: CapturedGraph) -> Projection | None:
    if node.op != "call_function":
        return None
    if node.target is aten.linear.default:
        x, w = node.args[0], node.args[1]
        name = _param_name(w, captured)
        if name is None or captured.params[name].dim() != 2:
            return None
        out_f, in_f = captured.params[name].shape
    elif node.target is aten.addmm.default:  # Conv1D: addmm(bias, x, W[in, out])
        x, operand = node.args[1], node.args[2]
        found = _weight_operand(operand, captured)
        if found is None:
            return None
        name, transposed = found
        in_f, out_f = captured.params[name].shape[::-1] if transposed else captured.params[name].shape
    elif node.target in (aten.matmul.default, aten.mm.default):
        x, operand = node.args[0], node.args[1]
        found = _weight_operand(operand, captured)
        if found is None or captured.params[found[0]].dim() != 2:
            return None
        name, transposed = found
        in_f, out_f = captured.params[name].shape[::-1] if transposed else captured.params[name].shape
    else:
        return None
    if not isinstance(x, fx.Node):
        return None
    module_path = name.rsplit(".", 1)[0] if "." in name else ""
    return Projection(node, x, name, module_path, int(in_f), int(out_f))


def find_projections(captured: CapturedGraph) -> dict[fx.Node, Projection]:
    """Every weight projection of the graph, keyed by its output node."""
    found = {}
    for node in captured.graph.nodes:
        proj = _as_projection(node, captured)
        if proj is not None:
            found[node] = proj
    return found
