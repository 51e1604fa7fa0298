"""Row-streaming GEMVs for a few tokens (2-8): each program holds whole weight rows in registers and reuses them for
every token of the batch.

``gemv_rows`` streams the rows of small weights (the 32 MB query / output projections) through registers for one
token, without the shared-memory pipeline and split-K finish that make up most of the MMA GEMVs' time there. Here
the same program loads its ``ROWS`` rows once, over the whole of K in one load (``ROWS * K`` elements at most
``MAX_ROW_ELEMENTS``), then for each token multiplies by that token's ``x`` (from L2) and stores the token's outputs:
the weight bytes are those of the groups some token uses, read once for the batch.

- Output groups (:func:`output_rows_tokens_gemv`): a program's rows lie in one group; it reads the weight only if some
  token uses the group, and stores zeros for the tokens that do not.
- Input groups (:func:`input_rows_tokens_gemv`): the rows are read as ``[ROWS, G, group_size]`` tiles whose loads are
  predicated on the union of the tokens' groups; each token's ``x`` is read only in its own groups. Needs a power-of-two
  group size (the tile's last dimension).

The masks may be bool / uint8 or 0 / 1 floats (read as integers: ``gemv_rows.integer_mask``). ``gemv_decode`` takes
these kernels for 2 to ``MAX_TOKENS`` tokens on weights of at most ``gemv_rows.MAX_WEIGHT_BYTES`` (:func:`applies`);
a config's ``TOKEN_ROWS`` forces them (or, 0, not).
"""
from __future__ import annotations

import torch

from ._triton_utils import HAS_TRITON, cdiv, interpreting, next_pow2
from .dependent_launch import pdl_launch
from .gemv_rows import MAX_WEIGHT_BYTES, integer_mask

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _flag_on(flag, MASK_VALUE_BITS: tl.constexpr):
        """Nonzero test of mask values read through ``gemv_rows.integer_mask`` (sign bit cleared for floats)."""
        if MASK_VALUE_BITS == 15:
            flag = flag & 0x7FFF
        elif MASK_VALUE_BITS == 31:
            flag = flag & 0x7FFFFFFF
        return flag != 0

    @triton.jit
    def _output_rows_tokens_kernel(
        x_ptr, w_ptr, b_ptr, y_ptr, mask_ptr, M, N, K, G,
        GROUP_SIZE: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
        BLOCK_T: tl.constexpr, MASK_VALUE_BITS: tl.constexpr, USE_GDC: tl.constexpr,
    ):
        if USE_GDC:  # programmatic dependent launch (dependent_launch.py): nothing read before this
            tl.extra.cuda.gdc_wait()
        pid = tl.program_id(0)
        rows = pid * ROWS + tl.arange(0, ROWS)
        valid = rows < N
        rows_c = tl.where(valid, rows, 0).to(tl.int64)
        g = (pid * ROWS) // GROUP_SIZE  # GROUP_SIZE % ROWS == 0: the program's rows lie in one group
        offs_t = tl.arange(0, BLOCK_T)
        on_t = _flag_on(tl.load(mask_ptr + offs_t * G + g, mask=offs_t < M, other=0), MASK_VALUE_BITS)
        zeros = tl.zeros((ROWS,), dtype=y_ptr.dtype.element_ty)
        if tl.max(on_t.to(tl.int32), axis=0) > 0:
            kk = tl.arange(0, BLOCK_K)
            inside = kk < K
            w = tl.load(w_ptr + rows_c[:, None] * K + kk[None, :], mask=inside[None, :], other=0.0).to(tl.float32)
            bias = tl.zeros((ROWS,), dtype=tl.float32)
            if HAS_BIAS:
                bias = tl.load(b_ptr + rows_c).to(tl.float32)
            for t in range(M):
                if _flag_on(tl.load(mask_ptr + t * G + g), MASK_VALUE_BITS):
                    xv = tl.load(x_ptr + t * K + kk, mask=inside, other=0.0).to(tl.float32)
                    acc = tl.sum(w * xv[None, :], axis=1) + bias
                    tl.store(y_ptr + t * N + rows, acc.to(y_ptr.dtype.element_ty), mask=valid)
                else:
                    tl.store(y_ptr + t * N + rows, zeros, mask=valid)
        else:
            for t in range(M):
                tl.store(y_ptr + t * N + rows, zeros, mask=valid)

    @triton.jit
    def _input_rows_tokens_kernel(
        x_ptr, w_ptr, b_ptr, y_ptr, mask_ptr, M, N, K, G,
        GROUP_SIZE: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, BLOCK_G: tl.constexpr,
        BLOCK_T: tl.constexpr, MASK_VALUE_BITS: tl.constexpr, USE_GDC: tl.constexpr,
    ):
        if USE_GDC:
            tl.extra.cuda.gdc_wait()
        pid = tl.program_id(0)
        rows = pid * ROWS + tl.arange(0, ROWS)
        valid = rows < N
        rows_c = tl.where(valid, rows, 0).to(tl.int64)
        offs_t = tl.arange(0, BLOCK_T)
        offs_g = tl.arange(0, BLOCK_G)
        offs_c = tl.arange(0, GROUP_SIZE)
        flags = tl.load(mask_ptr + offs_t[:, None] * G + offs_g[None, :],
                        mask=(offs_t[:, None] < M) & (offs_g[None, :] < G), other=0)
        used = tl.max(_flag_on(flags, MASK_VALUE_BITS).to(tl.int32), axis=0) > 0  # [BLOCK_G]: some token's group
        cols = offs_g[:, None] * GROUP_SIZE + offs_c[None, :]  # [BLOCK_G, GROUP_SIZE]
        w = tl.load(w_ptr + rows_c[:, None, None] * K + cols[None, :, :], mask=used[None, :, None],
                    other=0.0).to(tl.float32)
        bias = tl.zeros((ROWS,), dtype=tl.float32)
        if HAS_BIAS:
            bias = tl.load(b_ptr + rows_c).to(tl.float32)
        for t in range(M):
            on = _flag_on(tl.load(mask_ptr + t * G + offs_g, mask=offs_g < G, other=0), MASK_VALUE_BITS)
            xv = tl.load(x_ptr + t * K + cols, mask=on[:, None], other=0.0).to(tl.float32)
            acc = tl.sum(tl.sum(w * xv[None, :, :], axis=2), axis=1) + bias
            tl.store(y_ptr + t * N + rows, acc.to(y_ptr.dtype.element_ty), mask=valid)


