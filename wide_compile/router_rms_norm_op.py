"""``wide::router_rms_norm``: a block's residual add, RMSNorm and router decision as one op
(what ``passes/router_norm_fusion.py`` inserts in prefill-sized inference graphs).

``wide::router_rms_norm(a, b, norm_weight, eps, w_in, b_in, w_out, b_out) -> (x, y, mask)`` equals
``x = a + b``, ``y = norm_weight * (xf * rsqrt(mean(xf^2, -1) + eps)).to(x.dtype)`` with ``xf = x.float()``, and
``mask = wide::router_mask(x, w_in, b_in, w_out, b_out)``.

Devices: on CUDA the Triton template (``wide_compile.templates.router_rms_norm``: one launch reading ``a`` and ``b``
once instead of Inductor's add + norm kernel and a router launch that reads ``x`` again); elsewhere the PyTorch
reference (``templates/router_rms_norm_reference.py``), so a compiled CPU model matches eager exactly.

No gradient, like ``wide::router_mask``: the fusion applies only where the router decision was already lowered to
``router_mask`` (inference graphs).
"""
from __future__ import annotations

import torch
from torch import Tensor


def _reference():
    from wide_compile.templates import router_rms_norm_reference  # late: the templates package loads Triton

    return router_rms_norm_reference


@torch.library.custom_op("wide::router_rms_norm", mutates_args=())
def router_rms_norm(a: Tensor, b: Tensor, norm_weight: Tensor, eps: float, w_in: Tensor, b_in: Tensor, w_out: Tensor,
                    b_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(a + b, RMSNorm(a + b), router mask of a + b)`` (see module docstring); the reference off CUDA."""
    return _reference().router_rms_norm_reference(a, b, norm_weight, eps, w_in, b_in, w_out, b_out)


@router_rms_norm.register_fake
def _(a, b, norm_weight, eps, w_in, b_in, w_out, b_out):
    _reference().check_router_rms_norm_args(a, b, norm_weight, eps, w_in, b_in, w_out, b_out)
    mask = a.new_empty((*a.shape[:-1], w_out.shape[0] // 2), dtype=w_in.dtype)
    return torch.empty_like(a), torch.empty_like(a), mask


@router_rms_norm.register_kernel("cuda")
def router_rms_norm_kernel(a, b, norm_weight, eps, w_in, b_in, w_out, b_out):
    """The Triton template (registered for CUDA; callable on CPU under ``TRITON_INTERPRET=1`` for tests)."""
    from wide_compile.templates.router_rms_norm import router_rms_norm as template

    return template(a, b, norm_weight, eps, w_in, b_in, w_out, b_out)


def _no_gradient(ctx, *grads):
    raise RuntimeError(
        "wide::router_rms_norm has no gradient: the wide backend inserts it only in inference graphs, where the "
        "router decision is wide::router_mask. For training compile under torch.enable_grad() with trainable routers.")


def _setup(ctx, inputs, output):
    pass


router_rms_norm.register_autograd(_no_gradient, setup_context=_setup)
