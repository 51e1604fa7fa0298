"""Output-group GEMV with the active groups' rows split evenly over a fixed grid (one token, fused gate/up).

The per-tile GEMV (``gemv_decode._output_groups_gemv_kernel``) launches one program per ``BLOCK_N`` rows of every
group; the programs of groups no token uses exit, and each active one streams its rows over the whole K. At one token
and 50% about half of the Llama-3-8B gate/up tiles are active: 112 programs of 1 MB for 132 SMs, so a sixth of the
SMs stream nothing while HBM has bandwidth to spare. Here the grid is fixed instead (``programs``, one per SM): each
program reads the group mask, numbers the rows of the active groups ``r = a * GROUP_SIZE + i`` (active group ``a`` in
group order) and takes the window ``[p * share, (p + 1) * share)`` of them with ``share = ceil(R / P)`` rows; with
more active rows than ``P * BLOCK_N`` windows are ``BLOCK_N`` rows and program ``p`` takes windows ``p, p + P, ...``
(the per-tile grid's waves). A window lies in at most two groups (``share <= BLOCK_N <= GROUP_SIZE``), its rows are
gathered (contiguous along K, predicated off past the window), and each program streams them over the whole K as the
per-tile kernel does: no split of K, no partial sums, the same bytes for every program. Each program also writes the
zeros of a ``1 / P`` slice of the rows of groups no token uses.
"""
from __future__ import annotations

import torch

