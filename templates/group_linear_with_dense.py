"""An output-group linear and dense linears of the same input in one decode launch.

``output_group_linear_with_dense(x, weight, mask, gs, bias, dense_weights, dense_biases)`` returns
``[output_group_linear(x, weight, mask, gs, bias), linear(x, dense_weights[0], dense_biases[0]), ...]``.

Why: at batch-1 decode the query projection is a group-skipping GEMV of a few microseconds, and the key and value
projections beside it (dense: the KV cache stays complete) are two more cuBLAS GEMVs with their split-K reductions,
each a CUDA-graph node whose launch costs about as much as its reads. With at most 16 tokens and one or two dense
linears of one output size (and a bias exactly where the grouped one has one), their weight tiles become more
programs of the grouped GEMV's launch (``gemv_decode.output_groups_gemv(..., dense=...)``). Otherwise (more tokens,
other shapes, CPU without the interpreter) each result comes from its own op, the same values.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._triton_utils import can_run_triton
from .group_linear import _check, _use_gemv, output_group_linear
from .group_plan import DECODE_MAX_TOKENS, GroupPlan, mask_rows
from .rotary_epilogue import check_rotary, rotate_reference

MAX_DENSE = 2  # dense linears fused into one launch


def _check_dense(x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor | None]) -> None:
    op = "output_group_linear_with_dense"
    if len(weights) != len(biases):
        raise ValueError(f"{op}: {len(weights)} dense weights but {len(biases)} dense biases (None for no bias)")
    k_dim = x.shape[-1]
    for i, (w, b) in enumerate(zip(weights, biases)):
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[1] != k_dim:
            raise ValueError(f"{op}: dense_weights[{i}] must be a 2-D tensor [N, K={k_dim}], got "
                             f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}")
        for name, t in ((f"dense_weights[{i}]", w), (f"dense_biases[{i}]", b)):
            if t is not None and (t.dtype != x.dtype or t.device != x.device):
                raise TypeError(f"{op}: {name} must be {x.dtype} on {x.device}, got {t.dtype} on {t.device}")
        if b is not None and tuple(b.shape) != (w.shape[0],):
            raise ValueError(f"{op}: dense_biases[{i}] must have shape ({w.shape[0]},), got {tuple(b.shape)}")


def _fusable(x2: torch.Tensor, bias, weights, biases, path: str) -> bool:
    if not weights or len(weights) > MAX_DENSE or not can_run_triton(x2):
        return False
    if not _use_gemv(path, x2.shape[0], DECODE_MAX_TOKENS):  # siblings join the GEMV up to a decode step's tokens
        return False
    nd = weights[0].shape[0]
    return all(w.shape[0] == nd and (b is None) == (bias is None) for w, b in zip(weights, biases))


def output_group_linear_with_dense(
    x: torch.Tensor,
    weight: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None,
    dense_weights: list[torch.Tensor],
    dense_biases: list[torch.Tensor | None],
    *,
    path: str = "auto",
    config: dict | None = None,
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
    plan: GroupPlan | None = None,
) -> list[torch.Tensor]:
    """``[y, *dense]``: the output-group linear (exact zeros in inactive groups) and each dense linear of ``x``;
    ``rotary`` and ``plan`` (the mask's tables, when computed once for several ops) as in ``output_group_linear``."""
    _check("output_group_linear_with_dense", x, {"weight": weight}, mask, group_size, "N", bias, None, path)
    _check_dense(x, list(dense_weights), list(dense_biases))
    if rotary is not None:
        check_rotary("output_group_linear_with_dense", x, weight.shape[0], group_size, *rotary)
    lead, k_dim = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k_dim).contiguous()
    if x2.shape[0] == 0 or not _fusable(x2, bias, dense_weights, dense_biases, path):
        return [output_group_linear(x, weight, mask, group_size, bias, plan, path=path, config=config, rotary=rotary),
                *(F.linear(x, w, b) for w, b in zip(dense_weights, dense_biases))]
    from .gemv_decode import output_groups_gemv

    outs = [torch.empty(x2.shape[0], w.shape[0], dtype=x.dtype, device=x.device) for w in dense_weights]
    dense = tuple((w.contiguous(), b.contiguous() if b is not None else None, o)
                  for w, b, o in zip(dense_weights, dense_biases, outs))
    y = output_groups_gemv(x2, weight.contiguous(), bias.contiguous() if bias is not None else None, mask_rows(mask),
                           group_size, config=config, dense=dense)
    y = y.reshape(*lead, weight.shape[0])
    return [y if rotary is None else rotate_reference(y, *rotary), *(o.reshape(*lead, o.shape[-1]) for o in outs)]


__all__ = ["output_group_linear_with_dense", "MAX_DENSE"]
