"""Small, architecture-agnostic queries on an aten-level FX graph."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable

import torch
from torch import fx

aten = torch.ops.aten

# Ops that only change how a tensor is viewed/laid out (element order preserved per token and channel).
LAYOUT_OPS = {
    aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.transpose.int,
    aten.permute.default, aten.contiguous.default, aten.clone.default, aten.alias.default,
    aten.flatten.using_ints, aten.unflatten.int, aten.dropout.default, aten.to.dtype,
    aten.to.dtype_layout, aten._to_copy.default, aten.to.device, aten.expand.default,
}


def tensor_value(node: fx.Node) -> torch.Tensor | None:
    """The (fake) tensor a node produces, or None for non-tensor nodes."""
    val = node.meta.get("val")
    return val if isinstance(val, torch.Tensor) else None


def carries_tensors(node: fx.Node) -> bool:
    """True for tensor nodes and for nodes producing a tuple/list of tensors (split, chunk).

    Reads ``meta["val"]`` (torch.export graphs) or ``meta["example_value"]`` (Dynamo graphs)."""
    val = node.meta.get("val", node.meta.get("example_value"))
    if isinstance(val, torch.Tensor):
        return True
    return isinstance(val, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in val)


def shape(node: fx.Node) -> tuple[int, ...]:
    val = tensor_value(node)
    if val is None:
        raise TypeError(f"node {node.name} does not produce a tensor")
    return tuple(int(s) for s in val.shape)


def tensor_inputs(node: fx.Node) -> list[fx.Node]:
    """Tensor-valued nodes among a node's (possibly nested) arguments."""
    found: list[fx.Node] = []

    def visit(arg):
        if isinstance(arg, fx.Node):
            if carries_tensors(arg):
                found.append(arg)
        elif isinstance(arg, (list, tuple)):
            for item in arg:
                visit(item)
        elif isinstance(arg, dict):
            for item in arg.values():
                visit(item)

    visit(node.args)
    visit(node.kwargs)
    return found


def is_noop_cast(node: fx.Node) -> bool:
    """A ``to``/alias node whose output has the input's dtype and device (the same tensor in eager)."""
    if node.op != "call_function" or node.target not in (
        aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten._to_copy.default, aten.alias.default
    ):
        return False
    src = node.args[0]
    if not isinstance(src, fx.Node) or tensor_value(src) is None:
        return False
    a, b = tensor_value(src), tensor_value(node)
    return a.dtype == b.dtype and a.device == b.device and tuple(a.shape) == tuple(b.shape)


def canonical(node: fx.Node) -> fx.Node:
    """Follow no-op casts back to the node that really produced the value."""
    while is_noop_cast(node):
        node = node.args[0]
    return node


def module_stack(node: fx.Node) -> list[str]:
    """Module paths (outermost first) of the modules whose forward produced this node."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = []
    for path, _type in stack.values():
        path = _normalise_path(path)
        if path:
            paths.append(path)
    return paths


def _normalise_path(path: str) -> str:
    # export gives "model.layers.0.mlp"; dynamo-style stacks give "L['self'].model.layers[0].mlp"
    path = re.sub(r"^L\['[^']+'\]\.?", "", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path)
    return path.strip(".")


def layer_path(module_path: str) -> str | None:
    """The repeated-layer prefix of a module path (``model.layers.3`` for ``model.layers.3.mlp.up``):
    everything up to its last numeric component, or None when it has none."""
    parts = module_path.split(".")
    last = None
    for i, part in enumerate(parts):
        if part.isdigit():
            last = i
    return ".".join(parts[: last + 1]) if last is not None else None


def bfs(start: Iterable[fx.Node], step: Callable[[fx.Node], Iterable[fx.Node]],
        stop: Callable[[fx.Node], bool] = lambda n: False) -> list[fx.Node]:
    """Breadth-first walk; nodes for which ``stop`` holds are visited but not expanded."""
    seen: dict[fx.Node, None] = {}
    queue = deque(start)
    while queue:
        node = queue.popleft()
        if node in seen:
            continue
        seen[node] = None
        if stop(node):
            continue
        queue.extend(step(node))
    return list(seen)


def ancestors(node: fx.Node, stop: Callable[[fx.Node], bool] = lambda n: False) -> set[fx.Node]:
    """All tensor nodes ``node`` depends on (including itself)."""
    return set(bfs([node], tensor_inputs, stop))


def tensor_users(node: fx.Node) -> list[fx.Node]:
    """Users of a node that carry tensors onwards."""
    return [u for u in node.users if carries_tensors(u)]
