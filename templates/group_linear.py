"""Public entry points of the group-skipping linear ops: input checks, then decode / prefill dispatch.

- ``output_group_linear``: ``y = x @ W.T + b`` on each token's active output groups, exactly 0 elsewhere.
- ``input_group_linear``: ``y = (x * mask expanded over K) @ W.T + b``.
- ``gated_up_groups``: ``h = act(x @ Wg.T) * (x @ Wu.T)`` on active output groups, exactly 0 elsewhere.

Inputs may carry leading batch dims (``x[..., K]``, ``mask[..., G]``): they are flattened and restored.
Dtypes: bf16 / fp16 (fp32 accepted; computed with IEEE fp32 dots). Non-contiguous inputs are made
contiguous. With few tokens the GEMVs run (they read only the weight of groups active for some token of the batch,
once for all tokens): up to 64 tokens for ``input_group_linear`` (16 on a pre-masked input), 64 for
``gated_up_groups`` and 128 for ``output_group_linear`` (``GEMV_MAX_TOKENS``). Above, ``output_group_linear`` runs
cuBLAS and zeroes the inactive outputs up to ``DENSE_OUTPUT_MAX_TOKENS``, ``input_group_linear`` cuBLAS on the masked
input; otherwise the prefill GEMMs, which need a ``GroupPlan`` (pass the one from ``build_group_plan(mask)`` to share
it between paired ops; built here when omitted). On CPU without ``TRITON_INTERPRET=1`` (or without Triton) the
PyTorch references run instead.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._triton_utils import ACTIVATION_CODES, can_run_triton
from .group_linear_reference import (
    gated_up_groups_reference,
    input_group_linear_reference,
    output_group_linear_reference,
)
from .group_plan import DECODE_MAX_TOKENS, GroupPlan, build_group_plan, mask_rows
from .rotary_epilogue import check_rotary, epilogue_applies, kernel_tables, rotate_reference
from .zero_groups import zero_inactive_groups

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Most tokens for which the "auto" path takes the GEMV. With i.i.d. masks a few dozen tokens already need almost
# every group, so the weight bytes are dense; the GEMV reads each active weight tile once for all tokens, where the
# GEMM over per-group token lists reads it once per token tile. H200, Llama-3-8B at 50%, µs (GEMV / GEMM / cuBLAS
# dense, benchmarks/results/kernels_linear_sweep_moderate_gemv.json): query projection 32 tokens 12.7 / 46.9 / 14.3,
# 64 13.8 / 21.8 / 12.4, 128 17.2 / 23.3 / 14.6, 256 54.6 / 27.3 / 19.2. Gate/up with the GEMV's 4 stages above 16
# tokens (kernels_linear_sweep_gated_stages_v1.json, four mask kinds): 32 tokens 59.7-60.6 / 99.0-100.3 / 59.4-59.8,
# 64 61.7-63.3 / 65.6-65.9 / 63.2-64.0; at 128 tokens the GEMM (68.0-71.1 at 25-70% and clustered masks but 114.5 at
# 25%) beats the GEMV's 3 stages (76.3-76.7; 4 do not fit).
# The input-group GEMV (down / output projection, input masked in its loads) against cuBLAS on the input masked by
# zero_groups.py, Llama-3-8B at 50%, random / trained masks, µs (kernels_linear_sweep_input_moderate.json): down 32
# tokens 34.7 / 34.0 against 36.0 / 35.9, 64 tokens 42.5 / 43.0 against 39.0 / 39.1; output projection 32 tokens
# 13.5 / 13.1 against 15.9 / 15.8, 64 tokens 15.0 / 14.8 against 14.3 / 14.2. Since stop 39 with 128-row tiles and 8
# warps up to 64 tokens (kernels_linear_sweep_input_wide_moderate.json / _o_proj.json): down 64 tokens 36.5 / 36.1
# against 39.0 / 39.0, output projection 48 tokens 14.7 / 14.4 against 16.3 / 16.2, 64 tokens 14.9 / 14.3 against
# 14.6 / 14.4; at 96-128 tokens cuBLAS wins again (down 96: 44.3 against 41.1).
# An input already zero outside each token's groups (``x_is_masked``, the down projection after gate/up) needs no
# masking pass before cuBLAS, which then beats the GEMV on i.i.d. masks from 8 tokens on (down, 8 / 16 tokens: 33.4 /
# 33.8 against 32.4 / 32.8 µs, results/kernels_linear.md): such inputs keep the GEMV to a decode step's 16 tokens.
GEMV_MAX_TOKENS = {"output_group_linear": 128, "gated_up_groups": 64, "input_group_linear": 64}
MASKED_INPUT_GEMV_MAX_TOKENS = DECODE_MAX_TOKENS
# Above the GEMV and up to this many tokens the output-group op runs cuBLAS on the whole weight and zeroes the inactive
# groups' outputs: a few dozen tokens with i.i.d. masks use every group, and the GEMM over per-group token lists pays
# its plan and tile quantisation. Llama-3-8B query projection at 50%, random / trained masks, µs, GEMM with its plan
# against cuBLAS + zeroing (kernels_linear_sweep_output_dense.json): 192 tokens 26.4 / 26.4 against 19.4 / 20.2, 256
# 27.1 / 27.1 against 19.4 / 19.2, 512 37.8 / 37.6 against 26.8 / 26.8, 1024 48.4 / 48.7 against 48.3 / 48.6 (a tie;
# above it the GEMM skips work: 4096 tokens 1.48x of cuBLAS in results/kernels_linear.md).
DENSE_OUTPUT_MAX_TOKENS = 512
_PATHS = ("auto", "gemv", "gemm", "dense")


def _check(
    op: str,
    x: torch.Tensor,
    weights: dict[str, torch.Tensor],
    mask: torch.Tensor,
    group_size: int,
    grouped_dim: str,
    bias: torch.Tensor | None,
    plan: GroupPlan | None,
    path: str,
) -> int:
    """Validate the arguments; returns the number of groups ``G``."""
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError(f"{op}: x must be a tensor [..., K]")
    if x.dtype not in _DTYPES:
        raise TypeError(f"{op}: x dtype must be bfloat16, float16 or float32, got {x.dtype}")
    k_dim = x.shape[-1]
    n_dim = None
    for name, w in weights.items():
        if not isinstance(w, torch.Tensor) or w.dim() != 2:
            raise ValueError(f"{op}: {name} must be a 2-D tensor [N, K]")
        if w.dtype != x.dtype:
            raise TypeError(f"{op}: {name} dtype {w.dtype} differs from x dtype {x.dtype}")
        if w.device != x.device:
            raise ValueError(f"{op}: {name} is on {w.device} but x is on {x.device}")
        if w.shape[1] != k_dim:
            raise ValueError(f"{op}: {name} has K={w.shape[1]} but x has K={k_dim}")
        if n_dim is not None and w.shape[0] != n_dim:
            raise ValueError(f"{op}: the weights have different N ({n_dim} vs {w.shape[0]})")
        n_dim = w.shape[0]
    if bias is not None:
        if bias.shape != (n_dim,):
            raise ValueError(f"{op}: bias must have shape ({n_dim},), got {tuple(bias.shape)}")
        if bias.dtype != x.dtype or bias.device != x.device:
            raise TypeError(f"{op}: bias must be {x.dtype} on {x.device}, got {bias.dtype} on {bias.device}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(f"{op}: group_size must be a positive int, got {group_size!r}")
    dim = n_dim if grouped_dim == "N" else k_dim
    if dim % group_size:
        raise ValueError(f"{op}: group_size {group_size} does not divide the grouped dimension {grouped_dim}={dim}")
    num_groups = dim // group_size
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"{op}: mask must be a tensor [..., G]")
    if mask.device != x.device:
        raise ValueError(f"{op}: mask is on {mask.device} but x is on {x.device}")
    if mask.dim() < 1 or tuple(mask.shape) != tuple(x.shape[:-1]) + (num_groups,):
        raise ValueError(
            f"{op}: mask shape {tuple(mask.shape)} must be {tuple(x.shape[:-1]) + (num_groups,)} "
            f"(x.shape[:-1] + (G = {grouped_dim} / group_size = {num_groups},))"
        )
    if path not in _PATHS:
        raise ValueError(f"{op}: path must be one of {_PATHS}, got {path!r}")
    if plan is not None:
        if not isinstance(plan, GroupPlan):
            raise TypeError(f"{op}: plan must be a GroupPlan from build_group_plan, got {type(plan).__name__}")
        num_tokens = x.numel() // max(k_dim, 1) if k_dim else 0
        if plan.num_tokens != num_tokens or plan.num_groups != num_groups:
            raise ValueError(
                f"{op}: plan was built for a mask [{plan.num_tokens}, {plan.num_groups}], "
                f"this call has [{num_tokens}, {num_groups}]"
            )
        if plan.mask_rows.device != x.device:
            raise ValueError(f"{op}: plan is on {plan.mask_rows.device} but x is on {x.device}")
    return num_groups


def _check_out(op: str, out: torch.Tensor | None, x: torch.Tensor, n_dim: int) -> torch.Tensor | None:
    """Validate a caller-provided output buffer; returns its 2-D view (or None)."""
    if out is None:
        return None
    shape = tuple(x.shape[:-1]) + (n_dim,)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape:
        raise ValueError(f"{op}: out must have shape {shape}, got {getattr(out, 'shape', None)}")
    if out.dtype != x.dtype or out.device != x.device:
        raise TypeError(f"{op}: out must be {x.dtype} on {x.device}, got {out.dtype} on {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"{op}: out must be contiguous")
    return out.view(-1, n_dim)


def _finish(result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return result
    if result.data_ptr() != out.data_ptr():
        out.copy_(result)
    return out


def _use_gemv(path: str, num_tokens: int, max_tokens: int) -> bool:
    return path == "gemv" or (path == "auto" and num_tokens <= max_tokens)


def _plan_for(plan: GroupPlan | None, mask: torch.Tensor, part: str) -> GroupPlan:
    """The given plan if it has the tables for ``part``, else a plan with them built now."""
    if plan is None or not plan.has(part):
        return build_group_plan(mask, parts=(part,))
    return plan


# Prefill input-group op: the skipping GEMM beats cuBLAS only with many tokens and tile-level sparsity
# (measured on the H200: 1.44x at M=16384 with clustered masks, pre-masked input; slower in all other
# cases tried), so "auto" uses it only then and runs cuBLAS on the masked input otherwise.
GEMM_MIN_TOKENS = 8192
GEMM_MAX_TILE_DENSITY = 0.6


def _choose_prefill_input_path(
    plan: GroupPlan | None, mask: torch.Tensor, num_tokens: int, x_is_masked: bool
) -> tuple[str, GroupPlan | None]:
    """"gemm" when many tokens, a pre-masked input and a plan whose token tiles use at most
    GEMM_MAX_TILE_DENSITY of the groups (one host sync; never while a CUDA graph is captured), else "dense"."""
    if num_tokens < GEMM_MIN_TOKENS or not x_is_masked:
        return "dense", plan
    if mask.is_cuda and torch.cuda.is_current_stream_capturing():
        return "dense", plan
    p = _plan_for(plan, mask, "input")
    density = p.tile_group_counts.sum().item() / (p.tile_group_counts.numel() * p.num_groups)
    return ("gemm" if density <= GEMM_MAX_TILE_DENSITY else "dense"), p


def output_group_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
    plan: GroupPlan | None = None,
    *,
    path: str = "auto",
    config: dict | None = None,
    out: torch.Tensor | None = None,
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``y[..., N]``: ``(x @ W.T + b)[m, n]`` if ``mask[m, n // group_size]`` else exactly 0.

    ``path``: ``"auto"`` (the GEMV up to ``GEMV_MAX_TOKENS[op]`` tokens, ``"dense"`` up to
    ``DENSE_OUTPUT_MAX_TOKENS``, the GEMM above), ``"gemv"``, ``"gemm"`` or ``"dense"`` (cuBLAS on the whole
    weight, then the inactive outputs zeroed: ``zero_groups``); ``config`` overrides kernel tile sizes
    (benchmarking). A plan without the needed tables is completed here.
    ``rotary``: ``(cos, sin)`` tables ``[B or 1, T, head_dim]`` for ``x[B, T, K]``: ``y`` is returned with HF's rotary
    embedding applied per head (``rotary_epilogue``: inside the GEMM where its tiles allow, else after it).
    """
    op = "output_group_linear"
    _check(op, x, {"weight": weight}, mask, group_size, "N", bias, plan, path)
    out2 = _check_out(op, out, x, weight.shape[0])
    if rotary is not None:
        check_rotary(op, x, weight.shape[0], group_size, *rotary)
    if not can_run_triton(x):
        y = output_group_linear_reference(x, weight, mask, group_size, bias)
        return _finish(y if rotary is None else rotate_reference(y, *rotary), out)
    lead, k_dim, n_dim = x.shape[:-1], x.shape[-1], weight.shape[0]
    x2 = x.reshape(-1, k_dim).contiguous()
    weight = weight.contiguous()
    bias = bias.contiguous() if bias is not None else None
    if x2.shape[0] == 0:
        return x.new_empty(*lead, n_dim) if out is None else out
    after = rotary  # rotary tables still to apply once the kernel is done
    if path == "auto" and GEMV_MAX_TOKENS[op] < x2.shape[0] <= DENSE_OUTPUT_MAX_TOKENS:
        path = "dense"
    if path == "dense":  # cuBLAS on the whole weight, then the inactive groups' outputs zeroed in one launch
        y = zero_inactive_groups(F.linear(x2, weight, bias), mask_rows(mask), group_size, in_place=True)
    elif _use_gemv(path, x2.shape[0], GEMV_MAX_TOKENS[op]):
        from .gemv_decode import output_groups_gemv

        y = output_groups_gemv(x2, weight, bias, mask_rows(mask), group_size, config=config,
                               out=out2 if after is None else None)
    else:
        from .gemm_output_groups import output_groups_gemm

        p = _plan_for(plan, mask, "output")
        if rotary is not None and epilogue_applies(rotary[0].shape[-1], group_size):
            after = None  # the GEMM's epilogue rotates
        y = output_groups_gemm(x2, weight, bias, p.group_tokens, p.group_counts, group_size, config=config,
                               out=out2 if after is None else None,
                               rotary=kernel_tables(*rotary, x) if rotary is not None and after is None else None)
    y = y.reshape(*lead, n_dim)
    return _finish(y if after is None else rotate_reference(y, *after), out)


