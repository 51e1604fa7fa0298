"""GEMVs for few tokens (decode; output groups up to 128 tokens, input groups up to 64) that read only the weight
rows / columns of groups active for ANY token, once for all tokens.

Both kernels are swap-AB matrix-vector products: a program owns ``BLOCK_N`` weight rows, the weight
tile is the wide MMA operand ``[BLOCK_N, BLOCK_K]`` (16-byte loads along K, pipelined ``num_stages``
deep) and the tokens are the narrow one ``[BLOCK_K, BLOCK_T]`` (``BLOCK_T = max(16, next_pow2(M))``).

- Output groups (q projection; gate/up fused with ``GATED``): one program per ``BLOCK_N`` rows of one
  output group. It reads the group's mask column; if no token of the batch uses the group it only
  writes zeros, otherwise it streams its rows over the full K and writes ``y`` with the inactive
  tokens of the group zeroed. No plan is needed.
- Input groups (down / o projection): one program per ``BLOCK_N`` output rows; it loops over the union
  list (groups active for any token) only, so it reads just those weight columns; per token the group's
  ``x`` chunk is zero-filled where the token does not use the group. The list comes from a plan shared
  with other ops, or each program builds it from the mask rows at its start (no separate launch); from two tokens
  the programs walk every group instead (``ALL_GROUPS``, weight loads of unused groups predicated off), and a
  pre-masked input at 1-16 tokens holds its share of the union as bits in registers (``BITS``, ``group_bits.py``),
  so no load sits in the K loop.

A program that streams a long K range is latency-bound, so K (output groups) or the union list (input
groups) is split among ``SPLIT`` programs. The split is finished in the same launch: each program
stores its fp32 partial in a workspace and increments an arrival counter; the last one sums the
partials and applies the epilogue (activation, bias, token mask) and stores ``y``.
"""
from __future__ import annotations

import torch

from ._triton_utils import (
    ACTIVATION_CODES, HAS_TRITON, activation_fn, cdiv, interpreting, largest_pow2_divisor, next_pow2, sm_count,
)
from . import gemv_rows
from .arrival_counters import arrival_counters
from .dependent_launch import pdl_launch
from .group_bits import MAX_GROUPS as BITS_MAX_GROUPS

