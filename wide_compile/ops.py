"""The ``wide`` custom-op namespace: router logits, gate decisions and group masking.

Every op has a PyTorch reference implementation (used in eager mode and on CPU), a fake implementation
(so ``torch.compile``/``torch.export`` trace them as single nodes) and an autograd formula, so eager
training, compiled training and inference all see the same ops, and the ``wide`` backend can lower
exactly these nodes to Triton templates.

Shapes: ``x[..., hidden]``; router logits ``[..., groups, 2]`` with index 0 = skip, 1 = execute;
masks ``[..., groups]`` in the activation dtype, 1.0 = execute, 0.0 = skip.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# --------------------------------------------------------------------------------------- router logits


@torch.library.custom_op("wide::router_logits", mutates_args=())
def router_logits(x: Tensor, w_in: Tensor, b_in: Tensor, w_out: Tensor, b_out: Tensor) -> Tensor:
    """Low-rank router: ``(x @ w_in.T + b_in) @ w_out.T + b_out`` viewed as ``[..., groups, 2]``.

    Computed in the dtypes it is given, also inside an autocast region (routers are cheap, and their
    decisions must not depend on whether training runs under bf16 autocast).
    """
    with torch.autocast(x.device.type, enabled=False):
        out = F.linear(F.linear(x, w_in, b_in), w_out, b_out)
    return out.unflatten(-1, (w_out.shape[0] // 2, 2))


@router_logits.register_fake
def _(x, w_in, b_in, w_out, b_out):
    return x.new_empty((*x.shape[:-1], w_out.shape[0] // 2, 2))


def _router_setup(ctx, inputs, output):
    x, w_in, b_in, w_out, _ = inputs
    ctx.save_for_backward(x, w_in, b_in, w_out)


def _router_backward(ctx, grad):
    x, w_in, b_in, w_out = ctx.saved_tensors
    g = grad.flatten(-2).to(w_out.dtype)  # [..., 2G]
    h = F.linear(x.to(w_in.dtype), w_in, b_in)
    g2, h2, x2 = g.reshape(-1, g.shape[-1]), h.reshape(-1, h.shape[-1]), x.reshape(-1, x.shape[-1])
    g_h = g @ w_out
    gx = (g_h @ w_in).to(x.dtype) if ctx.needs_input_grad[0] else None
    g_h2 = g_h.reshape(-1, g_h.shape[-1])
    return (
        gx,
        g_h2.T @ x2.to(w_in.dtype) if ctx.needs_input_grad[1] else None,
        g_h2.sum(0) if ctx.needs_input_grad[2] else None,
        g2.T @ h2 if ctx.needs_input_grad[3] else None,
        g2.sum(0) if ctx.needs_input_grad[4] else None,
    )


router_logits.register_autograd(_router_backward, setup_context=_router_setup)

# --------------------------------------------------------------------------------------- decisions


def _execute_prob(logits: Tensor, noise: Tensor | None, tau: Tensor) -> Tensor:
    """softmax((logits + noise) / tau)[..., 1], computed in at least float32."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    z = logits.to(dtype) if noise is None else logits.to(dtype) + noise.to(dtype)
    return torch.sigmoid((z[..., 1] - z[..., 0]) / tau.to(dtype))


@torch.library.custom_op("wide::threshold_gate", mutates_args=())
def threshold_gate(logits: Tensor, noise: Tensor | None, tau: Tensor) -> Tensor:
    """Hard gate: execute iff ``logit_exec + g_exec >= logit_skip + g_skip`` (Gumbel noise ``g`` or none).

    Forward value is the hard 0/1 decision; the gradient is the straight-through estimator through
    ``softmax((logits + g) / tau)[..., 1]`` (hard Gumbel-softmax).
    """
    z = logits if noise is None else logits + noise
    return (z[..., 1] >= z[..., 0]).to(logits.dtype)


@threshold_gate.register_fake
def _(logits, noise, tau):
    return logits.new_empty(logits.shape[:-1])


@torch.library.custom_op("wide::topk_gate", mutates_args=())
def topk_gate(logits: Tensor, noise: Tensor | None, tau: Tensor, k: int) -> Tensor:
    """Exact budget: execute the ``k`` groups with the largest margin ``(exec - skip)`` per token.

    Straight-through gradient as in :func:`threshold_gate`.
    """
    z = logits if noise is None else logits + noise
    margin = (z[..., 1] - z[..., 0]).float()
    mask = torch.zeros_like(margin, dtype=logits.dtype)
    if k > 0:
        mask.scatter_(-1, margin.topk(k, dim=-1).indices, 1.0)
    return mask


@topk_gate.register_fake
def _(logits, noise, tau, k):
    return logits.new_empty(logits.shape[:-1])


def _gate_setup(ctx, inputs, output):
    logits, noise, tau = inputs[:3]
    ctx.save_for_backward(logits, noise if noise is not None else logits.new_empty(0), tau)
    ctx.has_noise = noise is not None


def _gate_backward(ctx, grad):
    logits, noise, tau = ctx.saved_tensors
    p = _execute_prob(logits, noise if ctx.has_noise else None, tau)
    d_margin = grad.to(p.dtype) * p * (1 - p) / tau.to(p.dtype)
    g = torch.stack([-d_margin, d_margin], dim=-1).to(logits.dtype)
    return g, None, None


def _topk_backward(ctx, grad):
    return (*_gate_backward(ctx, grad), None)


threshold_gate.register_autograd(_gate_backward, setup_context=_gate_setup)
topk_gate.register_autograd(_topk_backward, setup_context=_gate_setup)

# --------------------------------------------------------------------------------------- group masking


@torch.library.custom_op("wide::group_mask", mutates_args=())
def group_mask(x: Tensor, mask: Tensor, group_size: int) -> Tensor:
    """Zero each token's inactive channel groups: ``x[..., g*gs:(g+1)*gs] *= mask[..., g]``.

    The dynamic-width op at the input of a down / output projection; the ``wide`` backend lowers
    ``linear(group_mask(x, m), W)`` to an input-group-skipping GEMM.
    """
    groups = mask.shape[-1]
    return (x.unflatten(-1, (groups, group_size)) * mask.unsqueeze(-1).to(x.dtype)).flatten(-2)


@group_mask.register_fake
def _(x, mask, group_size):
    torch._check(x.shape[-1] == mask.shape[-1] * group_size)
    return torch.empty_like(x)


def _group_mask_setup(ctx, inputs, output):
    x, mask, group_size = inputs
    ctx.save_for_backward(x, mask)
    ctx.group_size = group_size


def _group_mask_backward(ctx, grad):
    x, mask = ctx.saved_tensors
    gx = group_mask(grad, mask, ctx.group_size) if ctx.needs_input_grad[0] else None
    gm = None
    if ctx.needs_input_grad[1]:
        prod = (grad * x).unflatten(-1, (mask.shape[-1], ctx.group_size)).sum(-1)
        gm = prod.to(mask.dtype)
    return gx, gm, None


group_mask.register_autograd(_group_mask_backward, setup_context=_group_mask_setup)


def gumbel_noise(like: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Standard Gumbel noise shaped like ``like`` (float32 for stability)."""
    u = torch.rand(like.shape, device=like.device, dtype=torch.float32, generator=generator)
    return -torch.log(-torch.log(u.clamp_(1e-10, 1.0 - 1e-7)))
