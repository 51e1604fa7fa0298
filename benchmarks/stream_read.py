"""Kernels that only read: what streaming a number of bytes costs without any arithmetic (the fastest reads measured,
not a proven floor: where the library's GEMVs read faster, they are the better reader).

``_read_kernel`` sums a contiguous range of a bf16 buffer with plain register loads and stores one fp32 per program
(stop 29's ``register_stream_probe.py``: below about 50 MB it reads faster than cuBLAS's GEMV and the library's
cp.async GEMVs; from about 58 MB cuBLAS's GEMV on the same bytes is faster, so the linear table takes the faster of
the two, see ``kernels_linear.Case.read_fns``).

``_read_dot_kernel`` reads whole rows of a ``[rows, ROW]`` view through a software-pipelined loop (its tiles feed a
``tl.dot`` with a vector of ones, so Triton stages them through shared memory with ``cp.async``, as the library's
GEMVs do): the way the library's GEMVs and cuBLAS read large weights fastest.

``READ_VARIANTS``: label -> (kernel, launch shape). ``"reg"``: the two variants fastest at 8-234 MB in stop 29's probe
(``results/register_stream_probe.json``): (programs per SM, BLOCK elements, warps, loads per step). ``"dot"``:
(BLOCK_N rows, BLOCK_K columns, stages, warps), the gated GEMV's tile and two neighbours.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

READ_VARIANTS = {
    "reg_p4_b8192_w8": ("reg", (4, 8192, 8, 1)), "reg_p8_b4096_w4": ("reg", (8, 4096, 4, 1)),
    "dot_n64_k128_s4": ("dot", (64, 128, 4, 4)), "dot_n64_k256_s4": ("dot", (64, 256, 4, 4)),
    "dot_n128_k128_s4": ("dot", (128, 128, 4, 8)),
}


@triton.jit
def _read_kernel(src_ptr, out_ptr, numel, chunk, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """Program ``p`` sums ``src[p * chunk : (p + 1) * chunk]`` (bf16, clipped to ``numel``; ``chunk`` a multiple of
    ``BLOCK * UNROLL``) and stores one fp32. Each step issues ``UNROLL`` independent loads of ``BLOCK`` elements
    before their adds, so ``UNROLL * BLOCK * 2`` bytes are in flight per program (Triton does not software-pipeline
    loads that feed no dot)."""
    start0 = tl.program_id(0).to(tl.int64) * chunk
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, chunk, BLOCK * UNROLL):
        for u in tl.static_range(UNROLL):
            idx = start0 + start + u * BLOCK + offs
            acc += tl.load(src_ptr + idx, mask=idx < numel, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


@triton.jit
def _read_dot_kernel(src_ptr, out_ptr, rows, ROW: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     STAGES: tl.constexpr):
    """Program ``p`` sums rows ``[p * BLOCK_N, (p + 1) * BLOCK_N)`` (clipped to ``rows``) of the ``[rows, ROW]`` view of
    ``src`` (``ROW`` a multiple of ``BLOCK_K``) and stores one fp32: each ``[BLOCK_N, BLOCK_K]`` tile times a ones
    matrix, so the loads are pipelined ``STAGES`` deep."""
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = offs_n < rows
    ptrs = src_ptr + offs_n.to(tl.int64)[:, None] * ROW + offs_k[None, :]
    ones = tl.full([BLOCK_K, 16], 1.0, dtype=src_ptr.dtype.element_ty)
    acc = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
    for k in tl.range(0, ROW, BLOCK_K, num_stages=STAGES):
        tile = tl.load(ptrs + k, mask=row_ok[:, None], other=0.0)
        acc = tl.dot(tile, ones, acc)
    tl.store(out_ptr + pid, tl.sum(tl.sum(acc, axis=1), axis=0) / 16)


def _check(src: torch.Tensor, numel: int, out: torch.Tensor, programs: int) -> None:
    if src.dtype not in (torch.bfloat16, torch.float16) or not src.is_contiguous():
        raise ValueError(f"stream_read: src must be a contiguous bf16 or fp16 tensor, got {src.dtype}, "
                         f"contiguous={src.is_contiguous()}")
    if not 0 <= numel <= src.numel():
        raise ValueError(f"stream_read: numel={numel} outside [0, {src.numel()}]")
    if out.numel() < programs or out.dtype != torch.float32:
        raise ValueError(f"stream_read: out needs >= {programs} fp32 elements, got {out.numel()} {out.dtype}")


def _dot_programs(numel: int, row: int, block_n: int) -> int:
    """Programs of ``_read_dot_kernel`` on ``numel`` elements in rows of ``row``: one per ``block_n`` rows, at least
    one."""
    return max(1, -(-(numel // row) // block_n))


def read_dot_call(src: torch.Tensor, numel: int, out: torch.Tensor, row: int, block_n: int, block_k: int,
                  stages: int, warps: int):
    """A thunk that reads the first ``numel`` elements of ``src`` (a whole number of ``row``-element rows) with
    ``_read_dot_kernel`` and writes one partial sum per program to ``out``; returns (thunk, programs)."""
    if row % block_k or numel % row:
        raise ValueError(f"stream_read: numel={numel} must be whole rows of {row}, and {row} a multiple of "
                         f"BLOCK_K={block_k}")
    rows = numel // row
    programs = _dot_programs(numel, row, block_n)
    _check(src, numel, out, programs)
    flat = src.view(-1)
    return (lambda: _read_dot_kernel[(programs,)](flat, out, rows, ROW=row, BLOCK_N=block_n, BLOCK_K=block_k,
                                                  STAGES=stages, num_warps=warps)), programs


def read_call(src: torch.Tensor, numel: int, out: torch.Tensor, programs: int, block: int, warps: int,
              unroll: int):
    """A thunk that reads the first ``numel`` elements of the flat bf16 / fp16 ``src`` with ``programs`` programs of
    ``_read_kernel`` and writes their partial sums to ``out[:programs]``."""
    _check(src, numel, out, programs)
    step = block * unroll
    chunk = -(-numel // (programs * step)) * step
    flat = src.view(-1)
    return lambda: _read_kernel[(programs,)](flat, out, numel, chunk, BLOCK=block, UNROLL=unroll, num_warps=warps)


def read_fns(srcs: list, numels: list, out: torch.Tensor, variant: str, sms: int, row: int) -> list:
    """One read thunk per rotation copy with ``READ_VARIANTS[variant]``: copy ``i`` reads ``numels[i]`` elements of
    ``srcs[i]`` (for ``"dot"`` variants whole rows of ``row`` elements)."""
    kernel, shape = READ_VARIANTS[variant]
    if kernel == "reg":
        per_sm, block, warps, unroll = shape
        return [read_call(s, n, out, per_sm * sms, block, warps, unroll) for s, n in zip(srcs, numels)]
    return [read_dot_call(s, n, out, row, *shape)[0] for s, n in zip(srcs, numels)]


def out_elements(numels: list, sms: int, row: int) -> int:
    """fp32 elements of ``out`` that every variant's launch on these lengths needs."""
    reg = max(shape[0] for kernel, shape in READ_VARIANTS.values() if kernel == "reg") * sms
    dot = max(_dot_programs(n, row, shape[0]) for n in numels for kernel, shape in READ_VARIANTS.values()
              if kernel == "dot")
    return max(reg, dot)


def all_variant_fns(srcs: list, numels: list, sms: int, row: int) -> tuple[dict, torch.Tensor]:
    """``read_fns`` of every ``READ_VARIANTS`` variant on the same copies and lengths, and the fp32 buffer (on the
    sources' device) that all of them write their partial sums to."""
    out = torch.empty(out_elements(numels, sms, row), device=srcs[0].device, dtype=torch.float32)
    return {label: read_fns(srcs, numels, out, label, sms, row) for label in READ_VARIANTS}, out
