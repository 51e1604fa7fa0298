"""Compute the rotary embedding's cos / sin table once per forward (``wide::realize`` after it).

A transformers model computes ``cos`` / ``sin`` of ``position * inv_freq`` once per forward, scales them and casts
them to the model's dtype; every layer's RoPE reads the result. Inductor inlines that pointwise chain into each
layer's RoPE kernel, so the transcendental functions run again in every layer for every element of every head (the
CPU output code shows it; on the GPU the per-layer RoPE / cache-write kernel of a 4096-token prefill takes about
0.1 ms). This pass finds each ``cos`` / ``sin`` call whose single-user chain of casts and scalings ends at a value
used more than once, and routes those users through ``wide::realize`` (``wide_compile.realize_op``): Inductor must
then store the table, and the layers load it.

Left alone: ``cos`` / ``sin`` with one consumer (nothing is recomputed), chains through anything but the listed
casts and elementwise scalings, and tables of at most ``MAX_INLINE_ROWS`` positions in a static-shape graph (a decode
step: recomputing one row per layer costs less than the two extra launches).
"""
from __future__ import annotations

import operator

import torch
from torch import fx

import wide_compile.realize_op  # noqa: F401  (registers wide::realize)

from .torch_patterns import example_value

MAX_INLINE_ROWS = 16

_TRIG_METHODS = {"cos", "sin"}
_TRIG_FUNCTIONS = {torch.cos, torch.sin, torch.ops.aten.cos.default, torch.ops.aten.sin.default}
_CHAIN_METHODS = {"to", "type", "float", "half", "bfloat16", "mul", "__mul__", "contiguous"}
_CHAIN_FUNCTIONS = {operator.mul, torch.mul}


def _is_trig(node: fx.Node) -> bool:
    return ((node.op == "call_method" and node.target in _TRIG_METHODS)
            or (node.op == "call_function" and node.target in _TRIG_FUNCTIONS))


def _continues(node: fx.Node, prev: fx.Node) -> bool:
    """Whether ``node`` is an elementwise cast / scaling of ``prev`` (its only tensor input)."""
    if node.op == "call_method" and node.target in _CHAIN_METHODS:
        return node.args[0] is prev and not any(isinstance(a, fx.Node) for a in (*node.args[1:], *node.kwargs.values()))
    if node.op == "call_function" and node.target in _CHAIN_FUNCTIONS:
        tensors = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, fx.Node)]
        return tensors == [prev]
    return False


def _table_end(trig: fx.Node) -> fx.Node:
    """The last node of the single-user cast / scaling chain after ``trig``."""
    node = trig
    while len(node.users) == 1:
        (user,) = node.users
        if not _continues(user, node):
            break
        node = user
    return node


def _few_rows(node: fx.Node) -> bool:
    """Whether ``node``'s value is known to hold at most ``MAX_INLINE_ROWS`` rows of its last dimension."""
    value = example_value(node)
    if value is None or value.dim() == 0 or not all(isinstance(d, int) for d in value.shape):
        return False
    return value.numel() // max(1, value.shape[-1]) <= MAX_INLINE_ROWS


def realize_rotary_tables(graph: fx.Graph) -> int:
    """Insert ``wide::realize`` after each shared cos / sin table (see the module docstring); returns how many."""
    done = 0
    for trig in [n for n in graph.nodes if _is_trig(n)]:
        end = _table_end(trig)
        if len(end.users) < 2 or _few_rows(end):
            continue
        with graph.inserting_after(end):
            stored = graph.call_function(torch.ops.wide.realize.default, (end,))
        stored.meta = dict(end.meta)  # the same value (later passes read its example_value)
        end.replace_all_uses_with(stored, delete_user_cb=lambda user: user is not stored)
        done += 1
    return done


__all__ = ["realize_rotary_tables"]
