"""Pure-PyTorch reference and input checks of the residual add + RMSNorm + router decision (``router_rms_norm``).

A decoder layer's block starts from the residual stream: ``x = a + b`` (the previous residual plus the previous
block's output), then the block's router reads ``x`` (the residual before the norm, as WIDE's routers do) and the
block reads ``RMSNorm(x)``. The norm is the Llama form, which most HF decoders share::

    xf = x.to(float32); y = weight * (xf * rsqrt(mean(xf^2, -1) + eps)).to(x.dtype)

No Triton import here: the op's CPU path and fake implementation use this module.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .router_mask_reference import check_router_mask_args, router_mask_reference

X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_router_rms_norm_args(a: Tensor, b: Tensor, norm_weight: Tensor, eps: float, w_in: Tensor, b_in: Tensor,
                               w_out: Tensor, b_out: Tensor) -> None:
    """TypeError / ValueError naming what is wrong (the router's own checks through ``check_router_mask_args``)."""
    op = "router_rms_norm"
    for name, t in (("a", a), ("b", b), ("norm_weight", norm_weight)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a tensor, got {type(t).__name__}")
    if a.dtype not in X_DTYPES:
        raise TypeError(f"{op}: a dtype {a.dtype} is not supported (bfloat16, float16 or float32)")
    for name, t in (("b", b), ("norm_weight", norm_weight)):
        if t.dtype != a.dtype:
            raise TypeError(f"{op}: {name} dtype {t.dtype} differs from a dtype {a.dtype}")
        if t.device != a.device:
            raise ValueError(f"{op}: {name} is on {t.device} but a is on {a.device}")
    if a.dim() < 1 or b.shape != a.shape:
        raise ValueError(f"{op}: a and b must have one shape [..., H], got {tuple(a.shape)} and {tuple(b.shape)}")
    if norm_weight.shape != a.shape[-1:]:
        raise ValueError(f"{op}: norm_weight must have shape ({a.shape[-1]},), got {tuple(norm_weight.shape)}")
    if not isinstance(eps, float) or not eps >= 0.0:
        raise ValueError(f"{op}: eps must be a float >= 0, got {eps!r}")
    check_router_mask_args(a, w_in, b_in, w_out, b_out, op=op)


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """The Llama RMSNorm: statistics in fp32, the normalised value cast back to ``x``'s dtype, then the weight."""
    xf = x.to(torch.float32)
    variance = xf.pow(2).mean(-1, keepdim=True)
    return weight * (xf * torch.rsqrt(variance + eps)).to(x.dtype)


def router_rms_norm_reference(a: Tensor, b: Tensor, norm_weight: Tensor, eps: float, w_in: Tensor, b_in: Tensor,
                              w_out: Tensor, b_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(x, RMSNorm(x), router mask of x)`` with ``x = a + b``."""
    check_router_rms_norm_args(a, b, norm_weight, eps, w_in, b_in, w_out, b_out)
    x = a + b
    return x, rms_norm_reference(x, norm_weight, eps), router_mask_reference(x, w_in, b_in, w_out, b_out)


__all__ = ["check_router_rms_norm_args", "rms_norm_reference", "router_rms_norm_reference"]
