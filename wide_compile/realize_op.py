"""``wide::realize``: a copy that Inductor cannot inline, so its input is computed once and stored.

Inductor inlines a cheap pointwise producer into each of its consumers: the rotary embedding's ``cos`` / ``sin`` of
``position * inv_freq`` ([B, T, head_dim], computed once per forward by the model) is then evaluated again inside
every layer's RoPE kernel, per element of every head. ``passes/rotary_realize.py`` puts ``wide::realize`` after the
rotary table so that it is computed once per forward and the layers load it. The op is ``x.clone()`` (any device),
with an identity gradient.
"""
from __future__ import annotations

import torch
from torch import Tensor


@torch.library.custom_op("wide::realize", mutates_args=())
def realize(x: Tensor) -> Tensor:
    """A copy of ``x`` (see the module docstring)."""
    return x.clone()


@realize.register_fake
def _(x):
    return torch.empty_like(x)


def _backward(ctx, grad: Tensor) -> Tensor:
    return grad


realize.register_autograd(_backward)

__all__ = ["realize"]
