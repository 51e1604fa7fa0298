"""Weight tiles through Hopper's tensor memory accelerator: when a GEMM template may use TMA descriptors, and the
host-side descriptors it passes to the kernel (the kernels load ``[BLOCK_N, BLOCK_K]`` boxes of ``W[N, K]``; rows
or columns past the weight's edge read as zeros). ``pair_descriptor`` sees two weights of one shape as ``[2, N, K]``, for
kernels that read the same tile of both in one box."""
from __future__ import annotations

import torch


def tma_ok(*weights: torch.Tensor) -> bool:
    """Whether weight tiles may be loaded through TMA descriptors: 2-D, contiguous, 16-bit, 16-byte rows."""
    return all(w.dim() == 2 and w.is_contiguous() and w.dtype in (torch.bfloat16, torch.float16)
               and (w.shape[1] * w.element_size()) % 16 == 0 and w.data_ptr() % 16 == 0 for w in weights)


def use_tma(op: str, cfg: dict, explicit: dict | None, *weights: torch.Tensor) -> bool:
    """``cfg["TMA"]`` where the weights allow it. A default that asks for TMA falls back to pointer loads on weights
    TMA cannot take; an explicit ``config={"TMA": True}`` (``explicit``) raises instead."""
    if not cfg.get("TMA", False):
        return False
    if tma_ok(*weights):
        return True
    if (explicit or {}).get("TMA"):
        w = weights[0]
        raise ValueError(f"{op}: config TMA=True needs contiguous bf16 / fp16 weights whose rows are a multiple of "
                         f"16 bytes, got {w.dtype} {tuple(w.shape)}")
    return False


def weight_descriptors(weights: tuple, block_n: int, block_k: int) -> tuple:
    """One host-side ``TensorDescriptor`` per weight, box ``[block_n, block_k]``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return tuple(TensorDescriptor.from_tensor(w, [block_n, block_k]) for w in weights)


# cuTensorMapEncodeTiled: every global stride but the last is a multiple of 16 bytes and below 2^40 bytes.
_MAX_STRIDE_BYTES = 1 << 40


def pair_descriptor(w_a: torch.Tensor, w_b: torch.Tensor, block_n: int, block_k: int):
    """One host-side descriptor that sees two ``[N, K]`` weights as ``[2, N, K]``, box ``[2, block_n, block_k]``, and
    whether ``w_b`` is its first slice; ``None`` where TMA cannot take the pair (then use one descriptor each).

    The weights need not share an allocation: dimension 0's stride is the distance between their addresses (the
    lower one is the base), and the copy engine only computes addresses from the strides, bounds-checking each box
    against ``[2, N, K]``, so no byte outside the two weights is read."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if w_a.shape != w_b.shape or w_a.dtype != w_b.dtype or w_a.device != w_b.device or not tma_ok(w_a, w_b):
        return None
    b_first = w_b.data_ptr() < w_a.data_ptr()
    lo, hi = (w_b, w_a) if b_first else (w_a, w_b)
    gap = hi.data_ptr() - lo.data_ptr()
    if gap == 0 or gap % 16 or gap >= _MAX_STRIDE_BYTES:
        return None
    n, k = lo.shape
    return TensorDescriptor(lo, [2, n, k], [gap // lo.element_size(), k, 1], [2, block_n, block_k]), b_first
