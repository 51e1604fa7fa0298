"""Decode kernel for head-group-masked attention: split-KV (flash-decoding) with a reduction.

For T = 1..16 new tokens per sequence and long KV caches the work is bound by reading K/V. One program handles a
(batch, KV head, KV chunk): its rows are every (query head sharing that KV head, new token) pair, so K/V of the chunk
are read once for all of them (GQA packing). If no row of the program is active (all its query heads are masked off
for all its tokens) the program reads nothing: that is where the skipped (batch, group) pairs save bandwidth.

Partial results (``acc / l`` and ``lse`` in the log2 domain, fp32) of the chunks are combined by a small reduction
kernel that also writes exact zeros for inactive rows. With a single chunk the split kernel writes the output directly
and no reduction is launched. Both launches take no host synchronisation, so decode steps capture into CUDA graphs.

With an explicit boolean ``attn_mask`` (a static KV cache's mask) instead of ``causal``, each key block reads the mask
of its rows; the K/V loads of a block no active row may see are predicated off (no bytes read) rather than branched
around, which keeps the loop software-pipelined (sm_90 compile report: ``benchmarks/attention_aot_report.py``). A row
that may see no key gets zeros (as SDPA). Not yet timed on the H200.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton_utils import sm_count
from .attention_block import attend_block
from .attention_checks import AttentionDims, allocate_output, check_attention_inputs, expand_attn_mask, interpreting
from .dependent_launch import paired_pdl_launch, pdl_launch

__all__ = ["group_attention_decode", "MAX_DECODE_ROWS", "choose_num_splits"]

_LOG2E = 1.4426950408889634
MAX_DECODE_ROWS = 128  # (query heads per KV head) x (new tokens) handled by one program
_MAX_SPLITS = 64


@triton.jit
def _decode_split_kernel(
    Q, K, V, MASK, O, PART_O, PART_LSE, AMASK,
    stride_qb, stride_qh, stride_qt,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_mb, stride_mt, stride_mg,
    stride_ob, stride_oh, stride_ot,
    stride_ab, stride_ah, stride_at, stride_as,
    num_kv_heads, q_len, kv_len, chunk, num_splits, heads_per_group, qk_scale,
    Q_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_AMASK: tl.constexpr, DIRECT_OUT: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, USE_GDC: tl.constexpr,
):
    if USE_GDC:  # programmatic dependent launch (dependent_launch.py): nothing read before this
        tl.extra.cuda.gdc_wait()
    split = tl.program_id(0)
    bk = tl.program_id(1)
    b = bk // num_kv_heads
    kvh = bk % num_kv_heads

    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    dmask = offs_d < HEAD_DIM
    n_rows = Q_PER_KV * q_len
    row_ok = offs_r < n_rows
    head = kvh * Q_PER_KV + offs_r // q_len  # row r = (query head of this KV head, new token)
    tok = offs_r % q_len
    flag = tl.load(MASK + b * stride_mb + tok * stride_mt + (head // heads_per_group) * stride_mg, mask=row_ok, other=0)
    active = (flag != 0) & row_ok
    any_active = tl.max(active.to(tl.int32), axis=0) > 0
    o_ptrs = O + b.to(tl.int64) * stride_ob + head[:, None] * stride_oh + tok[:, None] * stride_ot + offs_d[None, :]
    io_mask = row_ok[:, None] & dmask[None, :]

    if any_active:
        q_ptrs = Q + b.to(tl.int64) * stride_qb + head[:, None] * stride_qh + tok[:, None] * stride_qt + offs_d[None, :]
        q = tl.load(q_ptrs, mask=io_mask, other=0.0)
        k_base = K + b.to(tl.int64) * stride_kb + kvh * stride_kh
        v_base = V + b.to(tl.int64) * stride_vb + kvh * stride_vh
        q_pos = kv_len - q_len + tok
        start = split * chunk
        end = tl.minimum(start + chunk, kv_len)
        m_i = tl.zeros([BLOCK_R], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
        am_rows = AMASK + b.to(tl.int64) * stride_ab + head.to(tl.int64) * stride_ah + tok * stride_at
        for start_n in range(start, end, BLOCK_N):
            cols = start_n + offs_n
            col_ok = cols < end
            valid = col_ok[None, :]
            if IS_CAUSAL:
                valid = valid & (cols[None, :] <= q_pos[:, None])
            load_ok = col_ok
            if HAS_AMASK:  # explicit boolean mask (static caches): K/V of blocks no active row may see are not read
                valid = valid & active[:, None]
                valid = valid & (tl.load(am_rows[:, None] + cols[None, :] * stride_as, mask=valid, other=0) != 0)
                # a predicated load (not a branch) keeps the loop software-pipelined; the hidden block's scores are
                # -inf and change nothing
                load_ok = col_ok & (tl.max(tl.max(valid.to(tl.int32), 1), 0) > 0)
            acc, l_i, m_i = attend_block(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, cols, load_ok,
                                          valid, offs_d, dmask, qk_scale, 0, 0, INPUT_PRECISION, False)
        if USE_GDC:
            tl.extra.cuda.gdc_launch_dependents()
        has_keys = l_i > 0
        o_part = acc / tl.where(has_keys, l_i, 1.0)[:, None]
        if DIRECT_OUT:
            o_part = tl.where(active[:, None], o_part, 0.0)
            tl.store(o_ptrs, o_part.to(O.dtype.element_ty), mask=io_mask)
        else:
            lse = tl.where(has_keys, m_i + tl.math.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
            part_row = (bk * num_splits + split).to(tl.int64) * n_rows + offs_r
            tl.store(PART_LSE + part_row, lse, mask=row_ok)
            tl.store(PART_O + part_row[:, None] * HEAD_DIM + offs_d[None, :], o_part, mask=io_mask)
    else:
        if DIRECT_OUT:
            tl.store(o_ptrs, tl.zeros([BLOCK_R, BLOCK_D], dtype=O.dtype.element_ty), mask=io_mask)


@triton.jit
def _decode_reduce_kernel(
    PART_O, PART_LSE, MASK, O,
    stride_mb, stride_mt, stride_mg,
    stride_ob, stride_oh, stride_ot,
    num_kv_heads, q_len, num_splits, heads_per_group,
    Q_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS_P2: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    if USE_GDC:  # programmatic dependent launch (dependent_launch.py): nothing read before this
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0)
    bk = tl.program_id(1)
    b = bk // num_kv_heads
    kvh = bk % num_kv_heads
    head = kvh * Q_PER_KV + row // q_len
    tok = row % q_len
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HEAD_DIM
    o_ptrs = O + b.to(tl.int64) * stride_ob + head * stride_oh + tok * stride_ot + offs_d
    flag = tl.load(MASK + b * stride_mb + tok * stride_mt + (head // heads_per_group) * stride_mg)
    if flag != 0:
        n_rows = Q_PER_KV * q_len
        offs_s = tl.arange(0, SPLITS_P2)
        split_ok = offs_s < num_splits
        part_row = (bk * num_splits + offs_s).to(tl.int64) * n_rows + row
        lse = tl.load(PART_LSE + part_row, mask=split_ok, other=float("-inf"))
        top = tl.max(lse, 0)  # -inf only when an explicit mask hides every key from the row: its output is 0
        weight = tl.math.exp2(lse - tl.where(top == float("-inf"), 0.0, top))
        parts = tl.load(
            PART_O + part_row[:, None] * HEAD_DIM + offs_d[None, :],
            mask=(split_ok & (weight > 0))[:, None] & dmask[None, :], other=0.0,
        )
        total = tl.sum(weight, 0)
        out = tl.sum(parts * weight[:, None], 0) / tl.where(total > 0, total, 1.0)
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=dmask)
    else:
        tl.store(o_ptrs, tl.zeros([BLOCK_D], dtype=O.dtype.element_ty), mask=dmask)


# Launch configs of the split kernel. No autotuner: it would tune on L2-resident inputs, on whichever shape comes
# first, and cannot run inside a CUDA-graph capture. Rule from the H200 sweep (benchmarks/notes_attention.md):
# few programs (latency-bound launches) want many bytes in flight per program (BLOCK_N=128, 3 stages); many programs
# with short chunks want more resident programs per SM (BLOCK_N=64, 2 stages, ~40 KB of shared memory).
_FEW_PROGRAMS = (128, 4, 3)  # (BLOCK_N, num_warps, num_stages) when programs <= 2 per SM
_SHORT_CHUNKS = (64, 4, 2)  # chunk <= 1024 keys and more than 4 programs per SM
_LONG_CHUNKS = (64, 4, 3)
_INTERPRET_META = {"BLOCK_N": 32, "num_warps": 4, "num_stages": 1}
# Without an explicit mask, at most this many programs per SM over all (batch, KV head, chunk) programs: with the
# few-programs config (one 128-key, 3-stage program per SM) half the pairs skipped leaves about one long program
# per SM, which streams K/V faster than many short ones (H200, random head-group masks, split + reduction launches;
# benchmarks/results/decode_split_rule.json, 2 against 16 per SM at 50%: B=16 S=4096 41.1 / 43.0 µs, B=4 S=16384
# 40.6 / 42.6, B=16 S=16384 130.7 / 135.3, B=32 S=4096 68.6 / 74.5; at 0% equal or faster; at 25% and 70% some
# shapes lose, by up to 11%: B=1 S=32768 at 25% 35.9 / 32.3, B=16 S=16384 at 70% 89.2 / 84.9).
PROGRAMS_PER_SM = 2
MIN_CHUNK = 512
SHORT_KV = 1024  # caches up to this length: see choose_num_splits
DIRECT_MIN_PAIRS = 64  # ... with at least this many (batch, KV head) pairs skip the reduction launch
SHORT_KV_CHUNK = 256  # ... with fewer pairs split into chunks of this many keys
# With an explicit mask (a static cache: every slot is passed, the unfilled ones hidden) a program whose chunk the
# mask hides reads only the mask, so short chunks cost little and spread the filled keys over more SMs (H200, 2048
# slots filled to 1074, benchmarks/results/kernels_attention_static.json: B=1 8.6 vs 14.3 us with 512-key chunks,
# B=8 15.5 vs 18.8 us, B=32 unchanged at 4 chunks).
MASKED_MIN_CHUNK = 128
MASKED_PROGRAMS_PER_SM = 8


def _device_sm_count(device: torch.device) -> int:
    return sm_count(device) if device.type == "cuda" else 1


def decode_config(chunk: int, programs: int, sm_count: int, head_dim: int = 128, elem_size: int = 2) -> dict:
    """``{"BLOCK_N", "num_warps", "num_stages"}`` for ``programs`` split programs reading ``chunk`` keys each.

    ``BLOCK_N`` and then the stage count shrink until the pipelined K/V tiles fit in ~160 KB of shared memory
    (this kernel's mma.sync pipeline keeps ``num_stages - 1`` K/V buffers: 139 KB at BLOCK_N=128, 3 stages, D=128
    bf16 in the sm_90 compile report of benchmarks/attention_aot_report.py).
    """
    if interpreting():
        return dict(_INTERPRET_META)
    if programs <= 2 * sm_count:
        block_n, warps, stages = _FEW_PROGRAMS
    elif chunk <= 1024 and programs > 4 * sm_count:
        block_n, warps, stages = _SHORT_CHUNKS
    else:
        block_n, warps, stages = _LONG_CHUNKS
    tile = max(16, triton.next_power_of_2(head_dim)) * elem_size * 2  # one key row of K plus V
    while block_n > 32 and (stages - 1) * block_n * tile > 160 * 1024:
        block_n //= 2
    while stages > 2 and (stages - 1) * block_n * tile > 160 * 1024:
        stages -= 1
    return {"BLOCK_N": block_n, "num_warps": warps, "num_stages": stages}


def choose_num_splits(
    batch_kv: int, kv_len: int, device: torch.device, programs_per_sm: int | None = None,
    min_chunk: int | None = None, masked: bool = False,
) -> tuple[int, int]:
    """Pick ``(num_splits, chunk)``; ``masked``: the kernel gets an explicit attention mask (see
    ``MASKED_MIN_CHUNK``), which replaces the defaults of ``programs_per_sm`` and ``min_chunk`` below.

    Short caches (``kv_len <= SHORT_KV``) are latency-bound: with many (batch, KV head) pairs one chunk per pair
    saves the reduction launch; with few pairs, chunks of 256 keys spread the reads over more SMs (H200, Llama-3-8B
    shapes: B=16 S=1k 20 us direct vs 23 us split; B=1 S=1k 8.6 us with 256-key chunks, 12.5 us with 512-key chunks,
    14 us with one chunk; benchmarks/notes_attention.md). Longer caches split each pair into as many chunks as keep
    all programs within ``programs_per_sm`` per SM (default ``PROGRAMS_PER_SM``: few long programs), with chunks of
    at least ``min_chunk`` keys; with an explicit mask, into at least that many (``MASKED_PROGRAMS_PER_SM``).
    """
    align = 32 if interpreting() else 128
    if programs_per_sm is None:
        programs_per_sm = MASKED_PROGRAMS_PER_SM if masked else PROGRAMS_PER_SM
    if min_chunk is None:
        min_chunk = MASKED_MIN_CHUNK if masked else MIN_CHUNK
    if interpreting():
        min_chunk = 32
    elif kv_len <= SHORT_KV and not masked:
        if batch_kv >= DIRECT_MIN_PAIRS:
            return 1, triton.cdiv(kv_len, align) * align
        min_chunk = SHORT_KV_CHUNK
    target_programs = programs_per_sm * _device_sm_count(device) if device.type == "cuda" else 8
    # masked: at least the target (short chunks are cheap, stop 11); unmasked: at most (long programs, see above)
    per_pair = triton.cdiv(target_programs, batch_kv) if masked else target_programs // batch_kv
    splits = max(1, min(per_pair, triton.cdiv(kv_len, min_chunk), _MAX_SPLITS))
    chunk = triton.cdiv(triton.cdiv(kv_len, splits), align) * align
    return triton.cdiv(kv_len, chunk), chunk


def _mask_for_kernel(head_mask: torch.Tensor) -> torch.Tensor:
    """Bool masks are read as bytes (zero-copy); other dtypes are read as they are and compared with zero."""
    return head_mask.view(torch.uint8) if head_mask.dtype == torch.bool else head_mask


def launch_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_mask: torch.Tensor, out: torch.Tensor,
    dims: AttentionDims, causal: bool, num_splits: int | None = None, config: dict | None = None,
    attn_mask: torch.Tensor | None = None,
) -> None:
    """Run split + reduce into ``out`` (a ``[B, Hq, T, D]`` view with unit last stride). Inputs are checked.

    ``num_splits`` overrides the chunk-count heuristic, ``config`` (``BLOCK_N``, ``num_warps``, ``num_stages``) the
    launch config; both exist for tests and the benchmark's sweep.
    """
    rows = dims.q_per_kv * dims.q_len
    if rows > MAX_DECODE_ROWS:
        raise ValueError(
            f"group_attention_decode: (query heads per KV head) x T = {rows} exceeds {MAX_DECODE_ROWS}; "
            "use group_attention_prefill"
        )
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if interpreting() and q.dtype == torch.bfloat16:  # the interpreter mis-computes bf16: run in fp32
        staging = torch.empty(out.shape, dtype=torch.float32, device=out.device)
        launch_decode(q.float(), k.float(), v.float(), head_mask, staging, dims, causal, num_splits, config, attn_mask)
        out.copy_(staging)
        return
    mask = _mask_for_kernel(head_mask)
    amask = expand_attn_mask(attn_mask, dims) if attn_mask is not None else None
    batch_kv = dims.batch * dims.num_kv_heads
    if num_splits is None:
        num_splits, chunk = choose_num_splits(batch_kv, dims.kv_len, q.device, masked=amask is not None)
    else:
        align = 32 if interpreting() else 128
        chunk = triton.cdiv(triton.cdiv(dims.kv_len, max(1, int(num_splits))), align) * align
        num_splits = triton.cdiv(dims.kv_len, chunk)
    direct = num_splits == 1
    block_d = max(16, triton.next_power_of_2(dims.head_dim))
    block_r = max(16, triton.next_power_of_2(rows))
    if direct:
        part_o = part_lse = out  # unused by the kernel in this mode
    else:
        part_o = torch.empty((batch_kv, num_splits, rows, dims.head_dim), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((batch_kv, num_splits, rows), dtype=torch.float32, device=q.device)
    args = (
        q, k, v, mask, out, part_o, part_lse, amask if amask is not None else mask,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        mask.stride(0), mask.stride(1), mask.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        *(amask.stride() if amask is not None else (0, 0, 0, 0)),
        dims.num_kv_heads, dims.q_len, dims.kv_len, chunk, num_splits, dims.heads_per_group,
        dims.scale * _LOG2E,
    )
    meta = {
        "Q_PER_KV": dims.q_per_kv, "HEAD_DIM": dims.head_dim, "BLOCK_D": block_d, "BLOCK_R": block_r,
        "IS_CAUSAL": causal, "HAS_AMASK": amask is not None, "DIRECT_OUT": direct,
        "INPUT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32",
    }
    if config is None:
        sms = _device_sm_count(q.device)
        config = decode_config(chunk, num_splits * batch_kv, sms, dims.head_dim, q.element_size())
    # the reduction always follows the split launch: it may start during the split's last programs (stop 27)
    pdl, pdl_reduce = (pdl_launch(q.device), None) if direct else paired_pdl_launch(q.device)
    _decode_split_kernel[(num_splits, batch_kv)](*args, **meta, **config, **pdl)
    if not direct:
        _decode_reduce_kernel[(rows, batch_kv)](
            part_o, part_lse, mask, out,
            mask.stride(0), mask.stride(1), mask.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            dims.num_kv_heads, dims.q_len, num_splits, dims.heads_per_group,
            Q_PER_KV=dims.q_per_kv, HEAD_DIM=dims.head_dim, BLOCK_D=block_d,
            SPLITS_P2=max(2, triton.next_power_of_2(num_splits)), num_warps=4, **pdl_reduce,
        )


def group_attention_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    head_mask: torch.Tensor,
    causal: bool = True,
    scale: float | None = None,
    merge_heads: bool = False,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Head-group-masked attention with the split-KV decode kernel (few new tokens, long KV).

    Needs ``(Hq // Hkv) * T <= 128``. ``num_splits`` overrides the KV-chunk count heuristic. Returns ``o[B, Hq, T, D]``
    or ``[B, T, Hq * D]`` with ``merge_heads=True``; see :func:`wide_compile.templates.attention.group_attention`.
    """
    dims = check_attention_inputs(q, k, v, head_mask, causal, scale, attn_mask)
    result, view = allocate_output(q, dims, merge_heads, out)
    if dims.q_len > 0:
        launch_decode(q, k, v, head_mask, view, dims, causal, num_splits, attn_mask=attn_mask)
    return result
