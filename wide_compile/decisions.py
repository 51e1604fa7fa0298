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
    if state.config.budget == "topk":
        return ops.topk_gate(logits, noise, router.tau, state.config.kept_groups(block.groups))
    return ops.threshold_gate(logits, noise, router.tau)
