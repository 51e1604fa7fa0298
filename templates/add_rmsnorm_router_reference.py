"""Pure-PyTorch reference and input checks of the fused residual add + RMSNorm + router decision.

``add_rmsnorm_router(a, b, norm_weight, eps, w_in, b_in, w_out, b_out) -> (x, y, mask)`` is, as a routed decoder
layer computes it (HF's Llama-family ``RMSNorm``, the router reading the residual before the norm):

    x    = a + b                                                       the residual stream (a's dtype)
    t    = x.to(float32)
    y    = norm_weight * (t * rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    mask = router_mask_reference(x, w_in, b_in, w_out, b_out)          (``router_mask_reference.py``)

No Triton import here: the op's CPU path and fake implementation use this module.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .router_mask_reference import check_router_mask_args, router_mask_reference

OP = "add_rmsnorm_router"


def norm_output_dtype(x_dtype: torch.dtype, norm_weight: Tensor) -> torch.dtype:
    """``norm_weight * t.to(x_dtype)``'s dtype (type promotion: an fp32 weight gives an fp32 output)."""
    return torch.promote_types(norm_weight.dtype, x_dtype)


def check_add_rmsnorm_router_args(a: Tensor, b: Tensor, norm_weight: Tensor, eps: float, w_in: Tensor, b_in: Tensor,
                                  w_out: Tensor, b_out: Tensor) -> None:
    """ValueError / TypeError naming what is wrong; the router's own checks run on ``a`` as its input."""
    for name, t in (("a", a), ("b", b), ("norm_weight", norm_weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{OP}: {name} must be a tensor, got {type(t).__name__}")
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        raise ValueError(f"{OP}: a and b must share shape, dtype and device, got {tuple(a.shape)} {a.dtype} "
                         f"{a.device} and {tuple(b.shape)} {b.dtype} {b.device}")
    check_router_mask_args(a, w_in, b_in, w_out, b_out, op=OP)
    if norm_weight.dim() != 1 or norm_weight.shape[0] != a.shape[-1]:
        raise ValueError(f"{OP}: norm_weight must have shape ({a.shape[-1]},), got {tuple(norm_weight.shape)}")
    if norm_weight.device != a.device:
        raise ValueError(f"{OP}: norm_weight is on {norm_weight.device} but a is on {a.device}")
    if not norm_weight.dtype.is_floating_point:
        raise TypeError(f"{OP}: norm_weight must be floating point, got {norm_weight.dtype}")
    if not isinstance(eps, float) or not eps >= 0.0:
        raise ValueError(f"{OP}: eps must be a float >= 0, got {eps!r}")


def rmsnorm_reference(x: Tensor, norm_weight: Tensor, eps: float) -> Tensor:
    """HF's Llama-family RMSNorm of ``x`` (statistics in fp32, rounded to ``x``'s dtype, then the weight)."""
    t = x.to(torch.float32)
    return norm_weight * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def add_rmsnorm_router_reference(a: Tensor, b: Tensor, norm_weight: Tensor, eps: float, w_in: Tensor, b_in: Tensor,
                                 w_out: Tensor, b_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    x = a + b
    return x, rmsnorm_reference(x, norm_weight, eps), router_mask_reference(x, w_in, b_in, w_out, b_out)


__all__ = ["add_rmsnorm_router_reference", "check_add_rmsnorm_router_args", "norm_output_dtype",
           "rmsnorm_reference"]
