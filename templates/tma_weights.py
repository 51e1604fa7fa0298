"""Weight tiles through Hopper's tensor memory accelerator: when a GEMM template may use TMA descriptors, and the
host-side descriptors it passes to the kernel (the kernels load ``[BLOCK_N, BLOCK_K]`` boxes of ``W[N, K]``; rows
or columns past the weight's edge read as zeros)."""
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
