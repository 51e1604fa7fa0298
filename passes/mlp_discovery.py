"""Find feed-forward blocks by dataflow: in-projections -> activation (x gate) -> down projection."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx

from .graph_utils import bfs, canonical, tensor_inputs
from .projections import Projection

aten = torch.ops.aten

_ACTIVATIONS = {
    aten.silu.default: "silu", aten.relu.default: "relu", aten.gelu.default: "gelu",
    aten.sigmoid.default: "sigmoid", aten.tanh.default: "tanh", aten.mish.default: "mish",
}
_MULS = {aten.mul.Tensor, aten.mul_.Tensor}


@dataclass
class MlpMatch:
    """Graph-level view of one MLP block."""

    in_projs: list[Projection]
    down: Projection
    gated: bool
    activation: str


def _region(down: Projection, projections: dict) -> list[fx.Node]:
    return bfs([down.input], tensor_inputs, stop=lambda n: n in projections)


def _activation_name(region: list[fx.Node]) -> str:
    names = []
    for node in region:
        if node.target in _ACTIVATIONS:
            name = _ACTIVATIONS[node.target]
            if name == "gelu" and node.kwargs.get("approximate", "none") == "tanh":
                name = "gelu_tanh"
            names.append(name)
    if "tanh" in names and any(n.target is aten.pow.Tensor_Scalar for n in region):
        return "gelu_tanh"  # GPT-2's gelu_new written out as pow/mul/add/tanh
    return names[0] if names else "unknown"


_SPLITS = {aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default, aten.slice.Tensor,
           aten.unbind.int, aten.narrow.default}


def _is_fused_gated(region: list[fx.Node], proj: Projection, width: int) -> bool:
    """One projection whose output is split in two halves that are multiplied (Phi-3 ``gate_up_proj``)."""
    if proj.out_features != 2 * width:
        return False
    return any(n.target in _SPLITS and canonical(n.args[0]) is proj.node for n in region)


def _is_gated(region: list[fx.Node], projections: dict, in_projs: list[Projection], width: int) -> bool:
    """act(gate(x)) * up(x): a product of two tensors from different projections (or halves of one)."""
    if len(in_projs) == 1:
        return _is_fused_gated(region, in_projs[0], width)
    region_set = set(region)
    for node in region:
        if node.target not in _MULS or len(node.args) < 2:
            continue
        a, b = node.args[0], node.args[1]
        if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
            continue
        if a not in region_set or b not in region_set:
            continue
        reach_a = {n for n in bfs([a], tensor_inputs, stop=lambda n: n in projections) if n in projections}
        reach_b = {n for n in bfs([b], tensor_inputs, stop=lambda n: n in projections) if n in projections}
        if reach_a and reach_b and reach_a != reach_b and a.meta["val"].shape == b.meta["val"].shape:
            return True
    return False


def find_mlp(candidates: list[Projection], projections: dict[fx.Node, Projection],
             order: dict[fx.Node, int]) -> list[MlpMatch]:
    """MLPs among ``candidates`` (projections of one layer not claimed by attention)."""
    by_node = {p.node: p for p in candidates}
    matches = []
    for down in candidates:
        region = _region(down, projections)
        reached = [n for n in region if n in projections]
        if not reached or any(n not in by_node or n is down.node for n in reached):
            continue
        in_projs = [by_node[n] for n in sorted(reached, key=order.__getitem__)]
        matches.append(MlpMatch(in_projs, down, _is_gated(region, projections, in_projs, down.in_features), _activation_name(region)))
    return matches
