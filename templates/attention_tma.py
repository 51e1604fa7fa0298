"""Host side of the attention kernels' TMA K / V loads: when K and V may be read as TMA boxes of their
``[B * Hkv * S, D]`` views, and the descriptors (the device side: ``attention_block.load_key_block``)."""
from __future__ import annotations

import torch

from .attention_checks import AttentionDims, interpreting


def kv_tma_ok(k: torch.Tensor, v: torch.Tensor, dims: AttentionDims, block_d: int) -> bool:
    """Whether K / V blocks may be TMA boxes of ``[B * Hkv * S, D]`` views: a CUDA device (not the interpreter),
    contiguous 16-bit K and V, whole rows in one block (``head_dim`` a power of two) of 16-byte multiples."""
    return (not interpreting() and k.is_cuda and block_d == dims.head_dim and k.dtype in (torch.bfloat16, torch.float16)
            and all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (k, v))
            and (dims.head_dim * k.element_size()) % 16 == 0)


def kv_descriptors(k: torch.Tensor, v: torch.Tensor, head_dim: int, block_n: int) -> tuple:
    """Host-side TMA descriptors of K and V as ``[B * Hkv * S, D]``, box ``[block_n, head_dim]``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return tuple(TensorDescriptor.from_tensor(t.view(-1, head_dim), [block_n, head_dim]) for t in (k, v))
