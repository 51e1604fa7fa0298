"""Small helpers shared by the Triton templates (Triton availability, interpreter mode, device size)."""
from __future__ import annotations

import functools
import os

import torch

try:  # Triton is optional: without it every entry point uses the PyTorch reference.
    import triton  # noqa: F401
    import triton.language as tl  # noqa: F401

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only on machines without Triton
    HAS_TRITON = False


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def can_run_triton(t: torch.Tensor) -> bool:
    """Whether a Triton kernel can run on tensors living on ``t.device``."""
    if not HAS_TRITON:
        return False
    if t.device.type == "cuda":
        return True
    return t.device.type == "cpu" and interpreting()


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA ``device`` (its index, or the current device), cached per device."""
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (and >= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def largest_pow2_divisor(n: int, cap: int) -> int:
    """Largest power of two that divides ``n`` and is <= ``cap``."""
    p = 1
    while p * 2 <= cap and n % (p * 2) == 0:
        p *= 2
    return p


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


ACTIVATION_CODES = {"silu": 0, "gelu": 1, "gelu_tanh": 2}

if HAS_TRITON:

    @triton.jit
    def swizzle_n_major(pid, num_m, num_n, GROUP_N: tl.constexpr):
        """Program id -> (m tile, n tile), GROUP_N n tiles side by side, sweeping m tiles (L2 reuse)."""
        width = GROUP_N * num_m
        first_n = (pid // width) * GROUP_N
        size_n = tl.minimum(num_n - first_n, GROUP_N)
        local = pid % width
        return local // size_n, first_n + local % size_n

    @triton.jit
    def tiles_below_largest_count(counts_ptr, num_counts, BLOCK: tl.constexpr, COUNTS_P2: tl.constexpr):
        """``cdiv(max(counts[:num_counts]), BLOCK)``: the tiles of ``BLOCK`` list positions that hold an active row in
        some group (``COUNTS_P2``: a power of two >= ``num_counts``). Past them every tile is zero-only."""
        offs = tl.arange(0, COUNTS_P2)
        return tl.cdiv(tl.max(tl.load(counts_ptr + offs, mask=offs < num_counts, other=0), 0), BLOCK)

    @triton.jit
    def output_group_tile(M, N, tokens_ptr, counts_ptr, GROUP_SIZE: tl.constexpr, TILES_PER_GROUP: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_N: tl.constexpr,
                          ACTIVE_FIRST: tl.constexpr = 0):
        """This program's tile of an output-group GEMM over the per-group reordered token list.

        Returns ``(tile_start, offs_m, rows, count, offs_n, valid_n, out_mask)``: the tile's first position
        in group ``g``'s list (active tokens first; the tile is fully inactive when ``tile_start >= count``),
        the token rows it gathers / scatters, and its output columns. ``ACTIVE_FIRST`` (0: off, else a power of
        two >= the number of groups): the first programs sweep the token tiles below the largest group's count, the
        rest (zero-only tiles in every group) come last, where they fill the SMs the last wave of MMA tiles leaves.
        """
        num_m = tl.cdiv(M, BLOCK_M)
        num_n = (N // GROUP_SIZE) * TILES_PER_GROUP
        if ACTIVE_FIRST:
            m_act = tiles_below_largest_count(counts_ptr, N // GROUP_SIZE, BLOCK_M, ACTIVE_FIRST)
            pid = tl.program_id(0)
            if pid < m_act * num_n:
                pid_m, pid_n = swizzle_n_major(pid, m_act, num_n, GROUP_N)
            else:
                pid_m = m_act + (pid - m_act * num_n) // num_n
                pid_n = (pid - m_act * num_n) % num_n
        else:
            pid_m, pid_n = swizzle_n_major(tl.program_id(0), num_m, num_n, GROUP_N)
        g = pid_n // TILES_PER_GROUP
        offs_gn = (pid_n % TILES_PER_GROUP) * BLOCK_N + tl.arange(0, BLOCK_N)
        valid_n = offs_gn < GROUP_SIZE
        offs_n = g * GROUP_SIZE + offs_gn
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        valid_m = offs_m < M
        rows = tl.load(tokens_ptr + g.to(tl.int64) * M + offs_m, mask=valid_m, other=0).to(tl.int64)
        count = tl.load(counts_ptr + g)
        out_mask = valid_m[:, None] & valid_n[None, :]
        return pid_m * BLOCK_M, offs_m, rows, count, offs_n, valid_n, out_mask

    @triton.jit
    def tail_rows(tokens_ptr, tile_start, offs_n, valid_n, M, GROUP_SIZE: tl.constexpr, PART: tl.constexpr):
        """The first ``PART`` list positions of an output-group tile (``TAIL_SPLIT``): their token rows, positions and
        store mask (rows inside ``M``, columns inside the group)."""
        g = tl.min(offs_n, 0) // GROUP_SIZE
        offs = tile_start + tl.arange(0, PART)
        rows = tl.load(tokens_ptr + g.to(tl.int64) * M + offs, mask=offs < M, other=0).to(tl.int64)
        return rows, offs, (offs < M)[:, None] & valid_n[None, :]

    @triton.jit
    def tail_part(count, tile_start, BLOCK_M: tl.constexpr, TAIL_SPLIT: tl.constexpr):
        """Rows of a partly active tile that run the K loop: the smallest of ``BLOCK_M // TAIL_SPLIT``, ...,
        ``BLOCK_M // 2`` (at least 16, ``tl.dot``'s minimum) holding the active ones, else ``BLOCK_M``. Callers put
        each smaller size's code under the same compile-time conditions."""
        rem = count - tile_start
        part = rem * 0 + BLOCK_M
        if TAIL_SPLIT >= 2 and BLOCK_M // 2 >= 16:
            part = tl.where(rem <= BLOCK_M // 2, BLOCK_M // 2, part)
        if TAIL_SPLIT >= 4 and BLOCK_M // 4 >= 16:
            part = tl.where(rem <= BLOCK_M // 4, BLOCK_M // 4, part)
        return part

    @triton.jit
    def swizzle_m_major(pid, num_m, num_n, GROUP_M: tl.constexpr):
        """Program id -> (m tile, n tile), GROUP_M m tiles side by side, sweeping n tiles (L2 reuse)."""
        width = GROUP_M * num_n
        first_m = (pid // width) * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        local = pid % width
        return first_m + local % size_m, local // size_m

    @triton.jit
    def activation_fn(v, ACTIVATION: tl.constexpr):
        """silu (0), exact gelu (1) or tanh-approximated gelu (2) of an fp32 tile."""
        if ACTIVATION == 0:
            out = v * tl.sigmoid(v)
        elif ACTIVATION == 1:
            out = 0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))
        else:
            inner = 0.7978845608028654 * (v + 0.044715 * v * v * v)
            out = v * tl.sigmoid(2.0 * inner)  # 0.5 * (1 + tanh(z)) == sigmoid(2 z)
        return out
