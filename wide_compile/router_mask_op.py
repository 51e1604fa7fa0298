"""``wide::router_mask``: a router's inference decision as one op (what ``passes/router_lowering.py`` inserts).

``wide::router_mask(x, w_in, b_in, w_out, b_out) -> mask[..., G]`` equals
``wide::threshold_gate(wide::router_logits(x.to(w_in.dtype), w_in, b_in, w_out, b_out), None, tau)``: 1.0 where
``logit_execute >= logit_skip`` (``tau`` does not change a noise-free hard decision), in ``w_in``'s dtype.

Devices: on CUDA, where :func:`fused_for` says so, the Triton template (``wide_compile.templates.router_mask``: one
launch instead of a cast, two GEMMs / GEMVs and a compare; decisions equal the fp32 reference except on near-ties);
for one token on CUDA, ``wide_compile.templates.router_one_token`` (one launch of ``R`` programs); for other token
counts on CUDA, and on every other device, the PyTorch reference
(``templates/router_mask_reference.py``: cuBLAS on CUDA), so a compiled CPU model matches eager exactly.

Why these sizes (H200, Llama-3-8B router shapes, ``benchmarks/results/kernels_router.md``; whole-model runs in
``benchmarks/notes_e2e.md``): the fused kernel made decode steps faster at batch 8 (11.24 vs 13.33 ms) and 32
(28.08 vs 29.32 ms), but slower at batch 1 (about 2 µs more per router). Above 64 tokens its fp32 FMA form was
slower than cuBLAS (198 µs per router at 4096 tokens against 108); with a 16-bit ``x`` it now multiplies on the
tensor cores (``W_SPLIT3``), which is used for every larger token count.

No gradient: the lowering applies only to graphs where nothing needs one (inference). Asking for a gradient through
this op raises a RuntimeError; training keeps ``router_logits`` + ``threshold_gate`` and their straight-through
gradient.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _reference():
    from wide_compile.templates import router_mask_reference  # imported late: the templates package loads Triton

    return router_mask_reference


FUSED_TOKENS = (2, 64)  # inclusive token range where the fused kernel runs on CUDA for any x dtype
SPLIT_DTYPES = (torch.bfloat16, torch.float16)  # x dtypes whose larger token counts run fused (W_SPLIT3)


def fused_for(tokens: int, x_dtype: torch.dtype) -> bool:
    """Whether a call with ``tokens`` tokens of ``x_dtype`` runs the fused kernel on CUDA (see module docstring)."""
    return FUSED_TOKENS[0] <= tokens <= FUSED_TOKENS[1] or (tokens > FUSED_TOKENS[1] and x_dtype in SPLIT_DTYPES)


def _check_parts(x: Tensor, w_in: Tensor, w_parts: Tensor | None) -> None:
    if w_parts is not None:
        from wide_compile.templates.router_mask import check_w_parts

        check_w_parts(w_parts, x, w_in)


@torch.library.custom_op("wide::router_mask", mutates_args=())
def router_mask(x: Tensor, w_in: Tensor, b_in: Tensor, w_out: Tensor, b_out: Tensor,
                w_parts: Tensor | None = None) -> Tensor:
    """Hard router decision ``mask[..., G]`` (see module docstring); the reference on non-CUDA devices. ``w_parts``:
    ``W_in``'s two 16-bit parts made once per forward (``passes/router_weight_split.py``), which the CUDA kernel
    reads instead of splitting ``W_in`` itself; checked, and never changing the result."""
    _check_parts(x, w_in, w_parts)
    return _reference().router_mask_reference(x, w_in, b_in, w_out, b_out)


@router_mask.register_fake
def _(x, w_in, b_in, w_out, b_out, w_parts=None):
    _reference().check_router_mask_args(x, w_in, b_in, w_out, b_out)
    _check_parts(x, w_in, w_parts)
    return x.new_empty((*x.shape[:-1], w_out.shape[0] // 2), dtype=w_in.dtype)


@router_mask.register_kernel("cuda")
def router_mask_kernel(x, w_in, b_in, w_out, b_out, w_parts=None):
    """The template path where :func:`fused_for` says so, else the reference (registered for CUDA; callable on CPU under
    ``TRITON_INTERPRET=1`` for tests)."""
    _check_parts(x, w_in, w_parts)
    tokens = x.numel() // max(1, x.shape[-1]) if x.dim() else 1
    if tokens == 1:
        from wide_compile.templates.router_one_token import router_one_token

        return router_one_token(x, w_in, b_in, w_out, b_out)
    if not fused_for(tokens, x.dtype):
        return _reference().router_mask_reference(x, w_in, b_in, w_out, b_out)
    from wide_compile.templates.router_mask import router_mask as template

    return template(x, w_in, b_in, w_out, b_out, w_parts=w_parts)


def _no_gradient(ctx, grad):
    raise RuntimeError(
        "wide::router_mask has no gradient: it is the inference form of a router (the wide backend inserts it only "
        "where nothing needs a gradient). For router training use wide::router_logits + wide::threshold_gate "
        "(their straight-through gradient), e.g. compile under torch.enable_grad() with trainable routers.")


def _setup(ctx, inputs, output):
    pass


router_mask.register_autograd(_no_gradient, setup_context=_setup)
