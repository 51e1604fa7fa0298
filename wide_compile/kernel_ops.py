"""Lowered ``wide::`` ops that the ``wide`` torch.compile backend puts in place of masked projections.

- ``wide::masked_input_linear(x, mask, weight, bias, group_size, x_is_masked=False) -> y[..., N]``
    ``x_is_masked=False``: ``y = linear(group_mask(x, mask, group_size), weight, bias)``.
    ``x_is_masked=True``: ``y = linear(x, weight, bias)``; the caller guarantees that ``x`` is already 0 in each
    token's inactive groups (``x`` comes from ``wide::gated_up_groups`` with the same mask), so ``mask`` is only a
    sparsity hint for the kernel and gets no gradient from this op.
- ``wide::gated_up_groups(x, w_gate, w_up, mask, group_size, activation) -> h[..., I]``
    ``h = group_mask(act(linear(x, w_gate)) * linear(x, w_up), mask, group_size)``; ``activation`` is ``"silu"``,
    ``"gelu"`` or ``"gelu_tanh"``.
- ``wide::output_group_linear(x, mask, weight, bias, group_size) -> y[..., N]``
    ``y = group_mask(linear(x, weight, bias), mask, group_size)``: each token computes only its active output groups
    (the attention query projection; ``mask[..., G]`` with ``G * group_size = N`` and ``mask.shape[:-1] ==
    x.shape[:-1]``). Its mask gradient is that of the expression, ``sum(grad * linear(x))`` per group.
- ``wide::group_attention(q, k, v, mask, is_causal, scale=None) -> o[B, H, T, D]``
    ``o = scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)`` (GQA when ``k``/``v`` have fewer
    heads) times 0 for the query heads of each token's inactive groups (``mask[B, T, G]``, group ``g`` = heads
    ``[g*H/G, (g+1)*H/G)``). On CUDA the head-group attention templates run when they compute exactly that (bf16 /
    fp16 / fp32, head_dim <= 256, and ``T == S`` when causal: SDPA aligns a causal mask top-left, the templates
    bottom-right); backward recomputes the attention in fp32 math (it is not skipped).

Devices: on CUDA the Triton templates run (``input_group_linear`` / ``gated_up_groups`` / ``output_group_linear`` /
``group_attention`` of ``wide_compile.templates``; they skip inactive groups). On every other device, and on CUDA
for inputs the kernels do not take (dtypes other than bf16/fp16/fp32, mixed dtypes), the ops compute exactly the
PyTorch expressions above, so a compiled CPU model matches eager. The kernels read ``mask != 0`` as "active", which equals the expressions for the
0/1 masks that routers and forced decisions produce.

Backward (all devices): dense PyTorch math giving the same gradients as the unrewritten graph, including the
straight-through gradient of the mask (it needs the dense products, so only the forward skips work).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

ACTIVATIONS = ("silu", "gelu", "gelu_tanh")
_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def mask_groups(x: Tensor, mask: Tensor, group_size: int) -> Tensor:
    """``x[..., g*gs:(g+1)*gs] * mask[..., g]`` (the math of ``wide::group_mask``)."""
    return (x.unflatten(-1, (mask.shape[-1], group_size)) * mask.unsqueeze(-1).to(x.dtype)).flatten(-2)


def group_sums(x: Tensor, groups: int, group_size: int) -> Tensor:
    """``x[..., K]`` -> per-group sums ``[..., groups]``."""
    return x.unflatten(-1, (groups, group_size)).sum(-1)


def activation_fn(v: Tensor, activation: str) -> Tensor:
    if activation == "silu":
        return F.silu(v)
    if activation == "gelu":
        return F.gelu(v)
    if activation == "gelu_tanh":
        return F.gelu(v, approximate="tanh")
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def activation_backward(grad: Tensor, v: Tensor, activation: str) -> Tensor:
    if activation == "silu":
        return torch.ops.aten.silu_backward(grad, v)
    return torch.ops.aten.gelu_backward(grad, v, approximate="tanh" if activation == "gelu_tanh" else "none")


def _check_group_size(op: str, k_dim: int, mask: Tensor, group_size: int) -> None:
    torch._check(
        k_dim == mask.shape[-1] * group_size,
        lambda: f"{op}: x has {k_dim} features but mask has {mask.shape[-1]} groups of {group_size}",
    )


def _kernel_ok(*tensors: Tensor | None) -> bool:
    present = [t for t in tensors if t is not None]
    return all(t.dtype == present[0].dtype and t.dtype in _KERNEL_DTYPES for t in present)


# ------------------------------------------------------------------------------------ masked_input_linear


@torch.library.custom_op("wide::masked_input_linear", mutates_args=())
def masked_input_linear(
    x: Tensor, mask: Tensor, weight: Tensor, bias: Tensor | None, group_size: int, x_is_masked: bool = False
) -> Tensor:
    """``linear(group_mask(x, mask, group_size), weight, bias)`` (see module docstring for ``x_is_masked``)."""
    _check_group_size("masked_input_linear", x.shape[-1], mask, group_size)
    return F.linear(x if x_is_masked else mask_groups(x, mask, group_size), weight, bias)


@masked_input_linear.register_fake
def _(x, mask, weight, bias, group_size, x_is_masked=False):
    _check_group_size("masked_input_linear", x.shape[-1], mask, group_size)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@masked_input_linear.register_kernel("cuda")
def masked_input_linear_kernel(x, mask, weight, bias, group_size, x_is_masked=False):
    """The template path (registered for CUDA; callable on CPU under ``TRITON_INTERPRET=1`` for tests)."""
    if not _kernel_ok(x, weight, bias):
        return F.linear(x if x_is_masked else mask_groups(x, mask, group_size), weight, bias)
    from wide_compile.templates import input_group_linear

    return input_group_linear(x, weight, mask, group_size, bias, x_is_masked=x_is_masked)


def _mil_setup(ctx, inputs, output):
    x, mask, weight, bias, group_size, x_is_masked = inputs
    ctx.save_for_backward(x, mask, weight)
    ctx.group_size, ctx.x_is_masked = group_size, x_is_masked


def _mil_backward(ctx, grad):
    x, mask, weight = ctx.saved_tensors
    gs, x_is_masked = ctx.group_size, ctx.x_is_masked
    need_x, need_mask, need_w, need_b = ctx.needs_input_grad[:4]
    need_mask = need_mask and not x_is_masked
    gx = gmask = gw = gb = None
    if need_x or need_mask:
        g_in = torch.matmul(grad, weight)  # dense d(loss)/d(masked x)
        if need_x:
            gx = g_in if x_is_masked else mask_groups(g_in, mask, gs)
        if need_mask:
            gmask = group_sums(g_in * x, mask.shape[-1], gs).to(mask.dtype)
    if need_w:
        xm = x if x_is_masked else mask_groups(x, mask, gs)
        gw = grad.reshape(-1, grad.shape[-1]).T @ xm.reshape(-1, xm.shape[-1])
    if need_b:
        gb = grad.reshape(-1, grad.shape[-1]).sum(0)
    return gx, gmask, gw, gb, None, None


masked_input_linear.register_autograd(_mil_backward, setup_context=_mil_setup)

# ------------------------------------------------------------------------------------ gated_up_groups


def _gated_product(x: Tensor, w_gate: Tensor, w_up: Tensor, activation: str) -> tuple[Tensor, Tensor, Tensor]:
    g, u = F.linear(x, w_gate), F.linear(x, w_up)
    return g, u, activation_fn(g, activation)


@torch.library.custom_op("wide::gated_up_groups", mutates_args=())
def gated_up_groups(
    x: Tensor, w_gate: Tensor, w_up: Tensor, mask: Tensor, group_size: int, activation: str = "silu"
) -> Tensor:
    """``group_mask(act(linear(x, w_gate)) * linear(x, w_up), mask, group_size)``."""
    _check_group_size("gated_up_groups", w_gate.shape[0], mask, group_size)
    _, u, a = _gated_product(x, w_gate, w_up, activation)
    return mask_groups(a * u, mask, group_size)


@gated_up_groups.register_fake
def _(x, w_gate, w_up, mask, group_size, activation="silu"):
    _check_group_size("gated_up_groups", w_gate.shape[0], mask, group_size)
    if activation not in ACTIVATIONS:
        raise ValueError(f"gated_up_groups: activation must be one of {ACTIVATIONS}, got {activation!r}")
    return x.new_empty((*x.shape[:-1], w_gate.shape[0]))


@gated_up_groups.register_kernel("cuda")
def gated_up_groups_kernel(x, w_gate, w_up, mask, group_size, activation="silu"):
    """The template path (registered for CUDA; callable on CPU under ``TRITON_INTERPRET=1`` for tests)."""
    if not _kernel_ok(x, w_gate, w_up):
        _, u, a = _gated_product(x, w_gate, w_up, activation)
        return mask_groups(a * u, mask, group_size)
    from wide_compile.templates import gated_up_groups as template

    return template(x, w_gate, w_up, mask, group_size, activation)


def _gated_setup(ctx, inputs, output):
    x, w_gate, w_up, mask, group_size, activation = inputs
    ctx.save_for_backward(x, w_gate, w_up, mask)
    ctx.group_size, ctx.activation = group_size, activation


def _gated_backward(ctx, grad):
    x, w_gate, w_up, mask = ctx.saved_tensors
    gs = ctx.group_size
    need_x, need_wg, need_wu, need_mask = ctx.needs_input_grad[:4]
    g, u, a = _gated_product(x, w_gate, w_up, ctx.activation)  # recomputed densely
    gp = mask_groups(grad, mask, gs)
    gmask = group_sums(grad * (a * u), mask.shape[-1], gs).to(mask.dtype) if need_mask else None
    gg = activation_backward(gp * u, g, ctx.activation)
    gu = gp * a
    gx = torch.matmul(gg, w_gate) + torch.matmul(gu, w_up) if need_x else None
    x2 = x.reshape(-1, x.shape[-1])
    gwg = gg.reshape(-1, gg.shape[-1]).T @ x2 if need_wg else None
    gwu = gu.reshape(-1, gu.shape[-1]).T @ x2 if need_wu else None
    return gx, gwg, gwu, gmask, None, None


gated_up_groups.register_autograd(_gated_backward, setup_context=_gated_setup)

# ------------------------------------------------------------------------------------ output_group_linear


def _check_output_group_args(x: Tensor, mask: Tensor, weight: Tensor, bias: Tensor | None, group_size: int) -> None:
    """Clear errors for bad input (shapes through ``torch._check`` so that symbolic sizes work in the fake impl)."""
    op = "output_group_linear"
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(f"{op}: group_size must be a positive int, got {group_size!r}")
    if weight.dim() != 2:
        raise ValueError(f"{op}: weight must be 2-D [N, K], got shape {tuple(weight.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != x.dtype:
            raise TypeError(f"{op}: {name} dtype {t.dtype} differs from x dtype {x.dtype}")
    if mask.dim() != x.dim():
        raise ValueError(f"{op}: mask must be [..., G] with x's leading dims {tuple(x.shape[:-1])}, "
                         f"got shape {tuple(mask.shape)}")
    for i in range(x.dim() - 1):
        torch._check(mask.shape[i] == x.shape[i], lambda: f"{op}: mask shape {tuple(mask.shape)} does not match "
                     f"x's leading dims {tuple(x.shape[:-1])}")
    torch._check(weight.shape[1] == x.shape[-1],
                 lambda: f"{op}: weight has K={weight.shape[1]} but x has {x.shape[-1]} features")
    torch._check(weight.shape[0] == mask.shape[-1] * group_size,
                 lambda: f"{op}: weight has {weight.shape[0]} outputs but mask has {mask.shape[-1]} groups of "
                 f"{group_size} (group_size must divide the output features)")
    if bias is not None:
        torch._check(bias.dim() == 1 and bias.shape[0] == weight.shape[0],
                     lambda: f"{op}: bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")


@torch.library.custom_op("wide::output_group_linear", mutates_args=())
def output_group_linear(x: Tensor, mask: Tensor, weight: Tensor, bias: Tensor | None, group_size: int) -> Tensor:
    """``group_mask(linear(x, weight, bias), mask, group_size)`` (see module docstring)."""
    _check_output_group_args(x, mask, weight, bias, group_size)
    return mask_groups(F.linear(x, weight, bias), mask, group_size)


@output_group_linear.register_fake
def _(x, mask, weight, bias, group_size):
    _check_output_group_args(x, mask, weight, bias, group_size)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@output_group_linear.register_kernel("cuda")
def output_group_linear_kernel(x, mask, weight, bias, group_size):
    """The template path (registered for CUDA; callable on CPU under ``TRITON_INTERPRET=1`` for tests)."""
    _check_output_group_args(x, mask, weight, bias, group_size)
    if not _kernel_ok(x, weight, bias):
        return mask_groups(F.linear(x, weight, bias), mask, group_size)
    from wide_compile.templates import output_group_linear as template

    return template(x, weight, mask, group_size, bias)


def _ogl_setup(ctx, inputs, output):
    x, mask, weight, bias, group_size = inputs
    ctx.save_for_backward(x, mask, weight, bias)
    ctx.group_size = group_size


def _ogl_backward(ctx, grad):
    x, mask, weight, bias = ctx.saved_tensors
    gs = ctx.group_size
    need_x, need_mask, need_w, need_b = ctx.needs_input_grad[:4]
    gy = mask_groups(grad, mask, gs)  # d(loss)/d(dense linear output)
    gx = torch.matmul(gy, weight) if need_x else None
    gw = gy.reshape(-1, gy.shape[-1]).T @ x.reshape(-1, x.shape[-1]) if need_w else None
    gb = gy.reshape(-1, gy.shape[-1]).sum(0) if need_b else None
    gmask = None
    if need_mask:  # straight-through: the dense output of every group, skipped ones included
        gmask = group_sums(grad * F.linear(x, weight, bias), mask.shape[-1], gs).to(mask.dtype)
    return gx, gmask, gw, gb, None


output_group_linear.register_autograd(_ogl_backward, setup_context=_ogl_setup)

# ------------------------------------------------------------------------------------ group_attention


def _check_group_attention_args(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> None:
    op = "group_attention"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{op}: {name} must be 4-D [batch, heads, length, head_dim], got {tuple(t.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{op}: {name} dtype {t.dtype} differs from q dtype {q.dtype}")
    if mask.dim() != 3:
        raise ValueError(f"{op}: mask must be [batch, tokens, groups], got shape {tuple(mask.shape)}")
    heads, kv_heads, groups = q.shape[1], k.shape[1], mask.shape[2]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"{op}: key/value heads ({kv_heads}) must divide query heads ({heads})")
    if groups == 0 or heads % groups:
        raise ValueError(f"{op}: mask groups ({groups}) must divide query heads ({heads})")
    torch._check(k.shape == v.shape, lambda: f"{op}: k shape {tuple(k.shape)} differs from v shape {tuple(v.shape)}")
    torch._check(k.shape[0] == q.shape[0] and k.shape[3] == q.shape[3],
                 lambda: f"{op}: k/v shape {tuple(k.shape)} does not match q {tuple(q.shape)} in batch or head_dim")
    torch._check(mask.shape[0] == q.shape[0] and mask.shape[1] == q.shape[2],
                 lambda: f"{op}: mask shape {tuple(mask.shape)} must be [batch={q.shape[0]}, tokens={q.shape[2]}, G]")


def head_mask(mask: Tensor, heads: int) -> Tensor:
    """``mask[B, T, G]`` -> ``[B, heads, T, 1]`` (group ``g`` = heads ``[g*heads/G, (g+1)*heads/G)``)."""
    return mask.transpose(1, 2).repeat_interleave(heads // mask.shape[2], dim=1).unsqueeze(-1)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, scale: float | None) -> Tensor:
    if k.shape[1] != q.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)


@torch.library.custom_op("wide::group_attention", mutates_args=())
def group_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, is_causal: bool, scale: float | None = None
                    ) -> Tensor:
    """``scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)`` (GQA when k/v have fewer heads)
    with the query heads of each token's inactive groups multiplied by 0 (see module docstring)."""
    _check_group_attention_args(q, k, v, mask)
    out = _sdpa(q, k, v, is_causal, scale)
    return out * head_mask(mask, q.shape[1]).to(out.dtype)


