"""The query's rotary embedding (RoPE) as the attention templates apply it when loading a query tile.

HF decoders rotate the query right before the attention core::

    q_embed = q * cos[:, None] + rotate_half(q) * sin[:, None]      rotate_half(q) = cat(-q[..., D/2:], q[..., :D/2])

with ``q[B, H, T, D]`` and the position tables ``cos`` / ``sin`` of shape ``[B, T, D]`` (or ``[1, T, D]``) in ``q``'s
dtype. Each product and the sum round to that dtype. The prefill kernel (``attention_prefill``, ``ROPE``) computes
the same three roundings from the tile's query rows, its columns rotated by ``D/2``, and the tables' rows at the tile's
token indices, so the compiled model's query equals eager's bit for bit and is never written to memory rotated.

:func:`rotate_query_reference` is the PyTorch form: the ground truth, and the path for shapes the kernel does not take.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_rotary_tables", "rotate_query_reference", "kernel_takes_rotary"]


def check_rotary_tables(q: Tensor, cos: Tensor, sin: Tensor) -> None:
    """TypeError / ValueError naming what is wrong with ``cos`` / ``sin`` for ``q[B, H, T, D]``."""
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor):
            raise TypeError(f"group_attention: rotary {name} must be a tensor, got {type(t).__name__}")
        if t.dtype != q.dtype:
            raise TypeError(f"group_attention: rotary {name} dtype {t.dtype} differs from q dtype {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"group_attention: rotary {name} is on {t.device} but q is on {q.device}")
        batch, _, tokens, dim = q.shape
        if t.dim() != 3 or t.shape[0] not in (1, batch) or tuple(t.shape[1:]) != (tokens, dim):
            raise ValueError(f"group_attention: rotary {name} must be [{batch} or 1, {tokens}, {dim}] for q "
                             f"{tuple(q.shape)}, got {tuple(t.shape)}")
    if q.shape[-1] % 2:
        raise ValueError(f"group_attention: rotary embedding needs an even head_dim, got {q.shape[-1]}")


def rotate_query_reference(q: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``q * cos + rotate_half(q) * sin`` with the tables broadcast over heads (HF's ``apply_rotary_pos_emb``)."""
    check_rotary_tables(q, cos, sin)
    half = q.shape[-1] // 2
    rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
    return q * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


def kernel_takes_rotary(head_dim: int, block_d: int) -> bool:
    """Whether the prefill kernel rotates in registers: whole rows in one tile (``head_dim`` a power of two)."""
    return head_dim == block_d and head_dim % 2 == 0
