"""One-token GEMVs of small weights that stream whole weight rows through registers (no MMA, no split of K).

At one token a 32 MB projection (Llama-3-8B's query / output projections) is short enough that fixed costs dominate
the swap-AB GEMVs of ``gemv_decode``: a shared-memory pipeline to fill, and a split-K finish (partials, an arrival
counter, a last program). Here a program owns ``ROWS`` weight rows and reads them in one or a few wide register
loads (``ROWS * BLOCK_K`` elements per step), multiplies by ``x`` in fp32 and reduces along K itself: no pipeline,
no workspace, no counter. Many such programs per SM keep enough bytes in flight
(``benchmarks/register_stream_probe.py``: a Triton kernel streaming 8 / 16 / 32 MB this way took 4.6 / 7.1 / 11.9 µs
on the H200, cuBLAS's GEMV on the same bytes 7.7 / 9.5 / 13.5).

- Output groups (:func:`output_rows_gemv`): the program's rows lie in one group; if the token does not use the group
  it stores zeros without reading the weight. Up to two dense sibling linears of the same ``x`` (the key and value
  projections beside the query projection) run in the same launch, after the grouped rows.
- Input groups (:func:`input_rows_gemv`): the program's loads of ``W`` and ``x`` are predicated on the token's group
  of each column, so inactive groups' bytes are never fetched and ``x`` needs no pre-masking.

Only one token (``M == 1``); ``gemv_decode`` takes both kernels by default on weights of at most ``MAX_WEIGHT_BYTES``
(:func:`applies`); a config's ``ROWS`` forces them (or, 0, not).
"""
from __future__ import annotations

import torch

