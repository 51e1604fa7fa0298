"""``wide::output_group_linear_with_dense``: a lowered query projection and the dense linears beside it, as one op
(what ``passes/dense_siblings.py`` inserts).

``wide::output_group_linear_with_dense(x, mask, weight, bias, group_size, dense_weights, dense_biases, cos=None,
sin=None) -> Tensor[]`` equals ``[wide::output_group_linear(x, mask, weight, bias, group_size), linear(x,
dense_weights[i], dense_biases[i]) for each i]``: typically the query projection and the key and value projections of
one attention. With rotary tables ``cos`` / ``sin`` (``[B or 1, T, head_dim]`` for ``x[B, T, K]``) the first result is
the query after HF's rotary embedding, per head (``passes/query_rope_epilogue.py``; in a prefill the GEMM applies it
before its store, ``templates/rotary_epilogue.py``). ``row_order`` / ``row_count``: ``wide::group_rows(mask)`` when
computed once for this op and its attention (``passes/row_order_sharing.py``); for one sequence they are the GEMM's
per-group token lists, so it builds none (the value does not depend on them).

Devices: on CUDA the template (``templates/group_linear_with_dense.py``: at most 16 tokens and one or two dense
linears of one shape run as one GEMV launch; otherwise each result from its own kernel); on every other device the
PyTorch expressions, so a compiled CPU model matches eager.

No gradient: the pass inserts it only where nothing needs one (inference); asking for a gradient through it raises.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .kernel_ops import _check_output_group_args, _kernel_ok, mask_groups


def _check(x: Tensor, weights: list[Tensor], biases: list[Tensor | None]) -> None:
    op = "output_group_linear_with_dense"
    if len(weights) != len(biases):
        raise ValueError(f"{op}: {len(weights)} dense weights but {len(biases)} dense biases")
    for i, (w, b) in enumerate(zip(weights, biases)):
        if w.dim() != 2:
            raise ValueError(f"{op}: dense_weights[{i}] must be 2-D [N, K], got shape {tuple(w.shape)}")
        torch._check(w.shape[1] == x.shape[-1],
                     lambda i=i, w=w: f"{op}: dense_weights[{i}] has K={w.shape[1]} but x has {x.shape[-1]} features")
        if b is not None:
            torch._check(b.dim() == 1 and b.shape[0] == w.shape[0],
                         lambda i=i, w=w, b=b: f"{op}: dense_biases[{i}] must have shape ({w.shape[0]},), "
                         f"got {tuple(b.shape)}")


def _rows(mask: Tensor, row_order: Tensor | None, row_count: Tensor | None):
    from .templates.row_order import row_order_args  # here: importing the templates package imports Triton

    return row_order_args("output_group_linear_with_dense", mask, row_order, row_count)


def _rotary(x: Tensor, weight: Tensor, group_size: int, cos: Tensor | None, sin: Tensor | None):
    """``(cos, sin)`` checked against the query's output, or None when neither is given."""
    if cos is None and sin is None:
        return None
    if cos is None or sin is None:
        raise ValueError("output_group_linear_with_dense: pass both rotary tables cos and sin, or neither")
    from .templates.rotary_epilogue import check_rotary  # here, as the other op modules: the package imports Triton

    check_rotary("output_group_linear_with_dense", x, weight.shape[0], group_size, cos, sin)
    return cos, sin


def _expressions(x, mask, weight, bias, group_size, dense_weights, dense_biases, rotary) -> list[Tensor]:
    from .templates.rotary_epilogue import rotate_reference

    y = mask_groups(F.linear(x, weight, bias), mask, group_size)
    return [y if rotary is None else rotate_reference(y, *rotary),
            *(F.linear(x, w, b) for w, b in zip(dense_weights, dense_biases))]


@torch.library.custom_op("wide::output_group_linear_with_dense", mutates_args=())
def output_group_linear_with_dense(x: Tensor, mask: Tensor, weight: Tensor, bias: Tensor | None, group_size: int,
                                   dense_weights: list[Tensor], dense_biases: list[Tensor | None],
                                   cos: Tensor | None = None, sin: Tensor | None = None,
                                   row_order: Tensor | None = None, row_count: Tensor | None = None) -> list[Tensor]:
    """``[group_mask(linear(x, weight, bias), mask, group_size), *linear(x, w_i, b_i)]``, the first rotated when
    ``cos`` / ``sin`` are given (see module docstring)."""
    _check_output_group_args(x, mask, weight, bias, group_size)
    _check(x, dense_weights, dense_biases)
    _rows(mask, row_order, row_count)
    rotary = _rotary(x, weight, group_size, cos, sin)
    return _expressions(x, mask, weight, bias, group_size, dense_weights, dense_biases, rotary)


@output_group_linear_with_dense.register_fake
def _(x, mask, weight, bias, group_size, dense_weights, dense_biases, cos=None, sin=None, row_order=None,
      row_count=None):
    _check_output_group_args(x, mask, weight, bias, group_size)
    _check(x, dense_weights, dense_biases)
    _rows(mask, row_order, row_count)
    _rotary(x, weight, group_size, cos, sin)
    return [x.new_empty((*x.shape[:-1], w.shape[0])) for w in (weight, *dense_weights)]


@output_group_linear_with_dense.register_kernel("cuda")
def output_group_linear_with_dense_kernel(x, mask, weight, bias, group_size, dense_weights, dense_biases, cos=None,
                                          sin=None, row_order=None, row_count=None):
    """The template path (registered for CUDA; callable on CPU under ``TRITON_INTERPRET=1`` for tests)."""
    _check_output_group_args(x, mask, weight, bias, group_size)
    _check(x, dense_weights, dense_biases)
    rows = _rows(mask, row_order, row_count)
    rotary = _rotary(x, weight, group_size, cos, sin)
    if not _kernel_ok(x, weight, bias, *dense_weights, *dense_biases, cos, sin):
        return _expressions(x, mask, weight, bias, group_size, dense_weights, dense_biases, rotary)
    from wide_compile.templates.group_linear_with_dense import output_group_linear_with_dense as template
    from wide_compile.templates.group_plan import plan_from_row_order

    plan = plan_from_row_order(mask, *rows) if rows is not None else None
    return template(x, weight, mask, group_size, bias, list(dense_weights), list(dense_biases), rotary=rotary,
                    plan=plan)


__all__ = ["output_group_linear_with_dense"]
