"""The WIDE training loss: LM cross-entropy + ``weight * |target - realized skip rate|``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from wide_compile.state import realized_masks, skip_rate_tensors


@dataclass(frozen=True)
class SkipTargets:
    """Target skip rate: one for the mean over attention and MLP, or one per kind."""

    mean: float
    attention: float | None = None
    mlp: float | None = None

    @property
    def separate(self) -> bool:
        return self.attention is not None


def realized_skip_rates(model: nn.Module, token_mask: Tensor | None = None) -> dict[str, Tensor]:
    """Differentiable skip rates of the last forward: ``{"attention", "mlp", "mean"}`` (kinds present only).

    Without ``token_mask`` this is :func:`wide_compile.skip_rate_tensors`. With a ``[batch, seq]`` mask
    (document mode), padding positions are left out of every block's rate.
    """
    if token_mask is None:
        return skip_rate_tensors(model)
    per_kind: dict[str, list[Tensor]] = {}
    weights = token_mask.float()
    for (_, kind), mask in realized_masks(model).items():
        groups = mask.shape[-1]
        mask = mask.float().reshape(*weights.shape, groups)
        executed = (mask * weights[..., None]).sum() / (weights.sum() * groups).clamp_min(1.0)
        per_kind.setdefault(kind, []).append(1.0 - executed)
    if not per_kind:
        raise RuntimeError("no realized masks yet: run a forward pass first")
    rates = {kind: torch.stack(v).mean() for kind, v in per_kind.items()}
    rates["mean"] = torch.stack(list(rates.values())).mean()
    return rates


def skip_penalty(rates: dict[str, Tensor], targets: SkipTargets) -> Tensor:
    """``|target - rate|`` on the mean rate, or the average of the per-kind deviations with separate targets."""
    if not targets.separate:
        return (targets.mean - rates["mean"]).abs()
    terms = [(target - rates[kind]).abs() for kind, target in (("attention", targets.attention),
                                                                 ("mlp", targets.mlp)) if kind in rates]
    return torch.stack(terms).mean()


def wide_loss(ce: Tensor, rates: dict[str, Tensor], targets: SkipTargets, weight: float) -> Tensor:
    return ce + weight * skip_penalty(rates, targets)
