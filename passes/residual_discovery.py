"""Find the residual stream a sub-block reads and the module through which that residual enters it."""

from __future__ import annotations

from collections import deque

import torch
from torch import fx

from .errors import DiscoveryError
from .graph_utils import ancestors, canonical, is_noop_cast, module_stack, tensor_users

aten = torch.ops.aten
_ADDS = {aten.add.Tensor, aten.add_.Tensor}


def find_residual(block_output: fx.Node, block_input: fx.Node, layer: str, what: str) -> fx.Node:
    """The residual ``r`` with ``layer_out = r + f(block(norm(r)))``, searched forward from the block output.

    ``r`` is the other operand of the first addition downstream of ``block_output`` whose other operand is
    an ancestor of ``block_input`` (so parallel blocks, post-norms and scalings in between are all fine).
    """
    upstream = ancestors(block_input)
    seen = {block_output}
    queue = deque([block_output])
    while queue:
        node = queue.popleft()
        for user in tensor_users(node):
            if user in seen or not _inside(user, layer):
                continue
            seen.add(user)
            if user.op == "call_function" and user.target in _ADDS:
                others = [a for a in user.args[:2] if isinstance(a, fx.Node) and a not in seen]
                for other in (term for o in others for term in _sum_terms(o)):
                    if other in upstream or canonical(other) in upstream:
                        return canonical(other)
            queue.append(user)
    raise DiscoveryError(f"layer {layer}: no residual connection found around the {what} block")


def _sum_terms(node: fx.Node) -> list[fx.Node]:
    """Terms of a (nested) sum, so ``(r + attn) + mlp`` exposes ``r`` to the MLP's search (Cohere)."""
    if node.op == "call_function" and node.target in _ADDS and "alpha" not in node.kwargs:
        terms = [a for a in node.args[:2] if isinstance(a, fx.Node)]
        return [node] + [t for term in terms for t in _sum_terms(term)]
    return [node]


def _inside(node: fx.Node, layer: str) -> bool:
    return any(p == layer or p.startswith(layer + ".") for p in module_stack(node))


def _aliases(node: fx.Node) -> list[fx.Node]:
    out, queue = [node], [node]
    while queue:
        cur = queue.pop()
        for user in cur.users:
            if is_noop_cast(user) and user.args[0] is cur:
                out.append(user)
                queue.append(user)
    return out


def router_source(residual: fx.Node, consumers: list[fx.Node], projection_modules: set[str],
                  layer: str, what: str) -> str:
    """The innermost module that the residual enters on its way to the block (usually the input norm).

    ``consumers`` are the block's first projection nodes; modules owning a projection are never chosen,
    so that PEFT wrapping a projection leaves the router input alone. A forward pre-hook on the returned
    module sees the residual as its first input in eager mode.
    """
    upstream = set(consumers).union(*(ancestors(c) for c in consumers))
    aliases = _aliases(residual)
    outer = set(module_stack(residual))
    sources = set()
    for alias in aliases:
        for user in alias.users:
            if user in aliases or user not in upstream:
                continue
            entered = [p for p in module_stack(user) if p not in outer and p not in projection_modules]
            if entered:
                sources.add(entered[-1])
    if len(sources) != 1:
        raise DiscoveryError(
            f"layer {layer}: the residual before the {what} block enters "
            f"{sorted(sources) or 'no module'} on its way to the block (need exactly one module, e.g. its norm)"
        )
    return sources.pop()
