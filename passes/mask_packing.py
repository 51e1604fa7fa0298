"""One tensor for all realized masks of a forward.

During a forward each routed block keeps its mask on ``block.mask``: the router's pre-hook writes it, the masked
projection's pre-hook reads it. After the last routed block's projection has read its mask, :func:`pack_masks`
joins all of them along the group axis into ``state.packed_masks`` ``[..., sum of groups]`` and clears
``block.mask``; ``WideState.packed`` and ``wide_compile.realized_masks`` return views of it. Under ``torch.compile`` each Python attribute
written in the graph is a graph output: one mask per routed block before (60 for SmolLM2's 30 layers, each rebuilt
by the CUDA-graph runtime on every call), now one. Masks whose leading shapes or dtypes differ stay on the blocks.
"""
from __future__ import annotations

import torch

from wide_compile.state import WideState


def pack_masks(state: WideState) -> None:
    """Join the blocks' current masks into ``state.packed_masks`` and clear them (see module docstring)."""
    blocks = [b for b in state.blocks if b.mask is not None]
    if not blocks:
        return
    first = blocks[0].mask
    if any(b.mask.shape[:-1] != first.shape[:-1] or b.mask.dtype != first.dtype for b in blocks):
        return
    layout, start = [], 0
    for block in blocks:
        layout.append((block.key, start, block.groups))
        start += block.groups
    state.packed_masks = torch.cat([b.mask for b in blocks], dim=-1)
    state.mask_layout = tuple(layout)
    for block in blocks:
        block.mask = None


__all__ = ["pack_masks"]
