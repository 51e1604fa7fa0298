"""Turn router logits (or forced decisions) into per-token group masks."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from . import ops
from .state import RoutedBlock, WideState


def _forced_mask(state: WideState, block: RoutedBlock, shape: tuple, like: Tensor) -> Tensor:
    forced = state.forced
    if forced == "execute":
        return like.new_ones(shape)
    if forced == "skip":
        return like.new_zeros(shape)
    if isinstance(forced, Mapping):
        if block.key not in forced:
            raise KeyError(f"forced masks have no entry for {block.key}; give one for every routed block")
        mask = forced[block.key]
    else:
        mask = forced(block, shape)
    mask = torch.as_tensor(mask, device=like.device)
    if mask.numel() != torch.Size(shape).numel():
        raise ValueError(f"forced mask for {block.key} has shape {tuple(mask.shape)}, expected {shape}")
    return mask.reshape(shape).to(like.dtype)


def decide(state: WideState, block: RoutedBlock, x: Tensor) -> Tensor:
    """The mask ``[..., groups]`` of one block for router input ``x[..., hidden]``."""
    shape = (*x.shape[:-1], block.groups)
    if state.forced is not None:
        return _forced_mask(state, block, shape, x)
    router = block.router
    logits = router(x)
    noise = ops.gumbel_noise(logits) if router.training else None
    tau = _temperature(router, logits, noise)
    if state.config.budget == "topk":
        return ops.topk_gate(logits, noise, tau, state.config.kept_groups(block.groups))
    return ops.threshold_gate(logits, noise, tau)


def _temperature(router, logits: Tensor, noise: Tensor | None) -> Tensor:
    """The router's temperature buffer where it matters: with Gumbel noise or when a gradient may flow (the
    straight-through estimator divides by it). A noise-free hard decision without autograd does not depend on it, so
    there a constant stands in: under ``torch.compile`` the buffer would otherwise be a graph input whose tensor guard
    Dynamo checks on every call through the hook objects that reach it (``skip_guard_eval_unsafe`` keeps tensor
    guards of buffers), which made the WIDE call's guard check several times the dense model's."""
    if noise is not None or torch.is_grad_enabled():
        return router.tau
    # not router.tau's dtype (reading it would guard the buffer), nor logits.new_ones (a second user of the logits
    # would keep passes/router_lowering.py from fusing the decision)
    return torch.ones((), dtype=torch.float32, device=logits.device)
