"""Pure-PyTorch reference and input checks of the fused router decision (``router_mask``).

The router of a routed block is low rank: ``h = x W_in^T + b_in`` (``W_in[R, H]``), ``l = h W_out^T + b_out``
(``W_out[2G, R]``) viewed ``[..., G, 2]`` (index 0 = skip, 1 = execute); at inference a group executes iff
``l[..., 1] >= l[..., 0]``. The mask has ``x``'s leading dims, ``G`` groups, and the routers' dtype.

No Triton import here: the op's CPU path and fake implementation use this module.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
WEIGHT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_router_mask_args(x: Tensor, w_in: Tensor, b_in: Tensor, w_out: Tensor, b_out: Tensor,
                           op: str = "router_mask") -> None:
    """ValueError / TypeError naming what is wrong (sizes through ``torch._check_value``: symbolic sizes work)."""
    named = (("x", x), ("w_in", w_in), ("b_in", b_in), ("w_out", w_out), ("b_out", b_out))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a tensor, got {type(t).__name__}")
    if x.dtype not in X_DTYPES:
        raise TypeError(f"{op}: x dtype {x.dtype} is not supported (bfloat16, float16 or float32)")
    if w_in.dtype not in WEIGHT_DTYPES:
        raise TypeError(f"{op}: router weight dtype {w_in.dtype} is not supported (float32, float16 or bfloat16)")
    for name, t in named[2:]:
        if t.dtype != w_in.dtype:
            raise TypeError(f"{op}: {name} dtype {t.dtype} differs from w_in dtype {w_in.dtype}")
    for name, t in named[1:]:
        if t.device != x.device:
            raise ValueError(f"{op}: {name} is on {t.device} but x is on {x.device}")
    for name, t, rank in (("w_in", w_in, 2), ("b_in", b_in, 1), ("w_out", w_out, 2), ("b_out", b_out, 1)):
        if t.dim() != rank:
            raise ValueError(f"{op}: {name} must be {rank}-D, got shape {tuple(t.shape)}")
    if x.dim() < 1:
        raise ValueError(f"{op}: x must be [..., H] (at least 1-D), got a 0-D tensor")
    rank, two_g = w_in.shape[0], w_out.shape[0]
    torch._check_value(x.shape[-1] >= 1 and rank >= 1, lambda: f"{op}: x has H={x.shape[-1]} features and w_in "
                       f"rank R={rank}; both must be >= 1")
    torch._check_value(w_in.shape[1] == x.shape[-1],
                       lambda: f"{op}: w_in is {tuple(w_in.shape)} = [R, H] but x has H={x.shape[-1]} features")
    torch._check_value(b_in.shape[0] == rank,
                       lambda: f"{op}: b_in has {b_in.shape[0]} entries but w_in has rank R={rank}")
    torch._check_value(w_out.shape[1] == rank,
                       lambda: f"{op}: w_out is {tuple(w_out.shape)} = [2G, R] but w_in has rank R={rank}")
    torch._check_value(two_g >= 2 and two_g % 2 == 0,
                       lambda: f"{op}: w_out must have 2*G rows (skip, execute per group), got {two_g}")
    torch._check_value(b_out.shape[0] == two_g,
                       lambda: f"{op}: b_out has {b_out.shape[0]} entries but w_out has 2G={two_g} rows")


def router_logits_reference(x: Tensor, w_in: Tensor, b_in: Tensor, w_out: Tensor, b_out: Tensor) -> Tensor:
    """``F.linear(F.linear(x.to(w_in.dtype), w_in, b_in), w_out, b_out)`` as ``[..., G, 2]`` (autocast off)."""
    with torch.autocast(x.device.type, enabled=False):
        logits = F.linear(F.linear(x.to(w_in.dtype), w_in, b_in), w_out, b_out)
    return logits.unflatten(-1, (w_out.shape[0] // 2, 2))


def router_mask_reference(x: Tensor, w_in: Tensor, b_in: Tensor, w_out: Tensor, b_out: Tensor) -> Tensor:
    """``mask[..., G]`` in ``w_in``'s dtype: 1.0 where ``logit_execute >= logit_skip``, else 0.0."""
    check_router_mask_args(x, w_in, b_in, w_out, b_out)
    logits = router_logits_reference(x, w_in, b_in, w_out, b_out)
    return (logits[..., 1] >= logits[..., 0]).to(logits.dtype)


def router_mask_reduction(x: Tensor, w_in: Tensor, b_in: Tensor, w_out: Tensor, b_out: Tensor) -> Tensor:
    """:func:`router_mask_reference` written as broadcast multiplies and sums instead of two matmuls (decisions equal
    except on near-ties: another summation order). Meant for one token under Inductor, which turns it into two fused
    reduction kernels where the matmul form runs about five (cuBLAS GEMV, dot and reduce, a cast, a compare); at more
    tokens the matmul form is the right one. The second sum computes each group's margin ``logit[1] - logit[0]``
    directly, from the differences of the two rows of ``w_out`` / ``b_out``: its compare then reads the reduction's
    own output and fuses into it (comparing two logits read from one reduction output took a third kernel)."""
    check_router_mask_args(x, w_in, b_in, w_out, b_out)
    with torch.autocast(x.device.type, enabled=False):
        h = (x.to(w_in.dtype).unsqueeze(-2) * w_in).sum(-1) + b_in
        w_pairs, b_pairs = w_out.unflatten(0, (-1, 2)), b_out.unflatten(0, (-1, 2))
        margin = (h.unsqueeze(-2) * (w_pairs[:, 1] - w_pairs[:, 0])).sum(-1) + (b_pairs[:, 1] - b_pairs[:, 0])
    return (margin >= 0).to(w_in.dtype)
