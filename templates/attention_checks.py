"""Input validation and output allocation shared by the head-group attention kernels.

Every public attention function calls :func:`check_attention_inputs` first, so bad input fails with one clear message
naming what is wrong (dtype, device, shape, a head count that does not divide) instead of a kernel fault.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

__all__ = ["AttentionDims", "check_attention_inputs", "allocate_output", "interpreting", "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def interpreting() -> bool:
    """True when Triton kernels run under the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class AttentionDims:
    """Sizes of one attention call (names follow the module docstrings)."""

    batch: int
    num_q_heads: int
    num_kv_heads: int
    num_groups: int
    q_len: int
    kv_len: int
    head_dim: int
    scale: float

    @property
    def q_per_kv(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def heads_per_group(self) -> int:
        return self.num_q_heads // self.num_groups


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def check_attention_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    head_mask: torch.Tensor,
    causal: bool,
    scale: float | None,
    attn_mask: torch.Tensor | None = None,
    attn_mask_extents: torch.Tensor | None = None,
) -> AttentionDims:
    """Validate ``q[B,Hq,T,D]``, ``k/v[B,Hkv,S,D]``, ``head_mask[B,T,G]``, the optional boolean ``attn_mask``
    (broadcastable to ``[B, Hq, T, S]``, True = may attend; not with ``causal``) and its optional row extents
    (``attention_mask_extents.attn_mask_extents``); return the sizes.

    Raises ``TypeError`` for wrong types/dtypes and ``ValueError`` for wrong devices, shapes or divisibility.
    """
    for name, t in (("q", q), ("k", k), ("v", v), ("head_mask", head_mask)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"group_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"group_attention: q dtype {q.dtype} is not supported (use bfloat16, float16 or float32)")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"group_attention: {name} dtype {t.dtype} differs from q dtype {q.dtype}")
    for name, t in (("k", k), ("v", v), ("head_mask", head_mask)):
        if t.device != q.device:
            raise ValueError(f"group_attention: {name} is on {t.device} but q is on {q.device}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"group_attention: {name} must be 4-D [B, heads, len, D], got shape {_shape(t)}")
    batch, num_q_heads, q_len, head_dim = q.shape
    if k.shape != v.shape:
        raise ValueError(f"group_attention: k shape {_shape(k)} differs from v shape {_shape(v)}")
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(
            f"group_attention: k/v shape {_shape(k)} does not match q shape {_shape(q)} in batch or head dim"
        )
    num_kv_heads, kv_len = k.shape[1], k.shape[2]
    if num_kv_heads == 0 or num_q_heads % num_kv_heads != 0:
        raise ValueError(
            f"group_attention: KV heads ({num_kv_heads}) must divide query heads ({num_q_heads}) for GQA"
        )
    if head_mask.dim() != 3 or head_mask.shape[0] != batch or head_mask.shape[1] != q_len:
        raise ValueError(
            f"group_attention: head_mask must have shape [B={batch}, T={q_len}, G], got {_shape(head_mask)}"
        )
    num_groups = head_mask.shape[2]
    if num_groups == 0 or num_q_heads % num_groups != 0:
        raise ValueError(
            f"group_attention: head-group count G={num_groups} (head_mask.shape[2]) must divide query heads "
            f"({num_q_heads})"
        )
    if head_dim == 0 or head_dim > 256:
        raise ValueError(f"group_attention: head dim {head_dim} is not supported (1..256)")
    if kv_len == 0:
        raise ValueError("group_attention: k/v have no keys (S = 0)")
    if causal and q_len > kv_len:
        raise ValueError(
            f"group_attention: causal attention needs T <= S (query t sits at position S - T + t), "
            f"got T={q_len}, S={kv_len}"
        )
    if attn_mask is not None:
        _check_attn_mask(attn_mask, q, causal, (batch, num_q_heads, q_len, kv_len))
    if attn_mask_extents is not None:
        if attn_mask is None:
            raise ValueError("group_attention: attn_mask_extents given without the attn_mask they describe")
        from .attention_mask_extents import check_attn_mask_extents

        check_attn_mask_extents(attn_mask_extents, attn_mask)
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    else:
        scale = float(scale)
        if not math.isfinite(scale):
            raise ValueError(f"group_attention: scale must be finite, got {scale}")
    return AttentionDims(batch, num_q_heads, num_kv_heads, num_groups, q_len, kv_len, head_dim, scale)


def _check_attn_mask(attn_mask: torch.Tensor, q: torch.Tensor, causal: bool, full: tuple[int, ...]) -> None:
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"group_attention: attn_mask must be a torch.Tensor, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool:
        raise TypeError(f"group_attention: attn_mask must be boolean (True = may attend), got {attn_mask.dtype}")
    if attn_mask.device != q.device:
        raise ValueError(f"group_attention: attn_mask is on {attn_mask.device} but q is on {q.device}")
    if causal:
        raise ValueError("group_attention: give either causal=True or an attn_mask, not both")
    if not 2 <= attn_mask.dim() <= 4 or any(
            m not in (1, f) for m, f in zip(attn_mask.shape[::-1], full[::-1])):
        raise ValueError(f"group_attention: attn_mask shape {_shape(attn_mask)} does not broadcast to "
                         f"[B, Hq, T, S] = {list(full)}")


def expand_attn_mask(attn_mask: torch.Tensor, dims: AttentionDims) -> torch.Tensor:
    """The checked boolean mask as a ``[B, Hq, T, S]`` uint8 view (broadcast dimensions get stride 0, no copy)."""
    full = (dims.batch, dims.num_q_heads, dims.q_len, dims.kv_len)
    mask = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)).expand(full)
    return mask.view(torch.uint8)


def expand_attn_mask_extents(extents: torch.Tensor, dims: AttentionDims) -> torch.Tensor:
    """Row extents ``[Bm, Hm, Tm, 3]`` of the mask (un-broadcast over batch, heads and queries) as a ``[B, Hq, T, 3]``
    view (stride 0 where the mask broadcasts)."""
    return extents.expand(dims.batch, dims.num_q_heads, dims.q_len, 3)


def allocate_output(
    q: torch.Tensor, dims: AttentionDims, merge_heads: bool, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(result, view)``: ``view`` is ``[B, Hq, T, D]`` with the strides the kernels write through.

    With ``merge_heads`` the storage is ``[B, T, Hq * D]`` (what an output projection consumes) and ``view`` is its
    ``[B, Hq, T, D]`` permutation, so the kernels write the merged layout directly with no extra copy. A caller's
    ``out`` tensor (same shape, dtype and device, unit last stride) is used instead of a new allocation.
    """
    if merge_heads:
        shape = (dims.batch, dims.q_len, dims.num_q_heads * dims.head_dim)
    else:
        shape = (dims.batch, dims.num_q_heads, dims.q_len, dims.head_dim)
    if out is None:
        result = torch.empty(shape, dtype=q.dtype, device=q.device)
    else:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"group_attention: out must be a torch.Tensor, got {type(out).__name__}")
        if tuple(out.shape) != shape or out.dtype != q.dtype or out.device != q.device:
            raise ValueError(
                f"group_attention: out must be {list(shape)} {q.dtype} on {q.device}, "
                f"got {_shape(out)} {out.dtype} on {out.device}"
            )
        if out.stride(-1) != 1:
            raise ValueError("group_attention: out must have a unit stride in its last dimension")
        result = out
    if merge_heads:
        view = result.unflatten(2, (dims.num_q_heads, dims.head_dim)).permute(0, 2, 1, 3)
        return result, view
    return result, result
