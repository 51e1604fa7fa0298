"""``wide::attn_mask_extents``: the row extents of a boolean attention mask, computed once per forward.

``wide::attn_mask_extents(attn_mask, kv_len) -> Tensor`` (int32 ``[Bm, Hm, Tm, 3]`` over the mask's own batch, head
and query axes: first and last visible key of each row, and whether it sees every key between) is what the prefill
attention template derives from ``attn_mask`` before its main loop (``templates/attention_mask_extents.py``). Every
layer of a model attends with the same mask, so ``passes/mask_extents_sharing.py`` computes the extents once and
passes them to each ``wide::group_attention`` (``attn_mask_extents=``), instead of one extents launch per layer.

On CUDA the Triton kernel; elsewhere the PyTorch reference (the CPU attention path ignores the extents). No
gradient: boolean in, integers out.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _check(attn_mask: Tensor) -> None:
    if attn_mask.dtype != torch.bool or not 2 <= attn_mask.dim() <= 4:
        raise ValueError(f"attn_mask_extents: attn_mask must be a 2-4-D boolean mask, got {attn_mask.dtype} of shape "
                         f"{tuple(attn_mask.shape)}")


@torch.library.custom_op("wide::attn_mask_extents", mutates_args=())
def attn_mask_extents(attn_mask: Tensor, kv_len: int) -> Tensor:
    """int32 ``[Bm, Hm, Tm, 3]`` row extents of ``attn_mask`` over ``kv_len`` keys (see the module docstring)."""
    _check(attn_mask)
    from wide_compile.templates.attention_mask_extents import mask_extents_reference, mask_rows_over_keys

    return mask_extents_reference(mask_rows_over_keys(attn_mask, kv_len))


@attn_mask_extents.register_kernel("cuda")
def _(attn_mask, kv_len):
    _check(attn_mask)
    from wide_compile.templates.attention_mask_extents import attn_mask_extents as extents

    return extents(attn_mask, kv_len)


@attn_mask_extents.register_fake
def _(attn_mask, kv_len):
    _check(attn_mask)
    from wide_compile.templates.attention_mask_extents import mask_row_shape

    return attn_mask.new_empty((*mask_row_shape(attn_mask), 3), dtype=torch.int32)


__all__ = ["attn_mask_extents"]