from ._triton_utils import HAS_TRITON, cdiv, interpreting, next_pow2
from .dependent_launch import pdl_launch

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rows_times_x(w_base, x_ptr, mask_ptr, rows_c, K, GROUP_SIZE: tl.constexpr, MASK_COLUMNS: tl.constexpr,
                      ROWS: tl.constexpr, BLOCK_K: tl.constexpr, MASK_VALUE_BITS: tl.constexpr = 0):
        """fp32 ``sum_k W[rows, k] * x[k]`` in steps of ``BLOCK_K`` register loads; ``MASK_COLUMNS``: only over the
        columns whose group the token uses (``mask_ptr[k // GROUP_SIZE] != 0``; other bytes are not fetched).
        ``MASK_VALUE_BITS`` 15 / 31: the mask is a 16- / 32-bit float read through an integer view, nonzero where
        its value bits (sign cleared: -0.0 is zero) are."""
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((ROWS,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            on = kk < K
            if MASK_COLUMNS:
                flag = tl.load(mask_ptr + kk // GROUP_SIZE, mask=on, other=0)
                if MASK_VALUE_BITS == 15:
                    flag = flag & 0x7FFF
                elif MASK_VALUE_BITS == 31:
                    flag = flag & 0x7FFFFFFF
                on = on & (flag != 0)
            w = tl.load(w_base + rows_c[:, None] * K + kk[None, :], mask=on[None, :], other=0.0)
            xv = tl.load(x_ptr + kk, mask=on, other=0.0)
            acc += tl.sum(w.to(tl.float32) * xv.to(tl.float32)[None, :], axis=1)
        return acc

    @triton.jit
    def _output_rows_gemv_kernel(
        x_ptr, w_ptr, b_ptr, y_ptr, mask_ptr,
        d0_ptr, d1_ptr, db0_ptr, db1_ptr, yd0_ptr, yd1_ptr,
        N, K, ND,
        GROUP_SIZE: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        DENSE: tl.constexpr,
        ROWS: tl.constexpr,
        BLOCK_K: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        if USE_GDC:  # programmatic dependent launch (dependent_launch.py): nothing read before this
            tl.extra.cuda.gdc_wait()
        pid = tl.program_id(0)
        offs_r = tl.arange(0, ROWS)
        grouped = N // ROWS  # GROUP_SIZE % ROWS == 0: a program's rows lie in one group
        if DENSE > 0 and pid >= grouped:  # rows of a dense sibling (every token)
            dense_programs = tl.cdiv(ND, ROWS)
            which = (pid - grouped) // dense_programs
            rows = ((pid - grouped) % dense_programs) * ROWS + offs_r
            valid = rows < ND
            on = pid >= 0  # every token uses a dense sibling
            if which == 0:
                w_base = d0_ptr
                b_base = db0_ptr
                y_base = yd0_ptr
            else:
                w_base = d1_ptr
                b_base = db1_ptr
                y_base = yd1_ptr
        else:
            rows = pid * ROWS + offs_r
            valid = rows < N
            on = tl.load(mask_ptr + (pid * ROWS) // GROUP_SIZE) != 0
            w_base = w_ptr
            b_base = b_ptr
            y_base = y_ptr
        rows_c = tl.where(valid, rows, 0).to(tl.int64)  # clamped: loads need no row mask
        if on:
            acc = _rows_times_x(w_base, x_ptr, mask_ptr, rows_c, K, GROUP_SIZE, False, ROWS, BLOCK_K)
            if HAS_BIAS:
                acc += tl.load(b_base + rows_c).to(tl.float32)
            tl.store(y_base + rows, acc.to(y_ptr.dtype.element_ty), mask=valid)
        else:
            tl.store(y_base + rows, tl.zeros((ROWS,), dtype=y_ptr.dtype.element_ty), mask=valid)

    @triton.jit
    def _input_rows_gemv_kernel(
        x_ptr, w_ptr, b_ptr, y_ptr, mask_ptr,
        N, K,
        GROUP_SIZE: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        ROWS: tl.constexpr,
        BLOCK_K: tl.constexpr,
        USE_GDC: tl.constexpr,
        MASK_VALUE_BITS: tl.constexpr,
    ):
        if USE_GDC:
            tl.extra.cuda.gdc_wait()
        pid = tl.program_id(0)
        rows = pid * ROWS + tl.arange(0, ROWS)
        valid = rows < N
        rows_c = tl.where(valid, rows, 0).to(tl.int64)
        acc = _rows_times_x(w_ptr, x_ptr, mask_ptr, rows_c, K, GROUP_SIZE, True, ROWS, BLOCK_K, MASK_VALUE_BITS)
        if HAS_BIAS:
            acc += tl.load(b_ptr + rows_c).to(tl.float32)
        tl.store(y_ptr + rows, acc.to(y_ptr.dtype.element_ty), mask=valid)


STEP_ELEMENTS = 8192  # elements per program and load step (16 KB of bf16): the register probe's fastest step
# Where the output-group row kernel is the default: one token on a weight (with dense siblings) of at most 48 MiB.
# H200, one token, µs, gemv_decode's MMA GEMV / this (benchmarks/results/kernels_linear_sweep_rows_gemv.json, two
# 50% draws and the clustered, 25% and 70% masks; kernels_qkv_sweep_rows.json): query projection (32 MB) 12.7 / 8.8,
# 8.8 / 7.0, 8.6 / 7.0, 12.7 / 8.7, 7.8 / 6.3 with 4 rows and 8 warps; with key and value (48 MB) 12.7 / 10.5;
# output projection, input pre-masked, 8.3 / 7.0, 8.4 / 7.3, 7.4 / 7.1, 12.8 / 10.2, 7.3 / 6.7 with 2 rows and 4
# warps (stop 30, a mask draw per rotation copy, kernels_linear_sweep_rows_gemv_draws.json: 8.5 / 7.6, 8.5 / 7.6,
# 7.8 / 7.2, 10.3 / 8.5, 6.7 / 6.7). The down projection (117 MB) stays on the split-K GEMV: 21.7 against 24.8.
MAX_WEIGHT_BYTES = 48 << 20
OUTPUT_ROWS, OUTPUT_WARPS = 4, 8
INPUT_ROWS, INPUT_WARPS = 2, 4


def rows_config(config: dict | None, rows: int, warps: int) -> tuple[int, int]:
    """``(ROWS, num_warps)``: the kernel's defaults unless a GEMV config overrides them."""
    cfg = config or {}
    return int(cfg.get("ROWS", rows)), int(cfg.get("num_warps", warps))


def applies(num_tokens: int, weight_bytes: int, group_size: int, config: dict | None, output: bool = True) -> bool:
    """Whether a GEMV call takes the row-streaming kernels: ``config["ROWS"]`` > 0 forces them (0: never; a config
    without ``ROWS`` keeps ``gemv_decode``'s kernels), else one token on a weight of at most ``MAX_WEIGHT_BYTES`` (not
    under the interpreter by default: the tests force it). For input groups (the output projection) this is the
    default since stop 31; before stop 30's :func:`integer_mask` the kernel read the model's bf16 masks as floats and
    took 12.3 µs per 8B output projection in the decode step against about 7.8 on the split-K GEMV."""
    forced = (config or {}).get("ROWS")
    if config and forced is None:  # a configuration of gemv_decode's kernels (benchmark sweeps): theirs
        return False
    if forced is not None:
        # an output-group program's rows must lie in one group; input-group rows are output rows, any count works
        return int(forced) > 0 and num_tokens == 1 and (not output or group_size % int(forced) == 0)
    return (num_tokens == 1 and weight_bytes <= MAX_WEIGHT_BYTES and not interpreting()
            and (not output or group_size % OUTPUT_ROWS == 0))


def dense_sibling_args(dense: tuple, weight, bias, y, x) -> list:
    """The six pointer arguments of the dense-sibling slots shared by both output-group GEMV kernels
    (``d0, d1, db0, db1, yd0, yd1``): each sibling's weight, bias (``x`` where absent) and output; unused slots repeat
    a used pointer (never read)."""
    slots = [*dense, *(dense[-1:] if dense else [(weight, bias, y)]) * (2 - len(dense))]
    return [slots[0][0], slots[1][0], *(b if b is not None else x for _, b, _ in slots), slots[0][2], slots[1][2]]


def _block_k(k_dim: int, rows: int) -> int:
    return max(16, min(next_pow2(k_dim), STEP_ELEMENTS // rows))


def output_rows_gemv(x, weight, bias, mask_rows, group_size, config=None, out=None, dense=()):
    """``y[1, N]`` of output groups for one token (``gemv_decode.output_groups_gemv``'s contract, ``dense``
    siblings included); ``mask_rows[1, G]``."""
    rows, warps = rows_config(config, OUTPUT_ROWS, OUTPUT_WARPS)
    k_dim, n_dim = x.shape[1], weight.shape[0]
    nd = dense[0][0].shape[0] if dense else 0
    y = torch.empty(1, n_dim, dtype=x.dtype, device=x.device) if out is None else out
    grid = (n_dim // rows + len(dense) * cdiv(max(nd, 1), rows),)
    _output_rows_gemv_kernel[grid](
        x, weight, bias if bias is not None else x, y, mask_rows, *dense_sibling_args(dense, weight, bias, y, x),
        n_dim, k_dim, max(nd, 1),
        GROUP_SIZE=group_size, HAS_BIAS=bias is not None, DENSE=len(dense), ROWS=rows,
        BLOCK_K=_block_k(k_dim, rows), num_warps=warps, **pdl_launch(x.device),
    )
    return y


# Float masks (the routers' 0.0 / 1.0 rows) as the integer view the input-group kernel reads, and the bits that hold
# their value. The kernel loads a flag per weight column; with float flags it took 13.2 µs per 8B output projection,
# with integer ones 7.4 (H200, 48 rotated copies, results/row_gemv_mask_dtype_probe.txt): the 12.3 µs this kernel
# took per call in the 8B model's decode step (stops 29-30), whose masks are bf16.
_INTEGER_VIEWS = {torch.bfloat16: (torch.int16, 15), torch.float16: (torch.int16, 15), torch.float32: (torch.int32, 31)}


def integer_mask(mask_rows: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(view, value_bits)``: a float mask's rows reinterpreted as integers (no copy, no kernel) and the number of
    low bits that hold its value (15 / 31: the sign bit is cleared, so -0.0 reads as zero); other dtypes as they are,
    with 0 (compared with zero whole)."""
    view = _INTEGER_VIEWS.get(mask_rows.dtype)
    return (mask_rows, 0) if view is None else (mask_rows.view(view[0]), view[1])


def input_rows_gemv(x, weight, bias, mask_rows, group_size, config=None, out=None):
    """``y[1, N] = (x * mask over K) @ W.T + b`` for one token, reading only the token's groups' columns."""
    rows, warps = rows_config(config, INPUT_ROWS, INPUT_WARPS)
    k_dim, n_dim = x.shape[1], weight.shape[0]
    y = torch.empty(1, n_dim, dtype=x.dtype, device=x.device) if out is None else out
    flags, value_bits = integer_mask(mask_rows)
    _input_rows_gemv_kernel[(cdiv(n_dim, rows),)](
        x, weight, bias if bias is not None else x, y, flags, n_dim, k_dim,
        GROUP_SIZE=group_size, HAS_BIAS=bias is not None, ROWS=rows, BLOCK_K=_block_k(k_dim, rows),
        MASK_VALUE_BITS=value_bits, num_warps=warps, **pdl_launch(x.device),
    )
    return y
