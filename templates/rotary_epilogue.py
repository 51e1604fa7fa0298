"""The query's rotary embedding as the epilogue of its projection (``gemm_output_groups`` with ``rotary=``).

HF's ``apply_rotary_pos_emb`` rotates the projected query ``q[B, H, T, D]`` as ``q * cos + rotate_half(q) * sin``
with tables ``cos / sin[B or 1, T, D]`` and ``rotate_half(q) = cat(-q[..., D/2:], q[..., :D/2])``. On the
projection's output ``y[B, T, H * D]`` that is, per head of ``D`` columns, the same formula with each token's table
row; a fully inactive group stays exactly 0. In a prefill the separate rotation reads and writes the whole query
(Inductor's RoPE kernel, 64 MB per layer of the Llama-3-8B shape at 4096 tokens); here the GEMM rotates its fp32
tile in registers before its one store.

Rounding: the kernel rounds the product to the output dtype (as the projection's own output), then computes the
rotation in fp32 and rounds once (as Inductor's fused kernel does); eager PyTorch rounds after each bf16 op, so the
two differ by about one unit in the last place. The reference (:func:`rotate_reference`) is the eager formula.

The epilogue needs output tiles of whole heads: ``D`` a power of two, groups and tiles a multiple of ``D``
(:func:`epilogue_ok`); otherwise the callers rotate the GEMM's output with the reference. ``output_group_linear``
also keeps it to the head dims the H200 tests have run (``GPU_TESTED_HEAD_DIMS``: Llama-3-8B's 128 and SmolLM2's 64
through the models' shapes, 16 / 32 / 256 through
``tests/test_gpu_group_linear.py::test_rotary_epilogue_other_head_dims``, which passed on the H200 in stop 20); other
head dims rotate after the GEMM.
"""
from __future__ import annotations

import torch

from ._triton_utils import HAS_TRITON


GPU_TESTED_HEAD_DIMS = (16, 32, 64, 128, 256)


def check_rotary(op: str, x: torch.Tensor, n_dim: int, group_size: int, cos: torch.Tensor, sin: torch.Tensor) -> int:
    """Validate rotary tables for the output of ``x[B, T, K] @ W.T`` (``n_dim`` columns); returns the head dim."""
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{op}: rotary {name} must be a 3-D tensor [B or 1, T, head_dim]")
        if t.dtype != x.dtype or t.device != x.device:
            raise TypeError(f"{op}: rotary {name} must be {x.dtype} on {x.device}, got {t.dtype} on {t.device}")
    if tuple(cos.shape) != tuple(sin.shape):
        raise ValueError(f"{op}: rotary cos and sin shapes differ: {tuple(cos.shape)} vs {tuple(sin.shape)}")
    if x.dim() != 3:
        raise ValueError(f"{op}: a rotated output needs x of shape [B, T, K], got {tuple(x.shape)}")
    batch, tokens, head_dim = cos.shape
    if batch not in (1, x.shape[0]) or tokens != x.shape[1]:
        raise ValueError(f"{op}: rotary tables of shape {tuple(cos.shape)} do not fit x of shape {tuple(x.shape)} "
                         f"(want [1 or {x.shape[0]}, {x.shape[1]}, head_dim])")
    if head_dim < 2 or head_dim % 2 or n_dim % head_dim or group_size % head_dim:
        raise ValueError(f"{op}: rotary head_dim {head_dim} must be even and divide the output size {n_dim} and the "
                         f"group size {group_size}")
    return head_dim


