"""Per-row key extents of a boolean attention mask: the first and last key each query row may see, and whether it
sees every key in between.

``mask_extents(mask)`` takes the (un-broadcast) 4-D boolean mask ``[Bm, Hm, Tm, S]`` and returns int32
``[Bm, Hm, Tm, 3]``: ``(first, last, contiguous)`` of every row: its first and last allowed key (``(S, -1)`` for a
row that may see nothing) and 1 when it may see every key of ``[first, last]`` (also for a row that sees nothing),
else 0. The prefill kernel loops only over the key blocks between a tile's extents, so a static KV cache's mask
(causal over the filled slots) costs it the causal band, not the whole cache; where every row of a tile is contiguous
(causal masks, left or right padding: what transformers builds) the extents are the whole mask and the mask itself is
not read again. One read of the mask per call: ``Bm * Hm * Tm * S`` bytes (17 MB for a 4096-token prefill into 4160
slots; the mask is shared by all heads).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["attn_mask_extents", "check_attn_mask_extents", "mask_extents", "mask_extents_reference",
           "mask_row_shape", "mask_rows_over_keys"]


@triton.jit
def _mask_extents_kernel(
    MASK, OUT, num_heads, num_rows, kv_len,
    stride_mb, stride_mh, stride_mt, stride_ms,
    BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr,
):
    pid_t = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // num_heads
    h = bh % num_heads
    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < num_rows
    base = MASK + b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh + rows.to(tl.int64)[:, None] * stride_mt
    first = tl.full([BLOCK_T], kv_len, dtype=tl.int32)
    last = tl.full([BLOCK_T], -1, dtype=tl.int32)
    seen = tl.zeros([BLOCK_T], dtype=tl.int32)
    for start in range(0, kv_len, BLOCK_S):
        cols = start + tl.arange(0, BLOCK_S)
        ok = row_ok[:, None] & (cols[None, :] < kv_len)
        allowed = (tl.load(base + cols[None, :] * stride_ms, mask=ok, other=0) != 0) & ok
        first = tl.minimum(first, tl.min(tl.where(allowed, cols[None, :], kv_len), 1))
        last = tl.maximum(last, tl.max(tl.where(allowed, cols[None, :], -1), 1))
        seen += tl.sum(allowed.to(tl.int32), 1)
    out = OUT + (bh.to(tl.int64) * num_rows + rows) * 3
    tl.store(out, first, mask=row_ok)
    tl.store(out + 1, last, mask=row_ok)
    tl.store(out + 2, ((seen == 0) | (seen == last - first + 1)).to(tl.int32), mask=row_ok)


def mask_extents_reference(mask: torch.Tensor) -> torch.Tensor:
    """PyTorch version of :func:`mask_extents` (``mask``: 4-D boolean)."""
    kv_len = mask.shape[-1]
    idx = torch.arange(kv_len, device=mask.device, dtype=torch.int32)
    if kv_len == 0:
        rows = mask.shape[:-1]
        return torch.stack([mask.new_zeros(rows, dtype=torch.int32), mask.new_full(rows, -1, dtype=torch.int32),
                            mask.new_ones(rows, dtype=torch.int32)], dim=-1)
    first = torch.where(mask, idx, kv_len).amin(-1)
    last = torch.where(mask, idx, -1).amax(-1)
    seen = mask.sum(-1)
    contiguous = (seen == 0) | (seen == last - first + 1)
    return torch.stack([first.to(torch.int32), last.to(torch.int32), contiguous.to(torch.int32)], dim=-1)


def mask_extents(mask: torch.Tensor) -> torch.Tensor:
    """``(first, last, contiguous)`` per row of a 4-D boolean mask ``[Bm, Hm, Tm, S]`` (any strides, including the 0
    strides of a broadcast view); int32 ``[Bm, Hm, Tm, 3]``, contiguous (see the module docstring)."""
    if mask.dim() != 4 or mask.dtype != torch.bool:
        raise ValueError(f"mask_extents: need a 4-D boolean mask, got {mask.dtype} of shape {tuple(mask.shape)}")
    bm, hm, tm, kv_len = mask.shape
    out = torch.empty((bm, hm, tm, 3), dtype=torch.int32, device=mask.device)
    if out.numel() == 0:
        return out
    if kv_len == 0:
        out[..., 0], out[..., 1], out[..., 2] = 0, -1, 1
        return out
    m8 = mask.view(torch.uint8)
    block_t, block_s = (32, 32) if _interpreting() else (16, 256)
    grid = (triton.cdiv(tm, block_t), bm * hm)
    _mask_extents_kernel[grid](m8, out, hm, tm, kv_len, *m8.stride(), BLOCK_T=block_t, BLOCK_S=block_s)
    return out


def mask_row_shape(attn_mask: torch.Tensor) -> tuple:
    """``(Bm, Hm, Tm)``: the batch, head and query sizes of an attention mask (2-4 dims, missing leading ones = 1)."""
    return ((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))[:3]


def mask_rows_over_keys(attn_mask: torch.Tensor, kv_len: int) -> torch.Tensor:
    """An attention mask (2-4 dims, broadcastable to ``[B, H, T, S]``) as the 4-D ``[Bm, Hm, Tm, S]`` view whose rows
    the extents describe (only a key axis of size 1 is expanded)."""
    rows = mask_row_shape(attn_mask)
    return attn_mask.reshape(*rows, attn_mask.shape[-1]).expand(*rows, kv_len)


def attn_mask_extents(attn_mask: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Row extents of a boolean attention mask over ``kv_len`` keys, as the prefill kernel reads them: int32
    ``[Bm, Hm, Tm, 3]`` over the mask's own (un-broadcast) batch, head and query axes. Computed once, they can be
    passed to every attention that uses the same mask (``group_attention(..., attn_mask_extents=...)``): the layers
    of a model share one. The Triton kernel on CUDA and under the interpreter, else the PyTorch reference."""
    rows = mask_rows_over_keys(attn_mask, kv_len)
    if rows.device.type == "cuda" or _interpreting():
        return mask_extents(rows)
    return mask_extents_reference(rows)


def check_attn_mask_extents(extents: torch.Tensor, attn_mask: torch.Tensor) -> None:
    """Raise if ``extents`` cannot be the row extents of ``attn_mask`` (shape, dtype, device, unit last stride)."""
    want = (*mask_row_shape(attn_mask), 3)
    if not isinstance(extents, torch.Tensor) or extents.dtype != torch.int32 or tuple(extents.shape) != want \
            or extents.device != attn_mask.device or extents.stride(-1) != 1:
        got = (f"{extents.dtype} {tuple(extents.shape)} on {extents.device}" if isinstance(extents, torch.Tensor)
               else type(extents).__name__)
        raise ValueError(f"group_attention: attn_mask_extents must be int32 {list(want)} on {attn_mask.device} with a "
                         f"unit last stride (attn_mask_extents(attn_mask, S)), got {got}")


def _interpreting() -> bool:
    from .attention_checks import interpreting

    return interpreting()
