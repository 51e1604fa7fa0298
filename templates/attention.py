"""Public entry point for head-group-masked attention: checks inputs, then dispatches decode or prefill.

``group_attention(q, k, v, head_mask, causal=True, scale=None)`` computes, for ``q[B, Hq, T, D]``,
``k/v[B, Hkv, S, D]`` (GQA: ``Hkv`` divides ``Hq``) and ``head_mask[B, T, G]`` (nonzero = active, ``G`` divides
``Hq``, group ``g`` = query heads ``[g*Hq/G, (g+1)*Hq/G)``), softmax attention for every active (token, group) pair and
exact zeros for inactive ones. Causal with ``T < S`` places query ``t`` at position ``S - T + t``.

Dispatch: few new tokens (``T <= 16`` and ``(Hq / Hkv) * T <= 128``) use the split-KV decode kernel, everything else
the row-compacting flash prefill kernel. On CPU without ``TRITON_INTERPRET=1`` the pure-PyTorch reference runs.
"""

from __future__ import annotations

import torch

from .attention_checks import allocate_output, check_attention_inputs, interpreting
from .attention_compact import check_row_order
from .attention_decode import MAX_DECODE_ROWS, launch_decode
from .attention_prefill import launch_prefill
from .attention_reference import group_attention_reference

__all__ = ["group_attention", "MAX_DECODE_TOKENS"]

MAX_DECODE_TOKENS = 16


def group_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    head_mask: torch.Tensor,
    causal: bool = True,
    scale: float | None = None,
    merge_heads: bool = False,
    out: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    attn_mask_extents: torch.Tensor | None = None,
    row_order: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Head-group-masked (GQA) attention; returns ``[B, Hq, T, D]``, or ``[B, T, Hq * D]`` with ``merge_heads``.

    Args:
        q: queries ``[B, Hq, T, D]`` (bfloat16, float16 or float32; last dim contiguous is fastest).
        k: keys ``[B, Hkv, S, D]``, same dtype and device as ``q``.
        v: values ``[B, Hkv, S, D]``.
        head_mask: ``[B, T, G]``, any dtype, nonzero = the group's query heads are computed for that token.
        causal: causal masking with HF alignment (query ``t`` at position ``S - T + t``; needs ``T <= S``).
        scale: score scale, default ``1 / sqrt(D)``.
        merge_heads: write the output as ``[B, T, Hq * D]`` (the output projection's input) with no extra copy.
        out: optional preallocated result (``[B, Hq, T, D]``, or ``[B, T, Hq * D]`` with ``merge_heads``).
        attn_mask: optional boolean mask broadcastable to ``[B, Hq, T, S]`` (True = may attend), instead of
            ``causal`` (e.g. the causal + unfilled-slot mask of a static KV cache). Key blocks that no row of a
            tile may see are skipped; a row that may see no key gets zeros.
        attn_mask_extents: optional row extents of ``attn_mask`` over the S keys
            (``attention_mask_extents.attn_mask_extents(attn_mask, S)``), computed once and shared by every attention
            with the same mask (a model's layers); the prefill kernel computes them itself when they are not given.
        row_order: optional ``(order, count)`` of ``head_mask`` (``wide::group_rows``: each (sequence, group)'s tokens,
            active first), computed once and shared with the query projection; the prefill kernel computes it
            itself when it is not given (decode does not use it).
    """
    dims = check_attention_inputs(q, k, v, head_mask, causal, scale, attn_mask, attn_mask_extents)
    if row_order is not None:
        check_row_order("group_attention", row_order, head_mask)
    result, view = allocate_output(q, dims, merge_heads, out)
    if q.device.type != "cuda" and not interpreting():
        view.copy_(group_attention_reference(q, k, v, head_mask, causal=causal, scale=dims.scale,
                                             attn_mask=attn_mask))
        return result
    if dims.q_len == 0:
        return result
    if dims.q_len <= MAX_DECODE_TOKENS and dims.q_per_kv * dims.q_len <= MAX_DECODE_ROWS:
        launch_decode(q, k, v, head_mask, view, dims, causal, attn_mask=attn_mask)
    else:
        launch_prefill(q, k, v, head_mask, view, dims, causal, attn_mask=attn_mask,
                       attn_mask_extents=attn_mask_extents, row_order=row_order)
    return result
