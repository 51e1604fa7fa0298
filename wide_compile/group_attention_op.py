"""The lowered attention core ``wide::group_attention`` (put in place of SDPA by the ``wide`` backend).

``wide::group_attention(q, k, v, mask, is_causal, scale=None, attn_mask=None, attn_mask_extents=None, row_order=None,
row_count=None) -> o[B, H, T, D]``
    ``o = scaled_dot_product_attention(q, k, v, attn_mask, is_causal=is_causal, scale=scale)`` (GQA when ``k``/``v`` have fewer
    heads) times 0 for the query heads of each token's inactive groups (``mask[B, T, G]``, group ``g`` = heads
    ``[g*H/G, (g+1)*H/G)``). On CUDA the head-group attention templates run when they compute exactly that (bf16 /
    fp16 / fp32, head_dim <= 256, and ``T == S`` when causal: SDPA aligns a causal mask top-left, the templates
    bottom-right); backward recomputes the attention in fp32 math (it is not skipped).

On other devices, and on CUDA for inputs the templates do not take, the op computes exactly that PyTorch
expression, so a compiled CPU model matches eager. ``attn_mask_extents`` (``wide::attn_mask_extents``) and
``row_order`` / ``row_count`` (``wide::group_rows`` of ``mask``) are what the prefill template would compute, passed
when computed once for several ops; the value does not depend on them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .kernel_ops import _kernel_ok


def _check_group_attention_args(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, is_causal: bool = False,
                                attn_mask: Tensor | None = None) -> None:
    op = "group_attention"
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool:
            raise TypeError(f"{op}: attn_mask must be boolean (True = may attend), got {attn_mask.dtype}")
        if is_causal:
            raise ValueError(f"{op}: give either is_causal=True or an attn_mask, not both")
        if not 2 <= attn_mask.dim() <= 4:
            raise ValueError(f"{op}: attn_mask must broadcast to [B, H, T, S], got shape {tuple(attn_mask.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{op}: {name} must be 4-D [batch, heads, length, head_dim], got {tuple(t.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{op}: {name} dtype {t.dtype} differs from q dtype {q.dtype}")
    if mask.dim() != 3:
        raise ValueError(f"{op}: mask must be [batch, tokens, groups], got shape {tuple(mask.shape)}")
    heads, kv_heads, groups = q.shape[1], k.shape[1], mask.shape[2]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"{op}: key/value heads ({kv_heads}) must divide query heads ({heads})")
    if groups == 0 or heads % groups:
        raise ValueError(f"{op}: mask groups ({groups}) must divide query heads ({heads})")
    torch._check(k.shape == v.shape, lambda: f"{op}: k shape {tuple(k.shape)} differs from v shape {tuple(v.shape)}")
    torch._check(k.shape[0] == q.shape[0] and k.shape[3] == q.shape[3],
                 lambda: f"{op}: k/v shape {tuple(k.shape)} does not match q {tuple(q.shape)} in batch or head_dim")
    torch._check(mask.shape[0] == q.shape[0] and mask.shape[1] == q.shape[2],
                 lambda: f"{op}: mask shape {tuple(mask.shape)} must be [batch={q.shape[0]}, tokens={q.shape[2]}, G]")


def _rows(mask: Tensor, row_order: Tensor | None, row_count: Tensor | None):
    from .templates.row_order import row_order_args  # here: importing the templates package imports Triton

    return row_order_args("group_attention", mask, row_order, row_count)


def head_mask(mask: Tensor, heads: int) -> Tensor:
    """``mask[B, T, G]`` -> ``[B, heads, T, 1]`` (group ``g`` = heads ``[g*heads/G, (g+1)*heads/G)``)."""
    return mask.transpose(1, 2).repeat_interleave(heads // mask.shape[2], dim=1).unsqueeze(-1)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, scale: float | None, attn_mask: Tensor | None = None
          ) -> Tensor:
    if k.shape[1] != q.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                              enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)


@torch.library.custom_op("wide::group_attention", mutates_args=())
def group_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, is_causal: bool, scale: float | None = None,
                    attn_mask: Tensor | None = None, attn_mask_extents: Tensor | None = None,
                    row_order: Tensor | None = None, row_count: Tensor | None = None) -> Tensor:
    """``scaled_dot_product_attention(q, k, v, attn_mask, is_causal=is_causal, scale=scale)`` (GQA when k/v have
    fewer heads; ``attn_mask`` boolean, True = may attend) with the query heads of each token's inactive groups
    multiplied by 0 (see module docstring). ``attn_mask_extents``: ``wide::attn_mask_extents(attn_mask, S)`` when
    computed once for several attentions, ``row_order`` / ``row_count``: ``wide::group_rows(mask)`` when shared with
    the query projection (the CUDA templates use them; the value does not depend on them)."""
    _check_group_attention_args(q, k, v, mask, is_causal, attn_mask)
    _rows(mask, row_order, row_count)
    return _masked_sdpa(q, k, v, mask, is_causal, scale, attn_mask)


def token_major(t: Tensor) -> Tensor:
    """``t[B, H, T, D]`` in the op's output layout: memory ``[B, T, H, D]`` (what SDPA's flash kernels return), so the
    ``transpose(1, 2).reshape(B, T, H * D)`` every transformers attention applies next is a view, not a copy. Every
    implementation returns this layout: Inductor checks the strides of custom-op outputs against the fake."""
    return t if t.transpose(1, 2).is_contiguous() else t.transpose(1, 2).contiguous().transpose(1, 2)


def _masked_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, is_causal: bool, scale: float | None,
                 attn_mask: Tensor | None = None) -> Tensor:
    """The op's math, in the op's output layout (``token_major``)."""
    out = _sdpa(q, k, v, is_causal, scale, attn_mask)
    return token_major(out * head_mask(mask, q.shape[1]).to(out.dtype))


@group_attention.register_fake
def _(q, k, v, mask, is_causal, scale=None, attn_mask=None, attn_mask_extents=None, row_order=None, row_count=None):
    _check_group_attention_args(q, k, v, mask, is_causal, attn_mask)
    _rows(mask, row_order, row_count)
    batch, heads, tokens, dim = q.shape
    return q.new_empty((batch, tokens, heads, dim)).transpose(1, 2)  # token_major, whatever the layout of q


@group_attention.register_kernel("cuda")
def group_attention_kernel(q, k, v, mask, is_causal, scale=None, attn_mask=None, attn_mask_extents=None,
                           row_order=None, row_count=None):
    """The template path (skips the K/V reads and FLOPs of inactive (token, group) pairs). The templates align a
    causal mask bottom-right and SDPA top-left; they agree when ``T == S``, otherwise the PyTorch path runs."""
    _check_group_attention_args(q, k, v, mask, is_causal, attn_mask)
    rows = _rows(mask, row_order, row_count)
    q_len, kv_len = q.shape[2], k.shape[2]
    if not _kernel_ok(q, k, v) or (is_causal and q_len != kv_len) or q.shape[-1] > 256 or kv_len == 0:
        return _masked_sdpa(q, k, v, mask, is_causal, scale, attn_mask)
    from wide_compile.templates import group_attention as template

    merged = template(q, k, v, mask, causal=is_causal, scale=scale, merge_heads=True, attn_mask=attn_mask,
                      attn_mask_extents=attn_mask_extents, row_order=rows)  # [B, T, H * D], written by the kernels
    return merged.unflatten(2, (q.shape[1], q.shape[3])).transpose(1, 2)


def _ga_setup(ctx, inputs, output):
    q, k, v, mask, is_causal, scale, attn_mask = inputs[:7]
    ctx.save_for_backward(q, k, v, mask, attn_mask if attn_mask is not None else mask.new_empty(0))
    ctx.is_causal, ctx.scale, ctx.has_attn_mask = is_causal, scale, attn_mask is not None


def _ga_backward(ctx, grad):
    """Attention backward in fp32 from recomputed probabilities (the forward output has the skipped heads zeroed)."""
    q, k, v, mask, attn_mask = ctx.saved_tensors
    heads, kv_heads, groups = q.shape[1], k.shape[1], mask.shape[2]
    rep = heads // kv_heads
    acc = torch.promote_types(q.dtype, torch.float32)  # fp32 math (fp64 stays fp64)
    kf, vf = (t.to(acc).repeat_interleave(rep, dim=1) for t in (k, v))
    qf = q.to(acc)
    scale = ctx.scale if ctx.scale is not None else q.shape[-1] ** -0.5
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if ctx.is_causal:
        allowed = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    if ctx.has_attn_mask:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    probs = torch.nan_to_num(torch.softmax(scores, dim=-1))  # rows that see no key: 0, as SDPA
    out = torch.matmul(probs, vf)
    g = grad.to(acc) * head_mask(mask, heads).to(acc)
    grad_probs = torch.matmul(g, vf.transpose(-1, -2))
    grad_scores = probs * (grad_probs - (g * out).sum(-1, keepdim=True))
    need_q, need_k, need_v, need_mask = ctx.needs_input_grad[:4]

    def per_kv_head(t: Tensor) -> Tensor:
        return t.unflatten(1, (kv_heads, rep)).sum(2)

    gq = (torch.matmul(grad_scores, kf) * scale).to(q.dtype) if need_q else None
    gk = per_kv_head(torch.matmul(grad_scores.transpose(-1, -2), qf) * scale).to(k.dtype) if need_k else None
    gv = per_kv_head(torch.matmul(probs.transpose(-1, -2), g)).to(v.dtype) if need_v else None
    gmask = None
    if need_mask:  # straight-through: the dense output of every head, skipped ones included
        per_head = (grad.to(acc) * out).sum(-1)  # [B, H, T]
        gmask = per_head.unflatten(1, (groups, heads // groups)).sum(2).transpose(1, 2).to(mask.dtype)
    return gq, gk, gv, gmask, None, None, None, None, None, None


group_attention.register_autograd(_ga_backward, setup_context=_ga_setup)