@group_attention.register_fake
def _(q, k, v, mask, is_causal, scale=None):
    _check_group_attention_args(q, k, v, mask)
    return torch.empty_like(q)


@group_attention.register_kernel("cuda")
def group_attention_kernel(q, k, v, mask, is_causal, scale=None):
    """The template path (skips the K/V reads and FLOPs of inactive (token, group) pairs). The templates align a
    causal mask bottom-right and SDPA top-left; they agree when ``T == S``, otherwise the PyTorch path runs."""
    _check_group_attention_args(q, k, v, mask)
    q_len, kv_len = q.shape[2], k.shape[2]
    if not _kernel_ok(q, k, v) or (is_causal and q_len != kv_len) or q.shape[-1] > 256 or kv_len == 0:
        out = _sdpa(q, k, v, is_causal, scale)
        return out * head_mask(mask, q.shape[1]).to(out.dtype)
    from wide_compile.templates import group_attention as template

    return template(q, k, v, mask, causal=is_causal, scale=scale)


def _ga_setup(ctx, inputs, output):
    q, k, v, mask, is_causal, scale = inputs
    ctx.save_for_backward(q, k, v, mask)
    ctx.is_causal, ctx.scale = is_causal, scale


def _ga_backward(ctx, grad):
    """Attention backward in fp32 from recomputed probabilities (the forward output has the skipped heads zeroed)."""
    q, k, v, mask = ctx.saved_tensors
    heads, kv_heads, groups = q.shape[1], k.shape[1], mask.shape[2]
    rep = heads // kv_heads
    acc = torch.promote_types(q.dtype, torch.float32)  # fp32 math (fp64 stays fp64)
    kf, vf = (t.to(acc).repeat_interleave(rep, dim=1) for t in (k, v))
    qf = q.to(acc)
    scale = ctx.scale if ctx.scale is not None else q.shape[-1] ** -0.5
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if ctx.is_causal:
        allowed = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, vf)
    g = grad.to(acc) * head_mask(mask, heads).to(acc)
    grad_probs = torch.matmul(g, vf.transpose(-1, -2))
    grad_scores = probs * (grad_probs - (g * out).sum(-1, keepdim=True))
    need_q, need_k, need_v, need_mask = ctx.needs_input_grad[:4]

    def per_kv_head(t: Tensor) -> Tensor:
        return t.unflatten(1, (kv_heads, rep)).sum(2)

    gq = (torch.matmul(grad_scores, kf) * scale).to(q.dtype) if need_q else None
    gk = per_kv_head(torch.matmul(grad_scores.transpose(-1, -2), qf) * scale).to(k.dtype) if need_k else None
    gv = per_kv_head(torch.matmul(probs.transpose(-1, -2), g)).to(v.dtype) if need_v else None
    gmask = None
    if need_mask:  # straight-through: the dense output of every head, skipped ones included
        per_head = (grad.to(acc) * out).sum(-1)  # [B, H, T]
        gmask = per_head.unflatten(1, (groups, heads // groups)).sum(2).transpose(1, 2).to(mask.dtype)
    return gq, gk, gv, gmask, None, None


group_attention.register_autograd(_ga_backward, setup_context=_ga_setup)
