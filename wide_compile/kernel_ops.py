"""Lowered ``wide::`` ops that the ``wide`` torch.compile backend puts in place of masked projections.

(The lowered attention core, ``wide::group_attention``, lives in :mod:`wide_compile.group_attention_op`.)

- ``wide::masked_input_linear(x, mask, weight, bias, group_size, x_is_masked=False) -> y[..., N]``
    ``x_is_masked=False``: ``y = linear(group_mask(x, mask, group_size), weight, bias)``.
    ``x_is_masked=True``: ``y = linear(x, weight, bias)``; the caller guarantees that ``x`` is already 0 in each
    token's inactive groups (``x`` comes from ``wide::gated_up_groups`` with the same mask), so ``mask`` is only a
    sparsity hint for the kernel and gets no gradient from this op.
- ``wide::masked_input_linear_add_(residual, x, mask, weight, bias, group_size, x_is_masked=False)``
    ``residual += masked_input_linear(x, mask, weight, bias, group_size, x_is_masked)`` in place (inference only:
    no autograd formula; ``passes/residual_add_fusion.py`` inserts it where a residual connection follows).
- ``wide::gated_up_groups(x, w_gate, w_up, mask, group_size, activation) -> h[..., I]``
    ``h = group_mask(act(linear(x, w_gate)) * linear(x, w_up), mask, group_size)``; ``activation`` is ``"silu"``,
    ``"gelu"`` or ``"gelu_tanh"``.
- ``wide::output_group_linear(x, mask, weight, bias, group_size) -> y[..., N]``
    ``y = group_mask(linear(x, weight, bias), mask, group_size)``: each token computes only its active output groups
    (the attention query projection; ``mask[..., G]`` with ``G * group_size = N`` and ``mask.shape[:-1] ==
    x.shape[:-1]``). Its mask gradient is that of the expression, ``sum(grad * linear(x))`` per group.

Devices: on CUDA the Triton templates run (``input_group_linear`` / ``gated_up_groups`` / ``output_group_linear``
of ``wide_compile.templates``; they skip inactive groups). On every other device, and on CUDA
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


@torch.library.custom_op("wide::masked_input_linear_add_", mutates_args=("residual",))
def masked_input_linear_add_(
    residual: Tensor, x: Tensor, mask: Tensor, weight: Tensor, bias: Tensor | None, group_size: int,
    x_is_masked: bool = False,
) -> None:
    """``residual += masked_input_linear(x, mask, weight, bias, group_size, x_is_masked)``, in place: a residual
    connection after an output or down projection (``passes/residual_add_fusion.py``; inference graphs only, no
    gradient). On CUDA's cuBLAS path the GEMM adds the residual in its epilogue (``templates.input_group_linear``'s
    ``residual``)."""
    _refuse_gradients(residual, x, mask)
    _check_residual(residual, x, weight)
    residual.add_(masked_input_linear(x, mask, weight, bias, group_size, x_is_masked))


def _check_residual(residual: Tensor, x: Tensor, weight: Tensor) -> None:
    shape = (*x.shape[:-1], weight.shape[0])
    if tuple(residual.shape) != shape or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(f"masked_input_linear_add_: residual must be {x.dtype} of shape {shape} on {x.device}, got "
                         f"{residual.dtype} {tuple(residual.shape)} on {residual.device}")


@masked_input_linear_add_.register_fake
def _(residual, x, mask, weight, bias, group_size, x_is_masked=False):
    _check_group_size("masked_input_linear_add_", x.shape[-1], mask, group_size)
    _check_residual(residual, x, weight)


def _refuse_gradients(*activations: Tensor) -> None:
    """A clear error instead of a missing gradient: the in-place op has no autograd formula (the pass inserts it only
    in inference graphs, where no activation requires grad). The implementations check their activations (residual,
    x, mask) because the grad mode is not visible below autograd, and an Autograd kernel of our own would clash with
    the one ``torch.library.custom_op`` keeps for mutable ops (torch 2.11 refuses the second registration)."""
    if any(t.requires_grad for t in activations):
        raise RuntimeError(
            "wide::masked_input_linear_add_ has no gradient and was called with an activation that requires grad: it "
            "is the inference form of a projection followed by a residual connection (passes/residual_add_fusion.py "
            "inserts it only where nothing needs a gradient); use wide::masked_input_linear and an addition for "
            "training")


@masked_input_linear_add_.register_kernel("cuda")
def masked_input_linear_add_kernel(residual, x, mask, weight, bias, group_size, x_is_masked=False):
    """The template path with the residual added in place (registered for CUDA)."""
    _refuse_gradients(residual, x, mask)
    _check_residual(residual, x, weight)
    if not _kernel_ok(x, weight, bias, residual) or not residual.is_contiguous():
        residual.add_(masked_input_linear_kernel(x, mask, weight, bias, group_size, x_is_masked))
        return
    from wide_compile.templates import input_group_linear

    input_group_linear(x, weight, mask, group_size, bias, x_is_masked=x_is_masked, residual=residual)

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
