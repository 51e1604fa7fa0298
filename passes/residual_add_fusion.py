"""Residual connections added by the projection's GEMM: ``r + masked_input_linear(...)`` -> ``masked_input_linear_add_``.

A decoder layer ends each sublayer with ``hidden = residual + proj(...)``; after the lowering, ``proj`` is a
``wide::masked_input_linear`` (output and down projections), which on CUDA runs cuBLAS above 16 tokens. Inductor then
fuses the addition into the next RMSNorm's kernel, which reads the projection's output and the residual and writes
both the sum and the normalised value. With

    wide::masked_input_linear_add_(residual, x, mask, W, None, gs, x_is_masked)     # residual += proj, in place

the GEMM adds the residual in its epilogue (``addmm_``, ``beta = 1``): the projection's output is never written nor
read back, 32 MB per sublayer for a 4096-token prefill of Llama-3-8B, and the norm's kernel reads one tensor instead
of two. Later readers of the sum read ``residual`` itself.

Rewritten only where that is valid and pays:
- the projection's only user is the addition ``add(r, y)`` / ``add(y, r)`` (no ``alpha``), with ``r`` of the same
  shape, dtype and device, and no bias (a bias would be one more pass over the output);
- nothing needs a gradient (inference graphs: the op has no autograd formula);
- a static token count of at least ``MIN_TOKENS`` on a CUDA device (up to 16 tokens the projection is a GEMV, where
  the addition would be one more launch; measured at 1024, 4096 and 16384 tokens, not at batched decode);
- ``r`` is the graph's own intermediate that nothing reads after the projection: produced by an addition, a
  multiplication or an embedding lookup (a residual stream), not a graph input or a view of one (an in-place update
  of a user's tensor), and every other reader of ``r``, or of anything that may be a view of it, comes before the
  projection in the graph.
AOTAutograd functionalizes the in-place op; Inductor's reinplacing then runs it on ``r``'s buffer.
"""
from __future__ import annotations

import operator

import torch
from torch import fx

from .torch_patterns import arg, example_value, static_tokens

MIN_TOKENS = 1024  # (see module docstring)
DEVICES = ("cuda",)  # device types where the GEMM adds the residual (tests add "cpu")
_ADDS = (operator.add, torch.add)
_RESIDUAL_SOURCES = (operator.add, torch.add, operator.mul, torch.mul, torch.nn.functional.embedding)


def _addend(add: fx.Node, proj: fx.Node) -> fx.Node | None:
    """The other operand of ``add`` when it is ``proj + r`` or ``r + proj`` with no alpha, else None."""
    if add.op != "call_function" or add.target not in _ADDS or add.kwargs or len(add.args) != 2:
        return None
    a, b = add.args
    other = b if a is proj else a if b is proj else None
    return other if isinstance(other, fx.Node) and other is not proj else None


def _why_not(proj: fx.Node, add: fx.Node, residual: fx.Node | None, order: dict,
             devices: tuple[str, ...]) -> str | None:
    """Why ``add = residual + proj`` may not become ``masked_input_linear_add_``, or None."""
    if residual is None:
        return "not added to a residual"
    if arg(proj, 3, "bias") is not None:
        return "the projection has a bias"
    y, r = example_value(proj), example_value(residual)
    if y is None or r is None:
        return "no known tensor values"
    if r.shape != y.shape or r.dtype != y.dtype or r.device != y.device:
        return "residual and projection differ in shape, dtype or device"
    if y.requires_grad or r.requires_grad:
        return "a gradient is needed"
    tokens = static_tokens(y)
    if tokens is None or tokens < MIN_TOKENS or y.device.type not in devices:
        return "fewer than MIN_TOKENS tokens, dynamic shapes, or not on a CUDA device"
    if residual.op != "call_function" or residual.target not in _RESIDUAL_SOURCES:
        return "the residual is not a sum, product or embedding of this graph"
    if any(order[u] > order[proj] for node in _aliases(residual) for u in node.users if u is not add):
        return "the residual (or a view of it) is read after the projection"
    return None


_MAY_ALIAS = {"view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "expand", "flatten", "unflatten",
              "contiguous", "to", "type_as", "float", "half", "bfloat16", "getitem", "narrow", "select", "split",
              "chunk", "t", "detach", "view_as", "expand_as", "as_strided", "unbind", "movedim", "swapaxes",
              "__getitem__", "alias"}


def _aliases(node: fx.Node) -> list[fx.Node]:
    """``node`` and every node reachable from it through ops that may return a view of their input (conservative: a
    later read of any of them would see the in-place update)."""
    seen, stack = [node], [node]
    while stack:
        for user in stack.pop().users:
            name = user.target if isinstance(user.target, str) else getattr(user.target, "__name__", "")
            if user not in seen and name.split(".")[0] in _MAY_ALIAS:
                seen.append(user)
                stack.append(user)
    return seen


def fuse_residual_adds(graph: fx.Graph, devices: tuple[str, ...] | None = None) -> int:
    """Rewrite each valid ``residual + masked_input_linear(...)`` of ``graph`` (see module docstring); returns how
    many."""
    devices = DEVICES if devices is None else devices
    fused = 0
    for proj in [n for n in graph.nodes
                 if n.op == "call_function" and n.target is torch.ops.wide.masked_input_linear.default]:
        if len(proj.users) != 1:
            continue
        (add,) = proj.users
        residual = _addend(add, proj)
        order = {node: i for i, node in enumerate(graph.nodes)}
        if _why_not(proj, add, residual, order, devices) is not None:
            continue
        x, mask, weight = (arg(proj, i, name) for i, name in enumerate(("x", "mask", "weight")))
        group_size, x_is_masked = arg(proj, 4, "group_size"), arg(proj, 5, "x_is_masked", False)
        with graph.inserting_before(proj):
            graph.call_function(torch.ops.wide.masked_input_linear_add_.default,
                                (residual, x, mask, weight, None, group_size, x_is_masked))
        add.replace_all_uses_with(residual)
        graph.erase_node(add)
        graph.erase_node(proj)
        fused += 1
    return fused


__all__ = ["fuse_residual_adds"]
