"""Pure-PyTorch references of the group-skipping linear ops (dense-then-mask math in fp32).

Conventions shared with the kernels:
- ``mask[M, G]`` (bool or any dtype, nonzero = active); group ``g`` covers columns/channels
  ``[g * group_size, (g + 1) * group_size)`` of the grouped dimension.
- Inputs may carry leading batch dims (``x[..., K]``, ``mask[..., G]``): they are flattened.
- Outputs are returned in ``x.dtype``; inactive outputs are exactly 0 (never NaN-propagating).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def expand_group_mask(mask: torch.Tensor, group_size: int) -> torch.Tensor:
    """``mask[M, G]`` -> bool ``[M, G * group_size]`` (each group repeated over its columns)."""
    return (mask != 0).repeat_interleave(group_size, dim=-1)


def apply_activation(v: torch.Tensor, activation: str) -> torch.Tensor:
    """The gate activation in fp32 math; ``gelu_tanh`` is the tanh approximation."""
    if activation == "silu":
        return F.silu(v)
    if activation == "gelu":
        return F.gelu(v)
    if activation == "gelu_tanh":
        return F.gelu(v, approximate="tanh")
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def _flat(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.reshape(-1, x.shape[-1]), mask.reshape(-1, mask.shape[-1])


def output_group_linear_reference(
    x: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor, group_size: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``y = (x @ W.T + b)`` on active output groups of each token, exactly 0 elsewhere."""
    lead = x.shape[:-1]
    x2, m2 = _flat(x, mask)
    y = F.linear(x2.float(), weight.float(), None if bias is None else bias.float())
    y = torch.where(expand_group_mask(m2, group_size), y, torch.zeros((), dtype=y.dtype, device=y.device))
    return y.to(x.dtype).reshape(*lead, weight.shape[0])


def input_group_linear_reference(
    x: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor, group_size: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``y = (x * mask expanded over K) @ W.T + b``: each token reduces over its active input groups only."""
    lead = x.shape[:-1]
    x2, m2 = _flat(x, mask)
    xm = torch.where(expand_group_mask(m2, group_size), x2.float(), torch.zeros((), device=x2.device))
    y = F.linear(xm, weight.float(), None if bias is None else bias.float())
    return y.to(x.dtype).reshape(*lead, weight.shape[0])


def gated_up_groups_reference(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    activation: str = "silu",
) -> torch.Tensor:
    """``h = act(x @ Wg.T) * (x @ Wu.T)`` on active output groups, exactly 0 elsewhere."""
    lead = x.shape[:-1]
    x2, m2 = _flat(x, mask)
    xf = x2.float()
    h = apply_activation(F.linear(xf, w_gate.float()), activation) * F.linear(xf, w_up.float())
    h = torch.where(expand_group_mask(m2, group_size), h, torch.zeros((), dtype=h.dtype, device=h.device))
    return h.to(x.dtype).reshape(*lead, w_gate.shape[0])
