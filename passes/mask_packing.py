"""One tensor for all realized masks of a forward.

During a forward each routed block keeps its mask on ``block.mask``: the router's pre-hook writes it, the masked
projection's pre-hook reads it. After the last routed block's projection has read its mask, :func:`pack_masks`
joins all of them along the group axis into ``state.packed_masks`` ``[..., sum of groups]`` and clears
``block.mask``; ``WideState.packed`` and ``wide_compile.realized_masks`` return views of it. Under ``torch.compile`` each Python attribute
written in the graph is a graph output: one mask per routed block before (60 for SmolLM2's 30 layers, each rebuilt
by the CUDA-graph runtime on every call), now one. Masks whose leading shapes or dtypes differ stay on the blocks.

The join is a cat of cats of at most ``CHUNK`` masks. Inductor copies each input of a cat of more than 8 inputs
(``max_pointwise_cat_inputs``) in its own kernel: 64 launches per forward for Llama-3-8B's 64 masks (0.13 ms and
64 gaps per 4096-token prefill on the H200, ``benchmarks/notes_e2e.md``). A cat of at most 8 masks is one kernel
with a masked load per input; with 7 per chunk a model with more than 56 masks has more than 8 chunks, so the outer
cat writes each chunk's kernel straight into its slice instead of fusing all of them into one kernel with a masked
load per mask for every element. Eager and CPU results are the same either way.
"""
from __future__ import annotations

import torch

from wide_compile.state import WideState

CHUNK = 7  # masks per inner cat (see module docstring)


def _join(masks: list[torch.Tensor]) -> torch.Tensor:
    if len(masks) <= CHUNK:
        return torch.cat(masks, dim=-1)
    return torch.cat([torch.cat(masks[i:i + CHUNK], dim=-1) for i in range(0, len(masks), CHUNK)], dim=-1)


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
    state.packed_masks = _join([b.mask for b in blocks])
    state.mask_layout = tuple(layout)
    for block in blocks:
        block.mask = None


__all__ = ["pack_masks"]