def gated_up_groups(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    activation: str = "silu",
    plan: GroupPlan | None = None,
    *,
    path: str = "auto",
    config: dict | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``h[..., I] = act(x @ Wg.T) * (x @ Wu.T)`` on active output groups, exactly 0 elsewhere (fused)."""
    op = "gated_up_groups"
    if activation not in ACTIVATION_CODES:
        raise ValueError(f"{op}: activation must be one of {tuple(ACTIVATION_CODES)}, got {activation!r}")
    _check(op, x, {"w_gate": w_gate, "w_up": w_up}, mask, group_size, "N", None, plan, path)
    out2 = _check_out(op, out, x, w_gate.shape[0])
    if not can_run_triton(x):
        return _finish(gated_up_groups_reference(x, w_gate, w_up, mask, group_size, activation), out)
    lead, k_dim, n_dim = x.shape[:-1], x.shape[-1], w_gate.shape[0]
    x2 = x.reshape(-1, k_dim).contiguous()
    w_gate, w_up = w_gate.contiguous(), w_up.contiguous()
    if x2.shape[0] == 0:
        return x.new_empty(*lead, n_dim) if out is None else out
    if _use_gemv(path, x2.shape[0], GEMV_MAX_TOKENS[op]):
        from .gemv_decode import output_groups_gemv

        h = output_groups_gemv(
            x2, w_gate, None, mask_rows(mask), group_size, w_up=w_up, activation=activation, config=config,
            out=out2,
        )
    else:
        from .gemm_gated_up import gated_up_gemm

        p = _plan_for(plan, mask, "output")
        h = gated_up_gemm(
            x2, w_gate, w_up, p.group_tokens, p.group_counts, group_size, activation, config=config, out=out2
        )
    return _finish(h.reshape(*lead, n_dim), out)


def input_group_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
    plan: GroupPlan | None = None,
    *,
    path: str = "auto",
    config: dict | None = None,
    out: torch.Tensor | None = None,
    x_is_masked: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y[..., N] = (x * mask expanded over K) @ W.T + b`` (each token reduces over its active groups).

    ``residual`` (the output's shape, ``x``'s dtype, contiguous; not with ``out``): ``y`` is added into it in place and
    it is returned. On the cuBLAS path that is one GEMM with ``beta = 1`` (``addmm_``), whose epilogue reads the
    residual, instead of a GEMM writing ``y`` and an addition reading it back (``passes/residual_add_fusion.py``); its
    rounding differs from ``residual + y`` by at most one unit in the last place.

    ``x_is_masked=True`` promises that ``x`` is already exactly 0 outside each token's active groups
    (true for ``h`` from ``gated_up_groups`` with the same mask); the kernels then skip the per-token
    masking of ``x`` (a wrong promise gives wrong results). The kernels need ``group_size`` to be a
    multiple of 16; other group sizes use the reference math.

    ``path``: ``"auto"`` = the union-reading GEMV up to ``GEMV_MAX_TOKENS[op]`` tokens (``x_is_masked``:
    ``MASKED_INPUT_GEMV_MAX_TOKENS``); above, the skipping GEMM
    (``"gemm"``: per-tile active-group lists, see ``gemm_input_groups``) when at least
    ``GEMM_MIN_TOKENS`` tokens, ``x_is_masked`` and the plan's token tiles use at most
    ``GEMM_MAX_TILE_DENSITY`` of the groups (clustered masks; decided with one host sync, never during
    CUDA-graph capture), else ``"dense"``: cuBLAS on the input masked in one launch (``zero_groups``). On the H200
    the skipping GEMM measured slower than cuBLAS everywhere else (benchmarks/results/kernels_linear.md).
    ``"gemv"`` / ``"gemm"`` / ``"dense"`` force a path.
    """
    op = "input_group_linear"
    _check(op, x, {"weight": weight}, mask, group_size, "K", bias, plan, path)
    out2 = _check_out(op, out, x, weight.shape[0])
    if residual is not None:
        if out is not None:
            raise ValueError(f"{op}: pass out or residual, not both")
        _check_out(op + " (residual)", residual, x, weight.shape[0])
    if not can_run_triton(x) or group_size % 16:
        y = input_group_linear_reference(x, weight, mask, group_size, bias)
        return residual.add_(y) if residual is not None else _finish(y, out)
    lead, k_dim, n_dim = x.shape[:-1], x.shape[-1], weight.shape[0]
    x2 = x.reshape(-1, k_dim).contiguous()
    weight = weight.contiguous()
    bias = bias.contiguous() if bias is not None else None
    if x2.shape[0] == 0:
        return residual if residual is not None else x.new_empty(*lead, n_dim) if out is None else out
    m_rows = mask_rows(mask)
    num_tokens = x2.shape[0]
    gemv_max = MASKED_INPUT_GEMV_MAX_TOKENS if x_is_masked else GEMV_MAX_TOKENS[op]
    if path == "auto" and num_tokens > gemv_max:
        path, plan = _choose_prefill_input_path(plan, mask, num_tokens, x_is_masked)
    if path == "dense":
        xm = x2 if x_is_masked else zero_inactive_groups(x2, m_rows, group_size)
        if residual is not None:  # one GEMM whose epilogue adds the residual (beta = 1)
            residual.view(-1, n_dim).addmm_(xm, weight.t())
            return residual if bias is None else residual.add_(bias)
        y = F.linear(xm, weight, bias)
    elif _use_gemv(path, num_tokens, gemv_max):
        from .gemv_decode import input_groups_gemv

        union = (None, None)  # no plan's union list: the GEMV builds it itself (no plan launch)
        if plan is not None and plan.has("union"):
            union = (plan.union_groups, plan.union_count)
        y = input_groups_gemv(x2, weight, bias, m_rows, *union, group_size, x_is_masked, config=config, out=out2)
    else:
        from .gemm_input_groups import input_groups_gemm

        p = _plan_for(plan, mask, "input")
        y = input_groups_gemm(
            x2, weight, bias, m_rows, p.token_order, p.tile_groups, p.tile_group_counts, group_size, p.block_m,
            x_is_masked, config=config, out=out2,
        )
    if residual is not None:
        return residual.add_(y.reshape(*lead, n_dim))
    return _finish(y.reshape(*lead, n_dim), out)