if HAS_TRITON:
    import triton
    import triton.language as tl

    from .group_bits import pop_group, token_on, union_words

    @triton.jit
    def _split_k_finish(acc, acc2, ws_ptr, counter_ptr, tile, split,
                        SPLIT: tl.constexpr, GATED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr):
        """Split-K in one launch: every split stores its fp32 partial, the last one to arrive (atomic
        counter) sums them and returns (True, sums); the counter is reset for the next call."""
        offs = tl.arange(0, BLOCK_N)[:, None] * BLOCK_T + tl.arange(0, BLOCK_T)[None, :]
        ws_tile = ws_ptr + tile.to(tl.int64) * (SPLIT * 2 * BLOCK_N * BLOCK_T)
        tl.store(ws_tile + split * BLOCK_N * BLOCK_T + offs, acc)
        if GATED:
            tl.store(ws_tile + (SPLIT + split) * BLOCK_N * BLOCK_T + offs, acc2)
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel")
        last = arrived == SPLIT - 1
        if last:
            tl.debug_barrier()
            acc = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
            acc2 = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
            for s in tl.static_range(SPLIT):
                acc += tl.load(ws_tile + s * BLOCK_N * BLOCK_T + offs, cache_modifier=".cg")
                if GATED:
                    acc2 += tl.load(ws_tile + (SPLIT + s) * BLOCK_N * BLOCK_T + offs, cache_modifier=".cg")
            tl.atomic_xchg(counter_ptr + tile, 0)
        return last, acc, acc2

    @triton.jit
    def _output_groups_gemv_kernel(
        x_ptr, w_ptr, w2_ptr, b_ptr, y_ptr, mask_ptr, ws_ptr, counter_ptr,
        d0_ptr, d1_ptr, db0_ptr, db1_ptr, yd0_ptr, yd1_ptr,
        M, N, K, G, ND,
        GROUP_SIZE: tl.constexpr,
        TILES_PER_GROUP: tl.constexpr,
        GATED: tl.constexpr,
        ACTIVATION: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        DENSE: tl.constexpr,
        SPLIT: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr,
        UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        if USE_GDC:  # programmatic dependent launch (dependent_launch.py): nothing read before this
            tl.extra.cuda.gdc_wait()
        pid = tl.program_id(0)
        split = pid % SPLIT
        tile = pid // SPLIT
        offs_t = tl.arange(0, BLOCK_T)
        valid_t = offs_t < M
        grouped_tiles = G * TILES_PER_GROUP
        if DENSE > 0 and tile >= grouped_tiles:  # a tile of a dense sibling (every token, no mask)
            dense_tiles = tl.cdiv(ND, BLOCK_N)
            which = (tile - grouped_tiles) // dense_tiles
            offs_n = ((tile - grouped_tiles) % dense_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
            valid_n = offs_n < ND
            offs_nc = tl.minimum(offs_n, ND - 1)  # clamped: loads need no mask
            tok_on = valid_t
            if which == 0:
                w_base = d0_ptr
                b_base = db0_ptr
                y_ptrs = yd0_ptr + offs_t[None, :] * ND + offs_n[:, None]
            else:
                w_base = d1_ptr
                b_base = db1_ptr
                y_ptrs = yd1_ptr + offs_t[None, :] * ND + offs_n[:, None]
        else:
            g = tile // TILES_PER_GROUP
            offs_gn = (tile % TILES_PER_GROUP) * BLOCK_N + tl.arange(0, BLOCK_N)
            valid_n = offs_gn < GROUP_SIZE
            offs_n = g * GROUP_SIZE + offs_gn
            offs_nc = g * GROUP_SIZE + tl.minimum(offs_gn, GROUP_SIZE - 1)  # clamped: loads need no mask
            tok_on = tl.load(mask_ptr + offs_t * G + g, mask=valid_t, other=0) != 0
            w_base = w_ptr
            b_base = b_ptr
            y_ptrs = y_ptr + offs_t[None, :] * N + offs_n[:, None]
        out_mask = valid_n[:, None] & valid_t[None, :]
        if tl.max(tok_on.to(tl.int32), axis=0) == 0:  # no token of the batch uses this group
            if split == 0:
                tl.store(y_ptrs, tl.zeros((BLOCK_N, BLOCK_T), dtype=y_ptr.dtype.element_ty), mask=out_mask)
        else:
            k_len = tl.cdiv(tl.cdiv(K, SPLIT), BLOCK_K) * BLOCK_K
            k_begin = split * k_len
            k_stop = tl.minimum(K, k_begin + k_len)
            offs_k = tl.arange(0, BLOCK_K)
            w_off = offs_nc.to(tl.int64)[:, None] * K + (k_begin + offs_k)[None, :]
            w_ptrs = w_base + w_off
            w2_ptrs = w2_ptr + w_off
            x_ptrs = x_ptr + offs_t[None, :] * K + (k_begin + offs_k)[:, None]
            acc = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
            acc2 = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
            for k in range(k_begin, k_stop, BLOCK_K):
                if EVEN_K:
                    w = tl.load(w_ptrs)
                    xt = tl.load(x_ptrs, mask=valid_t[None, :], other=0.0)
                else:
                    k_ok = (k + offs_k) < k_stop
                    w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
                    xt = tl.load(x_ptrs, mask=k_ok[:, None] & valid_t[None, :], other=0.0)
                if UPCAST:
                    w = w.to(tl.float32)
                    xt = xt.to(tl.float32)
                acc = tl.dot(w, xt, acc, input_precision=DOT_PRECISION)
                if GATED:
                    if EVEN_K:
                        w2 = tl.load(w2_ptrs)
                    else:
                        w2 = tl.load(w2_ptrs, mask=k_ok[None, :], other=0.0)
                    if UPCAST:
                        w2 = w2.to(tl.float32)
                    acc2 = tl.dot(w2, xt, acc2, input_precision=DOT_PRECISION)
                    w2_ptrs += BLOCK_K
                w_ptrs += BLOCK_K
                x_ptrs += BLOCK_K
            if USE_GDC:
                tl.extra.cuda.gdc_launch_dependents()
            finish = True
            if SPLIT > 1:
                finish, acc, acc2 = _split_k_finish(acc, acc2, ws_ptr, counter_ptr, tile, split,
                                                    SPLIT, GATED, BLOCK_N, BLOCK_T)
            if finish:
                if GATED:
                    acc = activation_fn(acc, ACTIVATION) * acc2
                if HAS_BIAS:
                    acc += tl.load(b_base + offs_nc).to(tl.float32)[:, None]
                acc = tl.where(tok_on[None, :], acc, 0.0)
                tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_mask)

    @triton.jit
    def _input_groups_gemv_kernel(
        x_ptr, w_ptr, b_ptr, y_ptr, mask_ptr, union_ptr, union_count_ptr, ws_ptr, counter_ptr,
        M, N, K, G,
        GROUP_SIZE: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        ROW_MASK: tl.constexpr,
        OWN_UNION: tl.constexpr,
        ALL_GROUPS: tl.constexpr,
        BITS: tl.constexpr,
        BLOCK_G: tl.constexpr,
        SPLIT: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        if USE_GDC:  # programmatic dependent launch (dependent_launch.py): nothing read before this
            tl.extra.cuda.gdc_wait()
        CHUNKS: tl.constexpr = GROUP_SIZE // BLOCK_K
        pid = tl.program_id(0)
        split = pid % SPLIT
        tile = pid // SPLIT
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        valid_n = offs_n < N
        offs_nc = tl.minimum(offs_n, N - 1).to(tl.int64)
        offs_t = tl.arange(0, BLOCK_T)
        valid_t = offs_t < M
        offs_k = tl.arange(0, BLOCK_K)
        if BITS:  # this split's share of the union as bits in registers (group_bits.py): no load in the loop
            lo, hi, n_mine, tok_lo, tok_hi = union_words(mask_ptr, offs_t, valid_t, G, split, SPLIT)
            g = 0
        elif ALL_GROUPS:  # no list: every group, its weight loads predicated off where no token uses it
            n_groups = G
        elif OWN_UNION:  # the union list, built by every program into its own row of union_ptr (no plan launch)
            union_ptr += pid.to(tl.int64) * G
            n_groups = 0
            for g0 in range(0, G, BLOCK_G):
                offs_g = g0 + tl.arange(0, BLOCK_G)
                valid_g = offs_g < G
                on = tl.load(mask_ptr + offs_t[:, None] * G + offs_g[None, :],
                             mask=valid_t[:, None] & valid_g[None, :], other=0)
                act = tl.max((on != 0).to(tl.int32), axis=0)
                tl.store(union_ptr + n_groups + tl.cumsum(act, 0) - 1, offs_g, mask=act > 0)
                n_groups += tl.sum(act, 0)
            tl.debug_barrier()  # the list's stores visible to every thread of the program
        else:
            n_groups = tl.load(union_count_ptr)
        if BITS:  # the words hold this split's groups only
            j_start = 0
            j_end = n_mine * CHUNKS
        else:
            per_split = tl.cdiv(n_groups, SPLIT)
            j_start = split * per_split * CHUNKS
            j_end = tl.minimum(n_groups, (split + 1) * per_split) * CHUNKS
        w_rows = w_ptr + offs_nc[:, None] * K + offs_k[None, :]
        x_cols = x_ptr + offs_t[None, :] * K + offs_k[:, None]
        acc = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
        for j in range(j_start, j_end):
            if BITS:
                if CHUNKS == 1:
                    g, lo, hi = pop_group(lo, hi)
                else:  # a group's first chunk takes the next group
                    first = (j % CHUNKS) == 0
                    g_next, lo_next, hi_next = pop_group(lo, hi)
                    g = tl.where(first, g_next, g)
                    lo = tl.where(first, lo_next, lo)
                    hi = tl.where(first, hi_next, hi)
            elif ALL_GROUPS:
                g = j // CHUNKS
            else:
                g = tl.load(union_ptr + j // CHUNKS)  # the only dependent load: one level of indirection
            k0 = g * GROUP_SIZE + (j % CHUNKS) * BLOCK_K
            if BITS:
                w = tl.load(w_rows + k0)
                if ROW_MASK:
                    xt = tl.load(x_cols + k0, mask=token_on(tok_lo, tok_hi, g)[None, :], other=0.0)
                else:
                    xt = tl.load(x_cols + k0, mask=valid_t[None, :], other=0.0)
            elif ALL_GROUPS:  # a group no token uses: its weight load is predicated off (no bytes read)
                tok_on = tl.load(mask_ptr + offs_t * G + g, mask=valid_t, other=0) != 0
                used = tl.max(tok_on.to(tl.int32), axis=0) > 0
                w = tl.load(w_rows + k0, mask=valid_n[:, None] & used, other=0.0)
                xt = tl.load(x_cols + k0, mask=(tok_on if ROW_MASK else valid_t & used)[None, :], other=0.0)
            else:  # (the weight load first: with the mask row's load first, one token's down GEMV took 10% longer)
                w = tl.load(w_rows + k0)
                if ROW_MASK:  # zero-fill tokens that do not use group g (predicated load)
                    tok_on = tl.load(mask_ptr + offs_t * G + g, mask=valid_t, other=0) != 0
                    xt = tl.load(x_cols + k0, mask=tok_on[None, :], other=0.0)
                else:
                    xt = tl.load(x_cols + k0, mask=valid_t[None, :], other=0.0)
            if UPCAST:
                w = w.to(tl.float32)
                xt = xt.to(tl.float32)
            acc = tl.dot(w, xt, acc, input_precision=DOT_PRECISION)
        if USE_GDC:
            tl.extra.cuda.gdc_launch_dependents()
        finish = True
        if SPLIT > 1:
            finish, acc, _unused = _split_k_finish(acc, acc, ws_ptr, counter_ptr, tile, split,
                                                   SPLIT, False, BLOCK_N, BLOCK_T)
        if finish:
            if HAS_BIAS:
                acc += tl.load(b_ptr + offs_nc).to(tl.float32)[:, None]
            y_ptrs = y_ptr + offs_t[None, :] * N + offs_n[:, None]
            tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=valid_n[:, None] & valid_t[None, :])


def _split_workspace(device: torch.device, tiles: int, split: int, block_n: int, block_t: int):
    """fp32 partial-sum buffer (per call, from the caching allocator: no kernel) and the tiles' arrival counters
    (``arrival_counters``: zero between launches, no memset per call)."""
    ws = torch.empty(tiles * split * 2 * block_n * block_t, dtype=torch.float32, device=device)
    return ws, arrival_counters(tiles, device)


def _auto_split(tiles: int, max_split: int, active_fraction: float = 0.5) -> int:
    """Split factor giving about 4 active programs per SM (decode GEMVs are latency-bound per program)."""
    if interpreting():
        return 1
    sms = sm_count(torch.device("cuda"))
    split = 1
    while tiles * split * active_fraction < 4 * sms and split * 2 <= max_split:
        split *= 2
    return split


def _dot_precision(x: torch.Tensor) -> str:
    return "ieee" if x.dtype == torch.float32 else "tf32"


def _token_tile(num_tokens: int) -> int:
    """``BLOCK_T``: the GEMVs' one tile of all tokens (the narrow MMA operand, at least 16)."""
    return max(16, next_pow2(num_tokens))


def _pipeline_stages(block_n: int, block_k: int, block_t: int, elem_bytes: int, most: int) -> int:
    """Stages of a GEMV pipeline holding a ``[block_n, block_k]`` weight tile and a ``[block_k, block_t]`` token tile
    per stage: ``most``, or as many as fit in 216 KB of shared memory (the H200 has 227 KB per block), at least 2."""
    per_stage = (block_n + block_t) * block_k * elem_bytes
    return max(2, min(most, (216 * 1024) // per_stage))


def output_config(group_size: int, k_dim: int, gated: bool, dense: int = 0, num_tokens: int = 1) -> dict:
    """Launch configuration; ``dense``: number of dense sibling linears in the launch (their tiles double the
    programs of a query projection beside key and value, so K is split in 4 instead of 8: H200, Llama-3-8B q/k/v,
    ``benchmarks/results/kernels_qkv_sweep.json``, 12.7 vs 15.1 µs at one token and 16.5 vs 20.2 µs at four).
    Over 16 tokens (``benchmarks/results/kernels_linear_sweep_moderate_gemv.json``) the query projection splits K in
    2 (32 / 64 / 128 tokens: 12.7 / 13.8 / 17.2 µs, against 13.2 / 18.0 / 26.5 with 4). The gated form keeps 64-row
    tiles at one token: 32-row tiles took 41.2 against 47.3 µs in the isolated sweep
    (``kernels_linear_sweep_gated_decode.json``), but in the 8B model's batch-1 step they made the output GEMVs slower
    (1.494 against 1.403 ms per step, runs T and O in ``benchmarks/results/e2e.md``).

    The gated form's pipeline (``kernels_linear_sweep_gated_stages*.json``, four mask kinds at 50% and 25 / 70%):
    4 stages hold one program per SM, 3 let two share one. At one token about half the groups are active, fewer
    programs than SMs, and 4 stages are faster (50%: 32.3 against 33.9 µs; 70%: 23.3 / 27.4), unless a draw leaves
    more than 132 programs (25%: 51.0 / 49.9; a 50% draw with 68 active groups: 47.3 / 37.5, the second wave
    gone). At 2 tokens three quarters are active and 3 stages are faster (50%: 46.2 against 48.4; 70%: 34.2 / 33.4);
    at 4-16 tokens they tie within 0.6 µs. Above 16 tokens 4 stages (32: 60.2 against 61.6; 64: 62.4 / 64.6), fewer
    where four would not fit in the shared memory (:func:`_pipeline_stages` with both weight tiles).

    The plain form at one token splits K in 4 with 6 stages (``kernels_linear_sweep_small_k_decode.json``, the
    Llama-3-8B query projection alone, three 50% draws and the clustered, 25% and 70% masks: 12.75 / 8.73 / 7.03 /
    7.1 / 15.1 / 8.0 µs against 12.98 / 9.05 / 7.26 / 7.4 / 15.3 / 8.2 with 8 splits and 4 stages). At 2-16 tokens
    it splits K in 2 with 6 stages (``kernels_linear_sweep_small_k_decode_m2_16.json``, the query projection alone
    at 50%, 3 interleaved rounds: 2 / 4 / 8 / 16 tokens 11.4 / 11.5 / 12.3 / 12.4 µs against 12.9 / 13.5 / 15.3 / 15.3
    with 8 splits and 4 stages; cuBLAS dense 13.4-13.8)."""
    if interpreting():
        return dict(BLOCK_N=32, BLOCK_K=64, SPLIT=1, num_warps=4, num_stages=1)
    block_n = min(64, max(16, next_pow2(group_size)))
    many = num_tokens > 16
    if gated:  # two weights per program: enough bytes in flight without splitting K
        stages = 3 if 1 < num_tokens <= 16 else _pipeline_stages(2 * block_n, 128, _token_tile(num_tokens), 2, 4)
        return dict(BLOCK_N=block_n, BLOCK_K=128, SPLIT=1, num_warps=4, num_stages=stages)
    if dense:
        return dict(BLOCK_N=block_n, BLOCK_K=128, SPLIT=4, num_warps=4, num_stages=3)
    if num_tokens == 1 and k_dim >= 2048:  # K in 4, 6 stages: 0.2-0.3 µs less than 8 with 4 on six draws (see above)
        return dict(BLOCK_N=block_n, BLOCK_K=128, SPLIT=4, num_warps=4, num_stages=6)
    if not many and k_dim >= 2048:  # 2-16 tokens: K in 2, 6 stages (see above)
        return dict(BLOCK_N=block_n, BLOCK_K=128, SPLIT=2, num_warps=4, num_stages=6)
    return dict(BLOCK_N=block_n, BLOCK_K=128, SPLIT=2 if many else 8, num_warps=4, num_stages=4)


def output_groups_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    mask_rows: torch.Tensor,
    group_size: int,
    w_up: torch.Tensor | None = None,
    activation: str = "silu",
    config: dict | None = None,
    out: torch.Tensor | None = None,
    dense: tuple[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor], ...] = (),
) -> torch.Tensor:
    """``y[M, N]`` for output groups (``w_up`` given: fused ``act(x@W.T) * (x@Wu.T)``), few tokens (any M works: one
    tile of all tokens, ``BLOCK_T = next_pow2(M)``; ``group_linear.GEMV_MAX_TOKENS`` says where it is the default).

    ``dense``: up to two more linears of the same ``x``, ``(weight[ND, K], bias or None, out[M, ND])`` with one ``ND``,
    dtype and bias presence shared with ``weight`` / ``bias`` (e.g. the key and value projections beside the query
    projection), computed for every token in the same launch (their tiles after the grouped ones) into ``out``."""
    num_tokens, k_dim = x.shape
    n_dim = weight.shape[0]
    gated = w_up is not None
    if len(dense) > 2 or (dense and gated):
        raise ValueError("output_groups_gemv: at most two dense linears, and not with the gated form")
    nd = dense[0][0].shape[0] if dense else 0
    if any(w.shape != (nd, k_dim) or w.dtype != weight.dtype or (b is None) != (bias is None) for w, b, _ in dense):
        raise ValueError("output_groups_gemv: dense linears need weights [ND, K] of one ND and the weight's dtype, and "
                         "a bias exactly when the grouped linear has one")
    weight_bytes = (n_dim + len(dense) * nd) * k_dim * weight.element_size()
    if not gated and gemv_rows.applies(num_tokens, weight_bytes, group_size, config):
        return gemv_rows.output_rows_gemv(x, weight, bias, mask_rows, group_size, config, out, dense)
    cfg = dict(output_config(group_size, k_dim, gated, len(dense), num_tokens), **(config or {}))
    block_n, block_k = cfg["BLOCK_N"], min(cfg["BLOCK_K"], max(16, next_pow2(k_dim)))
    tiles_per_group = cdiv(group_size, block_n)
    tiles = (n_dim // group_size) * tiles_per_group + len(dense) * cdiv(nd, block_n)
    split = int(cfg.get("SPLIT", 0))
    if split <= 0:
        split = _auto_split(tiles, max(1, k_dim // (2 * block_k)))
    split = max(1, min(split, cdiv(k_dim, block_k)))
    block_t = _token_tile(num_tokens)
    y = torch.empty(num_tokens, n_dim, dtype=x.dtype, device=x.device) if out is None else out
    ws, counters = _split_workspace(x.device, tiles, split, block_n, block_t) if split > 1 else (x, x)
    _output_groups_gemv_kernel[(tiles * split,)](
        x, weight, w_up if gated else weight, bias if bias is not None else x, y, mask_rows, ws, counters,
        *gemv_rows.dense_sibling_args(dense, weight, bias, y, x),
        num_tokens, n_dim, k_dim, n_dim // group_size, max(nd, 1),
        GROUP_SIZE=group_size,
        TILES_PER_GROUP=tiles_per_group,
        GATED=gated,
        ACTIVATION=ACTIVATION_CODES[activation],
        HAS_BIAS=bias is not None,
        DENSE=len(dense),
        SPLIT=split,
        BLOCK_T=block_t,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        EVEN_K=k_dim % (block_k * split) == 0,
        UPCAST=interpreting(),
        DOT_PRECISION=_dot_precision(x),
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
        **pdl_launch(x.device),
    )
    return y


SHORT_INPUT_MAX_K = 14336  # one token over at most this many input channels: one unsplit, deep program per 32 rows
SHORT_INPUT_MIN_ROWS = 2048  # ... when that still gives 64 programs (measured at 4096 rows only)
ALL_GROUPS_MIN_TOKENS = 2  # from this many tokens: no union list, every group with predicated weight loads
WIDE_INPUT_TILE_MIN_TOKENS = 4  # ... and from this many, 128-row tiles with 8 warps
ALL_GROUPS_MAX_TOKENS = 64  # ... up to this many (the measured range; the GEMV is the default up to 64)
BITS_MAX_TOKENS = 16  # pre-masked input, groups of one K step: the union as bits (BITS), unsplit 32-row tiles


def _union_bits_applies(group_size: int, num_tokens: int, num_groups: int, n_dim: int, x_is_masked: bool) -> bool:
    """Whether the GEMV walks its union as bits with unsplit 32-row tiles: a pre-masked input (no per-token predicate
    on the token tile), 1-``BITS_MAX_TOKENS`` tokens, at most ``BITS_MAX_GROUPS`` groups of one K step (at most 128
    channels) and enough rows for 64 programs (measured on the down projection only; the output projection's groups
    of 512 were slower, ``kernels_linear_sweep_input_bits_premasked.json``)."""
    return (x_is_masked and 1 <= num_tokens <= BITS_MAX_TOKENS and 0 < num_groups <= BITS_MAX_GROUPS
            and group_size <= 128 and n_dim >= SHORT_INPUT_MIN_ROWS)


def input_config(group_size: int, num_tokens: int = 0, num_groups: int = 0, n_dim: int = 0,
                 elem_bytes: int = 2, x_is_masked: bool = False) -> dict:
    """Launch configuration of the input-group GEMV (``num_tokens`` / ``num_groups`` / ``n_dim`` 0: not known, the
    general default).

    H200 grid (``benchmarks/kernels_linear.py --sweep-decode``, 18-36 configs per case): BLOCK_N 64, BLOCK_K 128,
    5 stages, SPLIT 4 was fastest for down at M = 1 and 8 and o_proj at M = 1 (21.1 / 37.4 / 13.5 µs); fewer splits
    are not faster at 2-16 tokens (``kernels_linear_sweep_input_split.json``). One token over at most
    ``SHORT_INPUT_MAX_K`` input channels (the Llama-3-8B output projection: 8 groups of 512) takes 32-row tiles, K
    not split, 12 stages (``kernels_linear_sweep_small_k_decode.json``, three 50% draws and the clustered, 25% and 70%
    masks: 8.3 / 10.5 / 7.1 / 8.3 / 9.5 / 7.2 µs against 9.2 / 11.5 / 8.5 / 9.1 / 10.9 / 8.6), and so does the down
    projection (112 groups of 128): on masks with exactly 14 / 28 / 56 / 84 / 112 active groups 8.2 / 12.3 / 20.2 /
    27.7 / 34.9 µs against 9.9 / 13.5 / 21.2 / 28.2 / 34.9 with 4 splits (``gemv_fixed_cost.json``: the fixed cost
    falls from 6.4 to 4.7 µs). At two tokens the split stays (30.8 against 28.3 unsplit,
    ``kernels_linear_sweep_input_split.json``). Since stop 31 one token on a weight of at most 48 MiB (the output
    projection) takes ``gemv_rows.input_rows_gemv`` instead, unless a config says otherwise (``ROWS=0``). Above 16
    tokens the stages are cut to what fits beside the wider token tile; at 32 tokens this default was the fastest of
    seven (64 / 32 / 128 rows, 2-8 splits; ``kernels_linear_sweep_input_moderate.json``).

    From ``ALL_GROUPS_MIN_TOKENS`` tokens (where i.i.d. masks use almost every group) the programs build no union
    list: they walk every group and predicate off the weight loads of the unused ones (``ALL_GROUPS``), whose
    pipeline keeps all its stages (sm_90a: 5 stages in 100 KB, 50 ``cp.async``, against 61 KB / 30 with the list's
    dependent loads); from ``WIDE_INPUT_TILE_MIN_TOKENS`` with 128-row tiles and 8 warps. H200, 3 interleaved rounds
    (``kernels_linear_sweep_input_all_groups.json``), µs before / after, 50% and trained masks: down 4 tokens 32.0 /
    31.0 and 28.6 / 28.2, 8 tokens 33.4 / 32.4 and 31.1 / 30.3, 16 tokens 33.8 / 32.7 and 32.7 / 31.6, 32 tokens
    35.1 / 33.8 and 34.6 / 33.3; o_proj 8 tokens 12.5 / 12.4 and 11.2 / 11.0; 2 tokens with the default tiles: down
    27.1 / 26.5 and 25.0 / 24.9. One token keeps the list (walking all groups took twice as long at 50%); above
    ``ALL_GROUPS_MAX_TOKENS`` (a forced GEMV) the earlier tiles and the list stay. Stop 39 took the 128-row tiles to 64
    tokens (``kernels_linear_sweep_input_wide_moderate.json`` / ``_o_proj.json``, 3 interleaved rounds, input masked in
    the kernel, µs, 50% / trained masks, against cuBLAS after the masking launch): down 48 tokens 36.3 / 35.8 against
    37.6 / 37.5, 64 tokens 36.5 / 36.1 against 39.0 / 39.0; o_proj 48 tokens 14.7 / 14.4 against 16.3 / 16.2, 64
    tokens 14.9 / 14.3 against 14.6 / 14.4. At 96 and 128 tokens cuBLAS is faster (down 41.1 / 41.6 against 44.3 /
    45.0), and 2 or 8 splits, 3 stages or 64-row tiles were slower at every count.

    A pre-masked input (the model's down projection) at 1-``BITS_MAX_TOKENS`` tokens takes ``BITS`` (each program
    holds the union as bits in registers, ``group_bits.py``: no load in the K loop) with unsplit 32-row tiles and 8
    stages (:func:`_union_bits_applies`). H200, down projection, 3 interleaved rounds
    (``kernels_linear_sweep_input_bits_premasked.json``), µs default / ``BITS``, 50% and trained masks: 1 token 19.5 /
    18.8 and 17.9 / 17.3, 2 tokens 26.3 / 25.3 and 25.0 / 23.8, 4 tokens 30.7 / 30.2 and 27.3 / 26.0, 8 tokens 32.1 /
    31.9 and 29.7 / 29.1, 16 tokens 32.3 / 32.3 and 31.3 / 31.1. With the input masked in the kernel (each token's
    groups as words too) or the default 4-split tiles ``BITS`` was 1-3 µs slower (``kernels_linear_sweep_input_bits
    .json``: the words are built before the first weight load)."""
    all_groups = ALL_GROUPS_MIN_TOKENS <= num_tokens <= ALL_GROUPS_MAX_TOKENS
    bits = _union_bits_applies(group_size, num_tokens, num_groups, n_dim, x_is_masked)
    if interpreting():
        return dict(BLOCK_N=32, BLOCK_K=max(16, largest_pow2_divisor(group_size, 64)), SPLIT=1, num_warps=4,
                    num_stages=1, ALL_GROUPS=all_groups, BITS=bits)
    block_k = largest_pow2_divisor(group_size, 128)
    if bits:
        return dict(BLOCK_N=32, BLOCK_K=block_k, SPLIT=1, num_warps=4, num_stages=8, BITS=True)
    if num_tokens == 1 and 0 < num_groups * group_size <= SHORT_INPUT_MAX_K and n_dim >= SHORT_INPUT_MIN_ROWS:
        return dict(BLOCK_N=32, BLOCK_K=block_k, SPLIT=1, num_warps=4, num_stages=12)
    if WIDE_INPUT_TILE_MIN_TOKENS <= num_tokens <= ALL_GROUPS_MAX_TOKENS:
        stages = _pipeline_stages(128, block_k, _token_tile(num_tokens), elem_bytes, most=4)
        return dict(BLOCK_N=128, BLOCK_K=block_k, SPLIT=4, num_warps=8, num_stages=stages, ALL_GROUPS=all_groups)
    stages = _pipeline_stages(64, block_k, _token_tile(num_tokens), elem_bytes, most=5)
    return dict(BLOCK_N=64, BLOCK_K=block_k, SPLIT=4, num_warps=4, num_stages=stages, ALL_GROUPS=all_groups)


def input_groups_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    mask_rows: torch.Tensor,
    union_groups: torch.Tensor | None,
    union_count: torch.Tensor | None,
    group_size: int,
    x_is_masked: bool = False,
    config: dict | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y[M, N] = (x * mask over K) @ W.T + b`` reading only union-active weight columns (any M; one tile of all
    tokens, ``group_linear.GEMV_MAX_TOKENS`` says where it is the default).

    ``union_groups`` / ``union_count``: a plan's union list (``build_group_plan(..., parts=("union",))``), shared
    with other ops of the same mask; None: every program builds the list from ``mask_rows`` itself (into a per-call
    scratch row: one launch instead of a plan kernel and this one)."""
    num_tokens, k_dim = x.shape
    n_dim = weight.shape[0]
    num_groups = k_dim // group_size
    if gemv_rows.applies(num_tokens, n_dim * k_dim * weight.element_size(), group_size, config, output=False):
        return gemv_rows.input_rows_gemv(x, weight, bias, mask_rows, group_size, config, out)
    # One token: its union is its own groups, so no path reads x outside them and masking x is a no-op; the
    # pre-masked kernels (no per-token predicate; BITS where it applies) are exact. H200, down at one token, input
    # masked in the kernel, 50% / trained masks: 20.2 / 20.0 µs on the union list (stop 37's kernels_linear.md), 19.1 /
    # 17.9 this way (kernels_linear_one_token_input_stop38.md).
    x_is_masked = x_is_masked or num_tokens == 1
    cfg = dict(input_config(group_size, num_tokens, num_groups, n_dim, x.element_size(), x_is_masked),
               **(config or {}))
    block_k = cfg["BLOCK_K"]
    if block_k < 16 or group_size % block_k:
        raise ValueError(f"input_group_linear: group_size {group_size} needs a multiple of 16 for the GEMV path")
    tiles = cdiv(n_dim, cfg["BLOCK_N"])
    split = int(cfg.get("SPLIT", 0))
    if split <= 0:
        split = _auto_split(tiles, max(1, num_groups // 2), active_fraction=1.0)
    block_t = _token_tile(num_tokens)
    y = torch.empty(num_tokens, n_dim, dtype=x.dtype, device=x.device) if out is None else out
    ws, counters = _split_workspace(x.device, tiles, split, cfg["BLOCK_N"], block_t) if split > 1 else (x, x)
    bits = bool(cfg.get("BITS", False)) and union_groups is None and num_groups <= BITS_MAX_GROUPS
    all_groups = bool(cfg.get("ALL_GROUPS", False)) and union_groups is None and not bits
    own_union = union_groups is None and not all_groups and not bits
    if all_groups or bits:  # no list to hold
        union_groups = union_count = mask_rows
    elif own_union:  # one scratch row per program (torch.empty: no kernel)
        union_groups = torch.empty(tiles * split * num_groups, dtype=torch.int32, device=x.device)
        union_count = union_groups
    elif union_count is None:
        raise ValueError("input_groups_gemv: union_count is needed with union_groups")
    _input_groups_gemv_kernel[(tiles * split,)](
        x, weight, bias if bias is not None else x, y, mask_rows, union_groups, union_count, ws, counters,
        num_tokens, n_dim, k_dim, num_groups,
        GROUP_SIZE=group_size,
        HAS_BIAS=bias is not None,
        ROW_MASK=not x_is_masked,
        OWN_UNION=own_union,
        ALL_GROUPS=all_groups,
        BITS=bits,
        BLOCK_G=min(128, max(16, next_pow2(num_groups))),
        SPLIT=split,
        BLOCK_T=block_t,
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=block_k,
        UPCAST=interpreting(),
        DOT_PRECISION=_dot_precision(x),
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
        **pdl_launch(x.device),
    )
    return y
