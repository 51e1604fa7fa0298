"""Pure-PyTorch reference for head-group-masked attention (the ground truth the kernels are tested against).

Semantics (shared with :mod:`wide_compile.templates.attention`):

- ``q[B, Hq, T, D]``, ``k[B, Hkv, S, D]``, ``v[B, Hkv, S, D]`` (SDPA layout). GQA: ``Hkv`` divides ``Hq`` and query
  head ``h`` reads KV head ``h // (Hq // Hkv)``.
- ``head_mask[B, T, G]`` (any dtype, nonzero = active). ``G`` divides ``Hq``; group ``g`` is the consecutive query
  heads ``[g * Hq // G, (g + 1) * Hq // G)``.
- Output ``o[B, Hq, T, D]``: softmax attention for active (token, group) pairs, exactly zero for inactive ones.
- Causal with ``T <= S``: query ``t`` sits at absolute position ``S - T + t`` (HuggingFace convention for decode and
  chunked prefill) and sees keys ``0 .. S - T + t``.

The math runs in float32 with an explicit softmax (max-subtracted exponentials over their sum), whatever the input
dtype; the result is cast back to ``q.dtype``.
"""

from __future__ import annotations

import math

import torch

__all__ = ["group_attention_reference", "expand_head_mask"]


def expand_head_mask(head_mask: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    """Turn a ``[B, T, G]`` group mask into a boolean ``[B, Hq, T]`` per-query-head mask."""
    groups = head_mask.shape[-1]
    active = (head_mask != 0).repeat_interleave(num_q_heads // groups, dim=2)  # [B, T, Hq]
    return active.permute(0, 2, 1)


def group_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    head_mask: torch.Tensor,
    causal: bool = True,
    scale: float | None = None,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked GQA attention in float32; returns ``[B, Hq, T, D]`` in ``q.dtype`` (zeros where inactive).

    ``attn_mask``: boolean, broadcastable to ``[B, Hq, T, S]``, True = may attend (instead of ``causal``). A query row
    that may attend to no key gets zeros (as SDPA's math path does)."""
    batch, num_q_heads, q_len, head_dim = q.shape
    num_kv_heads, kv_len = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    repeat = num_q_heads // num_kv_heads
    active = expand_head_mask(head_mask, num_q_heads)  # [B, Hq, T]
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    if causal:
        query_pos = torch.arange(q_len, device=q.device) + (kv_len - q_len)
        allowed = torch.arange(kv_len, device=q.device)[None, :] <= query_pos[:, None]  # [T, S]
    if attn_mask is not None:
        full = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
        full = full.expand(batch, num_q_heads, q_len, kv_len)
    for b in range(batch):  # one batch row at a time keeps the [Hq, T, S] score matrix small
        kf = k[b].float().repeat_interleave(repeat, dim=0)
        vf = v[b].float().repeat_interleave(repeat, dim=0)
        scores = torch.matmul(q[b].float(), kf.transpose(-1, -2)) * scale  # [Hq, T, S]
        if causal:
            scores = scores.masked_fill(~allowed, float("-inf"))
        if attn_mask is not None:
            scores = scores.masked_fill(~full[b], float("-inf"))
        row_max = scores.amax(dim=-1, keepdim=True)
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))  # no visible key
        weights = torch.exp(scores - row_max)
        total = weights.sum(dim=-1, keepdim=True)
        probs = weights / torch.where(total > 0, total, torch.ones_like(total))
        out[b] = torch.matmul(probs, vf)
    out = torch.where(active[..., None], out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out.to(q.dtype)
