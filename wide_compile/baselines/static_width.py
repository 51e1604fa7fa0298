"""Static width baseline (FLAP / Wanda-sp style): the same head / channel groups are kept for every token.

The model gets the WIDE structure (same group layout as :func:`wide_compile.apply`), then a fixed mask per
block, chosen by :mod:`wide_compile.models.static_width` from calibration activations, is installed as a
forced decision (a callable that broadcasts the block's mask to every token).  Routers never run.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

BlockKey = tuple[int, str]


class StaticMasks:
    """Forced-decision callable: ``fn(block, mask_shape)`` returns the block's fixed mask for every token."""

    def __init__(self, masks: dict[BlockKey, Tensor], importance: dict[BlockKey, Tensor] | None = None):
        self.masks = {key: mask.detach().float().cpu() for key, mask in masks.items()}
        self.importance = importance or {}

    def __call__(self, block, shape: tuple) -> Tensor:
        mask = self.masks.get(block.key)
        if mask is None:
            raise KeyError(f"no static mask for block {block.key}")
        if mask.numel() != shape[-1]:
            raise ValueError(f"static mask of {block.key} has {mask.numel()} groups, the block has {shape[-1]}")
        return mask.expand(shape)

    def kept_groups(self) -> dict[BlockKey, list[int]]:
        return {key: torch.nonzero(mask).flatten().tolist() for key, mask in self.masks.items()}

    def sparsity(self) -> float:
        """Mean over blocks of the skipped fraction of groups."""
        return float(torch.stack([1.0 - m.mean() for m in self.masks.values()]).mean())


def apply_static_width(model: nn.Module, sparsity: float, calibration_batches: Iterable,
                       **apply_kwargs: Any) -> nn.Module:
    """Prune ``model`` to a fixed width: every block keeps ``round((1 - sparsity) * G)`` groups for all tokens.

    Args:
        model: an HF causal LM (not yet transformed).
        sparsity: fraction of groups removed in every block, in [0, 1).
        calibration_batches: input-id tensors ``[batch, seq]`` or dicts with ``input_ids`` (and optionally
            ``attention_mask``), e.g. from :func:`wide_compile.baselines.calibration_batches`.
        apply_kwargs: group layout etc. for :func:`wide_compile.apply` (``attn_group_size``,
            ``ffn_group_size``, ``blocks``); the layout is the same as WIDE's for the same arguments.

    Returns:
        The model, transformed by ``wide_compile.apply`` and forced to its static masks
        (``static_masks(model)`` gives them; ``wide_compile.set_forced(model, None)`` would hand control
        back to the untrained routers).
    """
    import wide_compile
    from wide_compile.models.static_width import group_importance, kept_group_count, select_groups
    from wide_compile.state import get_state

    kept_group_count(1, sparsity)  # validates sparsity before any work
    wide_compile.apply(model, sparsity, **apply_kwargs)
    state = get_state(model)
    try:
        was_training = model.training
        model.eval()
        with wide_compile.forced(model, "execute"):
            importance = group_importance(model, state.blocks, calibration_batches)
        model.train(was_training)
    except Exception:
        wide_compile.remove(model)
        raise
    wide_compile.set_forced(model, StaticMasks(select_groups(importance, sparsity), importance))
    return model


def static_masks(model: nn.Module) -> StaticMasks:
    """The :class:`StaticMasks` installed by :func:`apply_static_width`."""
    from wide_compile.state import get_state

    forced = get_state(model).forced
    if not isinstance(forced, StaticMasks):
        raise ValueError("this model has no static width masks (use apply_static_width)")
    return forced