from ._triton_utils import ACTIVATION_CODES, HAS_TRITON, activation_fn, interpreting, next_pow2, sm_count
from .dependent_launch import pdl_launch

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rows_balanced_gemv_kernel(
        x_ptr, w_ptr, w2_ptr, b_ptr, y_ptr, mask_ptr,
        M, N, K, G,
        GROUP_SIZE: tl.constexpr,
        GATED: tl.constexpr,
        ACTIVATION: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_G: tl.constexpr,
        EVEN_K: tl.constexpr,
        UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        if USE_GDC:  # programmatic dependent launch (dependent_launch.py): nothing read before this
            tl.extra.cuda.gdc_wait()
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        offs_t = tl.arange(0, BLOCK_T)
        valid_t = offs_t < M
        offs_g = tl.arange(0, BLOCK_G)
        on = tl.load(mask_ptr + offs_t[:, None] * G + offs_g[None, :],
                     mask=valid_t[:, None] & (offs_g < G)[None, :], other=0)
        used = tl.max((on != 0).to(tl.int32), axis=0)  # [BLOCK_G]: some token uses the group
        rank = tl.cumsum(used, 0) - 1
        rows = tl.sum(used, 0) * GROUP_SIZE  # rows of the active groups
        share = tl.minimum(tl.cdiv(rows, programs), BLOCK_N)
        offs_j = tl.arange(0, BLOCK_N)

        # zeros for this program's slice of the rows of unused groups
        zero_rows = tl.cdiv(tl.cdiv(N, programs), BLOCK_N) * BLOCK_N
        for z0 in range(pid * zero_rows, tl.minimum(N, (pid + 1) * zero_rows), BLOCK_N):
            zr = z0 + offs_j
            z_ok = zr < N
            z_on = tl.load(mask_ptr + offs_t[None, :] * G + (zr // GROUP_SIZE)[:, None],
                           mask=z_ok[:, None] & valid_t[None, :], other=0)
            z_used = tl.max((z_on != 0).to(tl.int32), axis=1) > 0
            tl.store(y_ptr + offs_t[None, :] * N + zr[:, None],
                     tl.zeros((BLOCK_N, BLOCK_T), dtype=y_ptr.dtype.element_ty),
                     mask=(z_ok & ~z_used)[:, None] & valid_t[None, :])

        windows = tl.cdiv(rows, tl.maximum(share, 1))
        window = pid
        while window < windows:  # (a while loop: Triton pipelines the K loop inside it, not inside a for loop)
            r0 = window * share
            r1 = tl.minimum(r0 + share, rows)
            a0 = r0 // GROUP_SIZE
            boundary = (a0 + 1) * GROUP_SIZE  # first row of the next active group
            g0 = tl.sum(tl.where((used > 0) & (rank == a0), offs_g, 0), 0)
            g1 = tl.sum(tl.where((used > 0) & (rank == a0 + 1), offs_g, 0), 0)
            r = r0 + offs_j
            row_ok = r < r1
            grow = tl.where(r < boundary, g0 * GROUP_SIZE + r - a0 * GROUP_SIZE, g1 * GROUP_SIZE + r - boundary)
            grow = tl.where(row_ok, grow, g0 * GROUP_SIZE)  # a valid row for the (predicated-off) pointers
            offs_k = tl.arange(0, BLOCK_K)
            w_off = grow.to(tl.int64)[:, None] * K + offs_k[None, :]
            w_ptrs = w_ptr + w_off
            w2_ptrs = w2_ptr + w_off
            x_ptrs = x_ptr + offs_t[None, :] * K + offs_k[:, None]
            acc = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
            acc2 = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
            for k in range(0, K, BLOCK_K):
                if EVEN_K:
                    w = tl.load(w_ptrs, mask=row_ok[:, None], other=0.0)
                    xt = tl.load(x_ptrs, mask=valid_t[None, :], other=0.0)
                else:
                    k_ok = (k + offs_k) < K
                    w = tl.load(w_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                    xt = tl.load(x_ptrs, mask=k_ok[:, None] & valid_t[None, :], other=0.0)
                if UPCAST:
                    w = w.to(tl.float32)
                    xt = xt.to(tl.float32)
                acc = tl.dot(w, xt, acc, input_precision=DOT_PRECISION)
                if GATED:
                    if EVEN_K:
                        w2 = tl.load(w2_ptrs, mask=row_ok[:, None], other=0.0)
                    else:
                        w2 = tl.load(w2_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                    if UPCAST:
                        w2 = w2.to(tl.float32)
                    acc2 = tl.dot(w2, xt, acc2, input_precision=DOT_PRECISION)
                    w2_ptrs += BLOCK_K
                w_ptrs += BLOCK_K
                x_ptrs += BLOCK_K
            if GATED:
                acc = activation_fn(acc, ACTIVATION) * acc2
            if HAS_BIAS:
                acc += tl.load(b_ptr + grow).to(tl.float32)[:, None]
            tok_on = tl.load(mask_ptr + offs_t[None, :] * G + (grow // GROUP_SIZE)[:, None],
                             mask=row_ok[:, None] & valid_t[None, :], other=0) != 0
            acc = tl.where(tok_on, acc, 0.0)
            tl.store(y_ptr + offs_t[None, :] * N + grow[:, None], acc.to(y_ptr.dtype.element_ty),
                     mask=row_ok[:, None] & valid_t[None, :])
            window += programs
        if USE_GDC:
            tl.extra.cuda.gdc_launch_dependents()


_INTERPRET_PROGRAMS = 8
MAX_GROUPS = 1024  # the mask row each program reads at once


def rows_balanced_applies(num_tokens: int, group_size: int, num_groups: int, block_n: int) -> bool:
    """Where :func:`rows_balanced_gemv` runs in place of the per-tile GEMV: one token (where the active tiles leave SMs
    idle), windows that fit in a group, and a mask row each program can read at once."""
    return num_tokens == 1 and group_size >= block_n and num_groups <= MAX_GROUPS


def rows_balanced_gemv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, mask_rows: torch.Tensor, group_size: int,
    y: torch.Tensor, cfg: dict, w_up: torch.Tensor | None = None, activation: str = "silu",
    programs: int | None = None,
) -> torch.Tensor:
    """``y[M, N]`` as :func:`gemv_decode.output_groups_gemv` computes it (inputs checked there), with the rows of the
    active groups split evenly over ``programs`` programs (default: one per SM). ``cfg``: ``BLOCK_N``, ``BLOCK_K``,
    ``num_warps``, ``num_stages``."""
    num_tokens, k_dim = x.shape
    n_dim = weight.shape[0]
    num_groups = n_dim // group_size
    if not rows_balanced_applies(num_tokens, group_size, num_groups, cfg["BLOCK_N"]):
        raise ValueError(f"rows_balanced_gemv: needs one token, group_size >= BLOCK_N and at most {MAX_GROUPS} "
                         f"groups (got {num_tokens} tokens, group_size {group_size}, BLOCK_N {cfg['BLOCK_N']}, "
                         f"{num_groups} groups)")
    if programs is None:
        programs = _INTERPRET_PROGRAMS if interpreting() else sm_count(x.device)
    block_k = min(cfg["BLOCK_K"], max(16, next_pow2(k_dim)))
    _rows_balanced_gemv_kernel[(programs,)](
        x, weight, w_up if w_up is not None else weight, bias if bias is not None else x, y, mask_rows,
        num_tokens, n_dim, k_dim, num_groups,
        GROUP_SIZE=group_size,
        GATED=w_up is not None,
        ACTIVATION=ACTIVATION_CODES[activation],
        HAS_BIAS=bias is not None,
        BLOCK_T=max(16, next_pow2(num_tokens)),
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=block_k,
        BLOCK_G=max(16, next_pow2(num_groups)),
        EVEN_K=k_dim % block_k == 0,
        UPCAST=interpreting(),
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
        **pdl_launch(x.device),
    )
    return y
