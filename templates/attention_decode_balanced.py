"""Decode attention with the active key blocks split evenly over a fixed grid (stream-K / "lean" decoding).

The split-KV kernel (``attention_decode``) gives every (batch, KV head) pair the same number of chunks, fixed at
launch: the head mask is data, so the chunk count cannot follow how many pairs are active without a host sync, and a
draw with more active pairs than the rule expected leaves a second wave of programs (25% sparsity), one with fewer
leaves SMs idle. Here the grid is fixed instead (``programs``: one per SM) and the work follows the mask on the
device: every program counts the active pairs itself (a few hundred mask bytes), numbers their key blocks
``u = a * blocks + j`` (active pair ``a`` in pair order, block ``j`` of ``BLOCK_N`` keys), and takes the units
``[p U / P, (p + 1) U / P)`` of the ``U = A * blocks`` there are: the same bytes for every program whatever the mask.

With at most as many pairs as programs a range covers at most two pairs, so the key loop is one flat, software-
pipelined loop: at the first pair's last block it stores that pair's partial (a predicated store, no branch) and
restarts its online softmax. A range's partial for active pair ``a`` goes to slot ``p + a`` (unique: along the units,
each new segment starts a new program, a new pair or both). The reduction kernel finds a pair's programs from the
same arithmetic (the program holding unit ``u`` is ``((u + 1) P - 1) // U``), merges their partials in log2 space
and writes exact zeros for inactive rows. Both launches take no host synchronisation (CUDA graphs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention_block import attend_block
from .attention_checks import AttentionDims, interpreting
from .dependent_launch import paired_pdl_launch

__all__ = ["balanced_decode_applies", "launch_balanced_decode", "BALANCED_PROGRAMS_PER_SM"]

_LOG2E = 1.4426950408889634
BALANCED_PROGRAMS_PER_SM = 1  # one long program per SM, the split kernel's few-programs config
_MAX_ACTIVITY_TILE = 4096  # (pairs x rows) mask flags each program reads at once
_REDUCE_SLOTS = 16  # partials merged per step of the reduction's loop
_INTERPRET_PROGRAMS = 8
REDUCE_HOIST = False


@triton.jit
def _pair_activity(MASK, stride_mb, stride_mt, stride_mg, num_kv_heads, batch_kv, q_len, heads_per_group,
                   Q_PER_KV: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_R: tl.constexpr):
    """``on[BLOCK_P]`` (int32): 1 where the (batch, KV head) pair has an active row (query head sharing that KV
    head, new token)."""
    idx = tl.arange(0, BLOCK_P)
    offs_r = tl.arange(0, BLOCK_R)
    b = idx // num_kv_heads
    head = (idx % num_kv_heads)[:, None] * Q_PER_KV + offs_r[None, :] // q_len
    tok = offs_r[None, :] % q_len
    ok = (idx < batch_kv)[:, None] & (offs_r < Q_PER_KV * q_len)[None, :]
    flag = tl.load(MASK + b[:, None] * stride_mb + tok * stride_mt + (head // heads_per_group) * stride_mg,
                   mask=ok, other=0)
    return tl.max(((flag != 0) & ok).to(tl.int32), axis=1)


@triton.jit
def _store_partial(PART_O, PART_LSE, slot, acc, l_i, m_i, offs_r, offs_d, n_rows, row_mask, dmask,
                   HEAD_DIM: tl.constexpr):
    has_keys = l_i > 0
    o_part = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.math.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    part_row = slot.to(tl.int64) * n_rows + offs_r
    tl.store(PART_LSE + part_row, lse, mask=row_mask)
    tl.store(PART_O + part_row[:, None] * HEAD_DIM + offs_d[None, :], o_part, mask=row_mask[:, None] & dmask[None, :])


@triton.jit
def _balanced_split_kernel(
    Q, K, V, MASK, PART_O, PART_LSE,
    stride_qb, stride_qh, stride_qt,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_mb, stride_mt, stride_mg,
    num_kv_heads, batch_kv, q_len, kv_len, blocks, num_programs, heads_per_group, qk_scale,
    Q_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr, IS_CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_GDC: tl.constexpr, Q_SELECT: tl.constexpr = False, FLUSH_BRANCH: tl.constexpr = False,
):
    if USE_GDC:  # programmatic dependent launch (dependent_launch.py): nothing read before this
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    on = _pair_activity(MASK, stride_mb, stride_mt, stride_mg, num_kv_heads, batch_kv, q_len, heads_per_group,
                        Q_PER_KV, BLOCK_P, BLOCK_R)
    rank = tl.cumsum(on, 0) - 1  # active index of each active pair
    units = tl.sum(on, 0) * blocks
    u0 = (pid * units) // num_programs
    u1 = ((pid + 1) * units) // num_programs
    if u1 > u0:
        a0 = u0 // blocks
        bound = (a0 + 1) * blocks  # first unit of the next active pair
        idx = tl.arange(0, BLOCK_P)
        pair0 = tl.sum(tl.where((on > 0) & (rank == a0), idx, 0), 0)
        pair1 = tl.sum(tl.where((on > 0) & (rank == a0 + 1), idx, 0), 0)
        offs_r = tl.arange(0, BLOCK_R)
        offs_d = tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        dmask = offs_d < HEAD_DIM
        n_rows = Q_PER_KV * q_len
        row_ok = offs_r < n_rows
        tok = offs_r % q_len
        q_pos = kv_len - q_len + tok
        io_mask = row_ok[:, None] & dmask[None, :]
        m_i = tl.zeros([BLOCK_R], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
        if Q_SELECT:
            b0 = pair0 // num_kv_heads
            head0 = (pair0 % num_kv_heads) * Q_PER_KV + offs_r // q_len
            q0 = tl.load(Q + b0.to(tl.int64) * stride_qb + head0[:, None] * stride_qh + tok[:, None] * stride_qt
                         + offs_d[None, :], mask=io_mask, other=0.0)
            b1 = pair1 // num_kv_heads
            head1 = (pair1 % num_kv_heads) * Q_PER_KV + offs_r // q_len
            q1 = tl.load(Q + b1.to(tl.int64) * stride_qb + head1[:, None] * stride_qh + tok[:, None] * stride_qt
                         + offs_d[None, :], mask=io_mask, other=0.0)
        for u in range(u0, u1):
            second = u >= bound
            pair = tl.where(second, pair1, pair0)
            b = pair // num_kv_heads
            kvh = pair % num_kv_heads
            if Q_SELECT:
                q = tl.where(second, q1, q0)
            else:
                head = kvh * Q_PER_KV + offs_r // q_len
                q = tl.load(Q + b.to(tl.int64) * stride_qb + head[:, None] * stride_qh + tok[:, None] * stride_qt
                            + offs_d[None, :], mask=io_mask, other=0.0)
            k_base = K + b.to(tl.int64) * stride_kb + kvh * stride_kh
            v_base = V + b.to(tl.int64) * stride_vb + kvh * stride_vh
            cols = (u - tl.where(second, bound, bound - blocks)) * BLOCK_N + offs_n
            col_ok = cols < kv_len
            valid = col_ok[None, :]
            if IS_CAUSAL:
                valid = valid & (cols[None, :] <= q_pos[:, None])
            acc, l_i, m_i = attend_block(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, cols, col_ok, valid,
                                          offs_d, dmask, qk_scale, 0, 0, INPUT_PRECISION, False)
            flush = u == bound - 1  # the first pair's last block: its partial is complete
            if FLUSH_BRANCH:
                if flush:
                    _store_partial(PART_O, PART_LSE, pid + a0, acc, l_i, m_i, offs_r, offs_d, n_rows, row_ok, dmask,
                                   HEAD_DIM)
            else:
                _store_partial(PART_O, PART_LSE, pid + a0, acc, l_i, m_i, offs_r, offs_d, n_rows, row_ok & flush,
                               dmask, HEAD_DIM)
            acc = tl.where(flush, 0.0, acc)
            l_i = tl.where(flush, 0.0, l_i)
            m_i = tl.where(flush, float("-inf"), m_i)
        if USE_GDC:
            tl.extra.cuda.gdc_launch_dependents()
        if u1 != bound:  # the range ends inside a pair (the first, or the second one)
            slot = pid + tl.where(u1 > bound, a0 + 1, a0)
            _store_partial(PART_O, PART_LSE, slot, acc, l_i, m_i, offs_r, offs_d, n_rows, row_ok, dmask, HEAD_DIM)


@triton.jit
def _balanced_reduce_kernel(
    PART_O, PART_LSE, MASK, O,
    stride_mb, stride_mt, stride_mg,
    stride_ob, stride_oh, stride_ot,
    num_kv_heads, batch_kv, q_len, blocks, num_programs, heads_per_group,
    Q_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr, SLOTS: tl.constexpr, USE_GDC: tl.constexpr, HOIST: tl.constexpr = False,
):
    if USE_GDC:  # programmatic dependent launch (dependent_launch.py): nothing read before this
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0)
    pair = tl.program_id(1)
    b = pair // num_kv_heads
    head = (pair % num_kv_heads) * Q_PER_KV + row // q_len
    tok = row % q_len
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HEAD_DIM
    o_ptrs = O + b.to(tl.int64) * stride_ob + head * stride_oh + tok * stride_ot + offs_d
    flag = tl.load(MASK + b * stride_mb + tok * stride_mt + (head // heads_per_group) * stride_mg)
    if HOIST:  # every pair's flags read beside the row's own (one round trip less for active rows)
        on = _pair_activity(MASK, stride_mb, stride_mt, stride_mg, num_kv_heads, batch_kv, q_len, heads_per_group,
                            Q_PER_KV, BLOCK_P, BLOCK_R)
    if flag != 0:  # the pair is active, so there is at least one active pair
        if not HOIST:
            on = _pair_activity(MASK, stride_mb, stride_mt, stride_mg, num_kv_heads, batch_kv, q_len,
                                heads_per_group, Q_PER_KV, BLOCK_P, BLOCK_R)
        a = tl.sum(tl.where(tl.arange(0, BLOCK_P) < pair, on, 0), 0)  # active pairs before this one
        units = tl.sum(on, 0) * blocks
        first = ((a * blocks + 1) * num_programs - 1) // units  # the program holding the pair's first unit
        last = ((a + 1) * blocks * num_programs - 1) // units
        n_rows = Q_PER_KV * q_len
        top = tl.max(tl.full([SLOTS], float("-inf"), tl.float32), 0)
        total = tl.sum(tl.zeros([SLOTS], tl.float32), 0)
        out = tl.zeros([BLOCK_D], dtype=tl.float32)
        for p0 in range(first, last + 1, SLOTS):
            offs_p = p0 + tl.arange(0, SLOTS)
            # programs between first and last with an empty range (more programs than units) wrote nothing
            slot_ok = (offs_p <= last) & ((offs_p + 1) * units // num_programs > offs_p * units // num_programs)
            part_row = (offs_p + a).to(tl.int64) * n_rows + row
            lse = tl.load(PART_LSE + part_row, mask=slot_ok, other=float("-inf"))
            new_top = tl.maximum(top, tl.max(lse, 0))
            safe = tl.where(new_top == float("-inf"), 0.0, new_top)  # every key hidden so far: weights stay 0
            alpha = tl.math.exp2(top - safe)
            weight = tl.math.exp2(lse - safe)
            parts = tl.load(PART_O + part_row[:, None] * HEAD_DIM + offs_d[None, :],
                            mask=(slot_ok & (weight > 0))[:, None] & dmask[None, :], other=0.0)
            out = out * alpha + tl.sum(parts * weight[:, None], 0)
            total = total * alpha + tl.sum(weight, 0)
            top = new_top
        out = out / tl.where(total > 0, total, 1.0)
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=dmask)
    else:
        tl.store(o_ptrs, tl.zeros([BLOCK_D], dtype=O.dtype.element_ty), mask=dmask)


def _programs(device: torch.device) -> int:
    if interpreting() or device.type != "cuda":
        return _INTERPRET_PROGRAMS
    from ._triton_utils import sm_count

    return BALANCED_PROGRAMS_PER_SM * sm_count(device)


def balanced_decode_applies(dims: AttentionDims, device: torch.device, programs: int | None = None) -> bool:
    """Whether the balanced kernel handles this decode call: at most one (batch, KV head) pair per program (a range
    then spans at most two pairs) and at most ``_MAX_ACTIVITY_TILE`` (pair, row) mask flags for each program to read."""
    batch_kv = dims.batch * dims.num_kv_heads
    rows = max(16, triton.next_power_of_2(dims.q_per_kv * dims.q_len))
    return (batch_kv <= (programs or _programs(device))
            and triton.next_power_of_2(batch_kv) * rows <= _MAX_ACTIVITY_TILE)


def launch_balanced_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, out: torch.Tensor, dims: AttentionDims,
    causal: bool, config: dict, programs: int | None = None,
) -> None:
    """Split + reduce into ``out`` (``[B, Hq, T, D]`` view, unit last stride); inputs checked and made unit-stride by
    the caller (``attention_decode.launch_decode``), ``mask`` the head mask as the kernels read it. ``config``:
    ``BLOCK_N``, ``num_warps``, ``num_stages``; ``programs``: the grid (default one per SM)."""
    programs = programs or _programs(q.device)
    if not balanced_decode_applies(dims, q.device, programs):
        raise ValueError(f"balanced decode: {dims.batch * dims.num_kv_heads} (batch, KV head) pairs need at most "
                         f"{programs} programs' worth, with at most {_MAX_ACTIVITY_TILE} mask flags per program")
    batch_kv = dims.batch * dims.num_kv_heads
    rows = dims.q_per_kv * dims.q_len
    blocks = triton.cdiv(dims.kv_len, config["BLOCK_N"])
    block_d = max(16, triton.next_power_of_2(dims.head_dim))
    block_r = max(16, triton.next_power_of_2(rows))
    block_p = max(2, triton.next_power_of_2(batch_kv))
    slots = programs + batch_kv  # partial slot of (program p, active pair a) is p + a
    part_o = torch.empty((slots, rows, dims.head_dim), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((slots, rows), dtype=torch.float32, device=q.device)
    mask_strides = (mask.stride(0), mask.stride(1), mask.stride(2))
    pdl_split, pdl_reduce = paired_pdl_launch(q.device)
    _balanced_split_kernel[(programs,)](
        q, k, v, mask, part_o, part_lse,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        *mask_strides,
        dims.num_kv_heads, batch_kv, dims.q_len, dims.kv_len, blocks, programs, dims.heads_per_group,
        dims.scale * _LOG2E,
        Q_PER_KV=dims.q_per_kv, HEAD_DIM=dims.head_dim, BLOCK_D=block_d, BLOCK_R=block_r, BLOCK_P=block_p,
        IS_CAUSAL=causal, INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        **config, **pdl_split,
    )
    _balanced_reduce_kernel[(rows, batch_kv)](
        part_o, part_lse, mask, out,
        *mask_strides,
        out.stride(0), out.stride(1), out.stride(2),
        dims.num_kv_heads, batch_kv, dims.q_len, blocks, programs, dims.heads_per_group,
        Q_PER_KV=dims.q_per_kv, HEAD_DIM=dims.head_dim, BLOCK_D=block_d, BLOCK_R=block_r, BLOCK_P=block_p,
        SLOTS=_REDUCE_SLOTS, num_warps=4, HOIST=REDUCE_HOIST, **pdl_reduce,
    )