MAX_TOKENS = 0  # default range (2..MAX_TOKENS tokens); 0 until measured: the kernels run when a config forces them
MAX_ROW_ELEMENTS = 16384  # ROWS * K held in registers by one program (64 KB of fp32 over its threads)
OUTPUT_ROWS, OUTPUT_WARPS = 2, 4
INPUT_ROWS, INPUT_WARPS = 2, 4


def _config(config: dict | None, rows: int, warps: int) -> tuple[int, int]:
    cfg = config or {}
    return int(cfg.get("TOKEN_ROWS", rows)), int(cfg.get("num_warps", warps))


def applies(num_tokens: int, weight_bytes: int, k_dim: int, group_size: int, config: dict | None,
            output: bool = True) -> bool:
    """Whether a GEMV call of ``num_tokens`` takes these kernels: ``config["TOKEN_ROWS"]`` > 0 forces them (0: never;
    a config without it keeps the caller's kernels), else 2 to ``MAX_TOKENS`` tokens on a weight of at most
    ``MAX_WEIGHT_BYTES`` (not under the interpreter by default). Either way the rows must fit (``ROWS * K`` at most
    ``MAX_ROW_ELEMENTS``), an output program's rows one group, and input groups need a power-of-two group size."""
    cfg = config or {}
    forced = cfg.get("TOKEN_ROWS")
    if config and forced is None:
        return False
    if forced is not None and int(forced) <= 0:
        return False
    rows = int(forced) if forced is not None else (OUTPUT_ROWS if output else INPUT_ROWS)
    fits = rows * next_pow2(k_dim) <= MAX_ROW_ELEMENTS and (
        group_size % rows == 0 if output else group_size == next_pow2(group_size) and group_size >= 16)
    if forced is not None:
        return fits and num_tokens >= 1
    return fits and 2 <= num_tokens <= MAX_TOKENS and weight_bytes <= MAX_WEIGHT_BYTES and not interpreting()


def output_rows_tokens_gemv(x, weight, bias, mask_rows, group_size, config=None, out=None):
    """``y[M, N]`` of output groups (``gemv_decode.output_groups_gemv``'s contract without dense siblings)."""
    rows, warps = _config(config, OUTPUT_ROWS, OUTPUT_WARPS)
    num_tokens, k_dim = x.shape
    n_dim = weight.shape[0]
    y = torch.empty(num_tokens, n_dim, dtype=x.dtype, device=x.device) if out is None else out
    flags, value_bits = integer_mask(mask_rows)
    _output_rows_tokens_kernel[(cdiv(n_dim, rows),)](
        x, weight, bias if bias is not None else x, y, flags, num_tokens, n_dim, k_dim, n_dim // group_size,
        GROUP_SIZE=group_size, HAS_BIAS=bias is not None, ROWS=rows, BLOCK_K=next_pow2(k_dim),
        BLOCK_T=max(2, next_pow2(num_tokens)), MASK_VALUE_BITS=value_bits, num_warps=warps, **pdl_launch(x.device),
    )
    return y


def input_rows_tokens_gemv(x, weight, bias, mask_rows, group_size, config=None, out=None):
    """``y[M, N] = (x * mask over K) @ W.T + b`` reading only the columns of groups some token uses."""
    rows, warps = _config(config, INPUT_ROWS, INPUT_WARPS)
    num_tokens, k_dim = x.shape
    n_dim, num_groups = weight.shape[0], k_dim // group_size
    y = torch.empty(num_tokens, n_dim, dtype=x.dtype, device=x.device) if out is None else out
    flags, value_bits = integer_mask(mask_rows)
    _input_rows_tokens_kernel[(cdiv(n_dim, rows),)](
        x, weight, bias if bias is not None else x, y, flags, num_tokens, n_dim, k_dim, num_groups,
        GROUP_SIZE=group_size, HAS_BIAS=bias is not None, ROWS=rows, BLOCK_G=next_pow2(num_groups),
        BLOCK_T=max(2, next_pow2(num_tokens)), MASK_VALUE_BITS=value_bits, num_warps=warps, **pdl_launch(x.device),
    )
    return y
