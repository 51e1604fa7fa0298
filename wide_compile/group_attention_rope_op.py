"""``wide::group_attention_rope``: the lowered attention core with the query's rotary embedding folded in (what
``passes/query_rope_fusion.py`` puts in prefill-sized inference graphs).

``wide::group_attention_rope(q, cos, sin, k, v, mask, is_causal, scale=None, attn_mask=None, attn_mask_extents=None)``
equals ``wide::group_attention(q * cos[:, None] + rotate_half(q) * sin[:, None], k, v, mask, ...)``: ``q`` is the
query before HF's ``apply_rotary_pos_emb``, ``cos`` / ``sin`` its ``[B or 1, T, D]`` tables. On CUDA the prefill
template rotates each query tile as it loads it (``templates/attention_rotary.py``), so the rotated query is never
written and read back; other paths (decode, other devices, shapes the kernel does not rotate) rotate it first with
the PyTorch expression, so a compiled CPU model matches eager exactly.

No gradient: the fusion applies only to inference graphs (nothing requires a gradient); training keeps HF's RoPE and
``wide::group_attention``, whose backward it has.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .group_attention_op import _check_group_attention_args, _masked_sdpa
from .kernel_ops import _kernel_ok


def _rotary():
    from wide_compile.templates import attention_rotary  # late: the templates package loads Triton

    return attention_rotary


@torch.library.custom_op("wide::group_attention_rope", mutates_args=())
def group_attention_rope(q: Tensor, cos: Tensor, sin: Tensor, k: Tensor, v: Tensor, mask: Tensor, is_causal: bool,
                         scale: float | None = None, attn_mask: Tensor | None = None,
                         attn_mask_extents: Tensor | None = None) -> Tensor:
    """``wide::group_attention`` of the rotated query (see module docstring)."""
    _check_group_attention_args(q, k, v, mask, is_causal, attn_mask)
    return _masked_sdpa(_rotary().rotate_query_reference(q, cos, sin), k, v, mask, is_causal, scale, attn_mask)


@group_attention_rope.register_fake
def _(q, cos, sin, k, v, mask, is_causal, scale=None, attn_mask=None, attn_mask_extents=None):
    _check_group_attention_args(q, k, v, mask, is_causal, attn_mask)
    _rotary().check_rotary_tables(q, cos, sin)
    batch, heads, tokens, dim = q.shape
    return q.new_empty((batch, tokens, heads, dim)).transpose(1, 2)  # token_major, as wide::group_attention


@group_attention_rope.register_kernel("cuda")
def group_attention_rope_kernel(q, cos, sin, k, v, mask, is_causal, scale=None, attn_mask=None,
                                attn_mask_extents=None):
    """The template with the rotation in its prefill kernel; the PyTorch path where ``wide::group_attention``'s CUDA
    kernel would take it too (causal with ``T != S``, head_dim > 256, empty keys, dtypes the templates lack)."""
    _check_group_attention_args(q, k, v, mask, is_causal, attn_mask)
    q_len, kv_len = q.shape[2], k.shape[2]
    if not _kernel_ok(q, k, v) or (is_causal and q_len != kv_len) or q.shape[-1] > 256 or kv_len == 0:
        return _masked_sdpa(_rotary().rotate_query_reference(q, cos, sin), k, v, mask, is_causal, scale, attn_mask)
    from wide_compile.templates import group_attention as template

    merged = template(q, k, v, mask, causal=is_causal, scale=scale, merge_heads=True, attn_mask=attn_mask,
                      attn_mask_extents=attn_mask_extents, rotary=(cos, sin))
    return merged.unflatten(2, (q.shape[1], q.shape[3])).transpose(1, 2)


def _no_gradient(ctx, grad):
    raise RuntimeError(
        "wide::group_attention_rope has no gradient: the wide backend inserts it only in inference graphs. Training "
        "graphs keep the model's rotary embedding and wide::group_attention, which has a backward.")


def _setup(ctx, inputs, output):
    pass


group_attention_rope.register_autograd(_no_gradient, setup_context=_setup)
