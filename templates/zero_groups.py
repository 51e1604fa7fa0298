"""``t[M, G * gs]`` with each row's inactive column groups set to 0, in one launch.

Where the tokens of a call use nearly every group (many tokens, i.i.d. masks) the weight is read whole anyway, and
cuBLAS is the fastest product; the group masks then only zero values:
- an input-group linear's input before the GEMM (``group_linear.input_group_linear``'s "dense" path);
- an output-group linear's output after it (``output_group_linear``'s "dense" path: inactive outputs exactly 0).
PyTorch's broadcast ``torch.where(mask != 0, t, 0)`` takes two kernels (the test, then the select) and reads every
byte of ``t``; this kernel tests the mask and copies in one pass, and fetches only the active groups' bytes.

Reference: :func:`zero_inactive_groups_reference` (the two-kernel PyTorch form it replaces).
"""
from __future__ import annotations

import torch

from ._triton_utils import HAS_TRITON, can_run_triton, cdiv, interpreting
from .gemv_rows import integer_mask

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _zero_groups_kernel(x_ptr, mask_ptr, y_ptr, K, G, GROUP_SIZE: tl.constexpr, MASK_VALUE_BITS: tl.constexpr,
                            IN_PLACE: tl.constexpr, BLOCK_K: tl.constexpr):
        """One program per (token, ``BLOCK_K`` columns): ``y = x`` where the column's group is on for the token,
        else 0; ``x`` is not fetched in inactive groups. ``IN_PLACE`` (``y`` is ``x``): only the zeros are stored,
        nothing is read. ``MASK_VALUE_BITS``: as in ``gemv_rows._rows_times_x``."""
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        inside = offs < K
        flag = tl.load(mask_ptr + row * G + offs // GROUP_SIZE, mask=inside, other=0)
        if MASK_VALUE_BITS == 15:
            flag = flag & 0x7FFF
        elif MASK_VALUE_BITS == 31:
            flag = flag & 0x7FFFFFFF
        if IN_PLACE:
            tl.store(y_ptr + row * K + offs, tl.zeros((BLOCK_K,), dtype=y_ptr.dtype.element_ty),
                     mask=inside & (flag == 0))
        else:
            xv = tl.load(x_ptr + row * K + offs, mask=inside & (flag != 0), other=0.0)
            tl.store(y_ptr + row * K + offs, xv, mask=inside)


BLOCK_K = 2048  # 4 KB of a bf16 row per program


def zero_inactive_groups_reference(x2: torch.Tensor, m_rows: torch.Tensor, group_size: int,
                                   in_place: bool = False) -> torch.Tensor:
    """``x2[M, K]`` with ``x2[t, g*gs:(g+1)*gs] = 0`` where ``m_rows[t, g] == 0`` (a broadcast, no expanded mask)."""
    num_tokens, num_groups = m_rows.shape
    keep = (m_rows != 0).view(num_tokens, num_groups, 1)
    xg = x2.view(num_tokens, num_groups, group_size)
    if in_place:
        xg.masked_fill_(~keep, 0)
        return x2
    return torch.where(keep, xg, torch.zeros((), dtype=x2.dtype, device=x2.device)).view(num_tokens, -1)


def zero_inactive_groups(x2: torch.Tensor, m_rows: torch.Tensor, group_size: int,
                         in_place: bool = False) -> torch.Tensor:
    """``x2[M, K]`` (contiguous) with each row's inactive groups (``m_rows[M, G] == 0``, ``K = G * group_size``)
    set to 0: one Triton launch on CUDA; the PyTorch reference elsewhere (and for bf16 under the CPU interpreter,
    whose bf16 is not exact). ``in_place``: ``x2`` itself is zeroed there (only those bytes are written) and
    returned."""
    num_tokens, k_dim = x2.shape
    if m_rows.shape != (num_tokens, k_dim // group_size) or k_dim % group_size:
        raise ValueError(f"zero_inactive_groups: mask rows {tuple(m_rows.shape)} do not cover x {tuple(x2.shape)} in "
                         f"groups of {group_size}")
    if not can_run_triton(x2) or (interpreting() and x2.dtype == torch.bfloat16) or num_tokens == 0:
        return zero_inactive_groups_reference(x2, m_rows, group_size, in_place)
    y = x2 if in_place else torch.empty_like(x2)
    flags, value_bits = integer_mask(m_rows)
    _zero_groups_kernel[(num_tokens, cdiv(k_dim, BLOCK_K))](
        x2, flags, y, k_dim, m_rows.shape[1], GROUP_SIZE=group_size, MASK_VALUE_BITS=value_bits, IN_PLACE=in_place,
        BLOCK_K=BLOCK_K, num_warps=4,
    )
    return y