def rotate_reference(y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's rotation of ``y[B, T, H * D]`` per head, in ``y``'s dtype, op for op as eager PyTorch computes it."""
    batch, tokens, n_dim = y.shape
    head_dim = cos.shape[-1]
    q = y.view(batch, tokens, n_dim // head_dim, head_dim)
    half = head_dim // 2
    rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
    return (q * cos.unsqueeze(2) + rotated * sin.unsqueeze(2)).reshape(batch, tokens, n_dim)


def epilogue_ok(head_dim: int, group_size: int, block_n: int) -> bool:
    """Whether the GEMM can rotate its tiles: power-of-two heads, whole heads per tile and per group."""
    return head_dim >= 2 and head_dim & (head_dim - 1) == 0 and block_n % head_dim == 0 and group_size % head_dim == 0


def epilogue_applies(head_dim: int, group_size: int) -> bool:
    """Whether ``output_group_linear`` rotates in the GEMM (``epilogue_ok`` at a head dim the GPU tests cover); the
    query-rotation pass moves HF's rotation into the projection only then (elsewhere Inductor's fused RoPE kernel is
    faster than rotating after the GEMM)."""
    return head_dim in GPU_TESTED_HEAD_DIMS and epilogue_ok(head_dim, group_size, head_dim)


def kernel_tables(cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The GEMM's ``rotary=`` argument: both tables as contiguous ``[(B or 1) * T, D]`` and the period of the table
    row of a flattened token row of ``x[B, T, K]`` (``T`` for shared tables, every row its own otherwise)."""
    period = cos.shape[1] if cos.shape[0] == 1 else x.shape[0] * x.shape[1]
    return cos.reshape(-1, cos.shape[-1]).contiguous(), sin.reshape(-1, sin.shape[-1]).contiguous(), period


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _table_half(table_ptr, table_rows, offs_d, row_mask):
        """``table[table_rows, offs_d]`` as ``[rows, 1, len(offs_d)]`` in fp32 (zeros for masked rows)."""
        ptrs = table_ptr + table_rows[:, None, None] + offs_d[None, None, :]
        return tl.load(ptrs, mask=row_mask[:, None, None], other=0.0).to(tl.float32)

    @triton.jit
    def rotate_rows(acc, cos_ptr, sin_ptr, rows, row_mask, period, HEAD_DIM: tl.constexpr, OUT_DTYPE):
        """The rotated tile of ``acc`` (fp32 ``[rows, heads * HEAD_DIM]`` of token ``rows``), in ``OUT_DTYPE``: the
        product rounded to ``OUT_DTYPE`` first, the rotation in fp32 with the tables' rows ``rows % period``, one
        rounding. Works on the two halves of every head (``[rows, heads, D/2]`` each), so the tables are loaded once
        per row and half, not once per column."""
        n_rows: tl.constexpr = acc.shape[0]
        n_cols: tl.constexpr = acc.shape[1]
        HALF: tl.constexpr = HEAD_DIM // 2
        q = acc.to(OUT_DTYPE)
        halves = tl.permute(tl.reshape(q, [n_rows, n_cols // HEAD_DIM, 2, HALF]), [0, 1, 3, 2])
        lower, upper = tl.split(halves)
        lower = lower.to(tl.float32)
        upper = upper.to(tl.float32)
        table_rows = ((rows % period) * HEAD_DIM).to(tl.int32)
        offs_d = tl.arange(0, HALF)
        cos_lo = _table_half(cos_ptr, table_rows, offs_d, row_mask)
        sin_lo = _table_half(sin_ptr, table_rows, offs_d, row_mask)
        out_lo = (lower * cos_lo - upper * sin_lo).to(OUT_DTYPE)
        cos_hi = _table_half(cos_ptr, table_rows, offs_d + HALF, row_mask)
        sin_hi = _table_half(sin_ptr, table_rows, offs_d + HALF, row_mask)
        out_hi = (upper * cos_hi + lower * sin_hi).to(OUT_DTYPE)
        return tl.reshape(tl.permute(tl.join(out_lo, out_hi), [0, 1, 3, 2]), [n_rows, n_cols])


__all__ = ["GPU_TESTED_HEAD_DIMS", "check_rotary", "epilogue_applies", "epilogue_ok", "kernel_tables",
           "rotate_reference"]
