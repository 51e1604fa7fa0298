"""Output-group GEMV whose active work is split evenly over a fixed grid (stream-K): decode of gate/up and of the
query projection (with its dense key / value siblings).

The per-tile GEMV (``gemv_decode``) launches one program per ``BLOCK_N`` rows of each output group; programs of groups
no token uses exit at once. With half of the groups active the streaming work then lands on whichever programs got
an active group: at one token about 112 of 224 gate/up programs for 132 SMs (20 SMs idle), at two tokens about 168
(a full wave, then 36 SMs busy for a second one). Each of these programs streams a megabyte, so the device waits on
the last ones.

Here the grid is fixed (``PROGRAMS``, a multiple of the SM count) and the work is counted in units of one
``BLOCK_N x BLOCK_K`` weight tile (two with the gated form): the active tiles in order (groups some token uses, then
the dense siblings' tiles), each cut into ``KCH = cdiv(K, BLOCK_K)`` chunks, ``U`` units in all. Program ``p`` takes
units ``[p * U // W, (p + 1) * U // W)`` with ``W = min(P, U)`` working programs: every program streams the same
number of bytes, whatever the mask. Every program derives the list of active groups from the mask rows itself (no plan launch).

A program's range covers a tile whole (it stores the output directly) or in part. Parts go to a per-program
workspace: a program's first tile to slot 0, its last to slot 1 (every tile strictly inside a range is whole). The
programs of one tile are consecutive, ``p_first .. p_last``, computable from the tile's first and last unit; each
stores its part and increments the tile's arrival counter, and the last to arrive sums the parts in program order
(deterministic, like ``gemv_decode``'s split-K) and applies the epilogue (activation, bias, token mask). Outputs of
groups no token uses are written as zeros, spread over the programs.
"""
from __future__ import annotations

import torch

from ._triton_utils import ACTIVATION_CODES, HAS_TRITON, activation_fn, cdiv, interpreting, next_pow2, sm_count
from .arrival_counters import arrival_counters
from .dependent_launch import pdl_launch

# Most output groups the kernel handles: the active list is formed in registers from one [tokens, BLOCK_G] block.
MAX_GROUPS = 1024

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _balanced_output_gemv_kernel(
        x_ptr, w_ptr, w2_ptr, b_ptr, y_ptr, mask_ptr, list_ptr, ws_ptr, counter_ptr,
        d0_ptr, d1_ptr, db0_ptr, db1_ptr, yd0_ptr, yd1_ptr,
        M, N, K, G, ND,
        GROUP_SIZE: tl.constexpr,
        TILES_PER_GROUP: tl.constexpr,
        GATED: tl.constexpr,
        ACTIVATION: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        DENSE: tl.constexpr,
        BLOCK_G: tl.constexpr,
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
        P = tl.num_programs(0)
        offs_t = tl.arange(0, BLOCK_T)
        valid_t = offs_t < M
        offs_g = tl.arange(0, BLOCK_G)
        valid_g = offs_g < G
        # the groups some token uses, listed in order into this program's row of list_ptr
        # (one load of all rows: with a loop over row blocks here Triton 3.7 left the main loop below unpipelined)
        on = tl.load(mask_ptr + offs_t[:, None] * G + offs_g[None, :], mask=valid_t[:, None] & valid_g[None, :], other=0)
        act = tl.max((on != 0).to(tl.int32), axis=0)
        list_ptr += pid.to(tl.int64) * G
        tl.store(list_ptr + tl.cumsum(act, 0) - 1, offs_g, mask=act > 0)
        grouped = tl.sum(act, 0) * TILES_PER_GROUP
        dense_per = tl.cdiv(ND, BLOCK_N)
        KCH = tl.cdiv(K, BLOCK_K)
        U = (grouped + DENSE * dense_per) * KCH
        W = tl.maximum(tl.minimum(P, U), 1)  # working programs: each gets at least one unit
        u0 = tl.minimum(pid, W) * U // W
        u1 = tl.minimum(pid + 1, W) * U // W

        # outputs of unused groups are zeros: group g is zeroed by program g % P
        zeros = tl.zeros((BLOCK_N, BLOCK_T), dtype=y_ptr.dtype.element_ty)
        for g in range(pid, G, P):
            used = tl.max((tl.load(mask_ptr + offs_t * G + g, mask=valid_t, other=0) != 0).to(tl.int32), axis=0)
            if used == 0:
                for n0 in range(0, GROUP_SIZE, BLOCK_N):
                    offs_gn = n0 + tl.arange(0, BLOCK_N)
                    tl.store(y_ptr + offs_t[None, :] * N + (g * GROUP_SIZE + offs_gn)[:, None], zeros,
                             mask=(offs_gn < GROUP_SIZE)[:, None] & valid_t[None, :])
        tl.debug_barrier()  # the list's stores visible to every thread of the program

        offs_k = tl.arange(0, BLOCK_K)
        offs_r = tl.arange(0, BLOCK_N)
        offs_ws = offs_r[:, None] * BLOCK_T + offs_t[None, :]
        PIECE: tl.constexpr = BLOCK_N * BLOCK_T
        acc = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
        # One flat loop over the program's units (no loop nested in it, so Triton pipelines the weight stream across
        # tile boundaries); a tile's sum is stored when its last unit here is done: whole tiles through the epilogue,
        # parts into the workspace, which the arrivals after the loop combine.
        for u in range(u0, u1):
            a = u // KCH
            kc = u - a * KCH
            dense_tile = a >= grouped
            g = tl.load(list_ptr + a // TILES_PER_GROUP, mask=a < grouped, other=0)
            d = tl.maximum(a - grouped, 0)
            row0 = tl.where(dense_tile, (d % dense_per) * BLOCK_N, g * GROUP_SIZE + (a % TILES_PER_GROUP) * BLOCK_N)
            row_end = tl.where(dense_tile, ND, g * GROUP_SIZE + GROUP_SIZE)
            rows_c = tl.minimum(row0 + offs_r, row_end - 1)  # clamped: loads need no mask
            if DENSE > 0:
                w_base = tl.where(dense_tile, tl.where(d // dense_per == 0, d0_ptr, d1_ptr), w_ptr)
            else:
                w_base = w_ptr
            w_off = rows_c.to(tl.int64)[:, None] * K + (kc * BLOCK_K + offs_k)[None, :]
            x_ptrs = x_ptr + offs_t[None, :] * K + (kc * BLOCK_K + offs_k)[:, None]
            if EVEN_K:
                w = tl.load(w_base + w_off)
                xt = tl.load(x_ptrs, mask=valid_t[None, :], other=0.0)
            else:
                k_ok = (kc * BLOCK_K + offs_k) < K
                w = tl.load(w_base + w_off, mask=k_ok[None, :], other=0.0)
                xt = tl.load(x_ptrs, mask=k_ok[:, None] & valid_t[None, :], other=0.0)
            if UPCAST:
                w = w.to(tl.float32)
                xt = xt.to(tl.float32)
            acc = tl.dot(w, xt, acc, input_precision=DOT_PRECISION)
            if GATED:
                if EVEN_K:
                    w2 = tl.load(w2_ptr + w_off)
                else:
                    w2 = tl.load(w2_ptr + w_off, mask=k_ok[None, :], other=0.0)
                if UPCAST:
                    w2 = w2.to(tl.float32)
                acc2 = tl.dot(w2, xt, acc2, input_precision=DOT_PRECISION)
            tile_done = (kc == KCH - 1) | (u == u1 - 1)
            if tile_done:
                if (kc == KCH - 1) & (a * KCH >= u0):  # the whole tile was this program's: finish it
                    _balanced_epilogue(acc, acc2, a, grouped, dense_per, list_ptr, mask_ptr, b_ptr, db0_ptr,
                                       db1_ptr, y_ptr, yd0_ptr, yd1_ptr, offs_t, valid_t, offs_r, M, N, G, ND,
                                       GROUP_SIZE, TILES_PER_GROUP, GATED, ACTIVATION, HAS_BIAS, BLOCK_N)
                else:  # a part: the first tile of the range to slot 0, the last to slot 1
                    ws_mine = ws_ptr + (pid * 2 + tl.where(a == u0 // KCH, 0, 1)).to(tl.int64) * (2 * PIECE)
                    tl.store(ws_mine + offs_ws, acc)
                    if GATED:
                        tl.store(ws_mine + PIECE + offs_ws, acc2)
            acc = tl.where(tile_done, 0.0, acc)
            acc2 = tl.where(tile_done, 0.0, acc2)
        if USE_GDC:
            tl.extra.cuda.gdc_launch_dependents()

        # arrivals for the (at most two) tiles this program holds a part of; the last part to arrive sums them all
        if u0 < u1:
            tl.debug_barrier()
            a_first = u0 // KCH
            a_last = (u1 - 1) // KCH
            for side in range(2):
                a = tl.where(side == 0, a_first, a_last)
                partial = (a * KCH < u0) | ((a + 1) * KCH > u1)
                if partial & ((side == 0) | (a_last != a_first)):
                    p_first = ((a * KCH + 1) * W - 1) // U
                    p_last = ((a + 1) * KCH * W - 1) // U
                    arrived = tl.atomic_add(counter_ptr + a, 1, sem="acq_rel")
                    if arrived == p_last - p_first:
                        tl.debug_barrier()
                        acc = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
                        acc2 = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
                        for q in range(p_first, p_last + 1):
                            q_slot = tl.where((q * U) // W // KCH == a, 0, 1)  # a was q's first tile, or its last
                            ws_q = ws_ptr + (q * 2 + q_slot).to(tl.int64) * (2 * PIECE)
                            acc += tl.load(ws_q + offs_ws, cache_modifier=".cg")
                            if GATED:
                                acc2 += tl.load(ws_q + PIECE + offs_ws, cache_modifier=".cg")
                        tl.atomic_xchg(counter_ptr + a, 0)
                        _balanced_epilogue(acc, acc2, a, grouped, dense_per, list_ptr, mask_ptr, b_ptr, db0_ptr,
                                           db1_ptr, y_ptr, yd0_ptr, yd1_ptr, offs_t, valid_t, offs_r, M, N, G, ND,
                                           GROUP_SIZE, TILES_PER_GROUP, GATED, ACTIVATION, HAS_BIAS, BLOCK_N)

    @triton.jit
    def _balanced_epilogue(acc, acc2, a, grouped, dense_per, list_ptr, mask_ptr, b_ptr, db0_ptr, db1_ptr, y_ptr,
                           yd0_ptr, yd1_ptr, offs_t, valid_t, offs_r, M, N, G, ND,
                           GROUP_SIZE: tl.constexpr, TILES_PER_GROUP: tl.constexpr, GATED: tl.constexpr,
                           ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr):
        """Activation, bias and token mask of tile ``a``'s sums; stores its outputs."""
        if GATED:
            acc = activation_fn(acc, ACTIVATION) * acc2
        if a < grouped:
            g = tl.load(list_ptr + a // TILES_PER_GROUP)
            in_group = (a % TILES_PER_GROUP) * BLOCK_N + offs_r
            valid_n = in_group < GROUP_SIZE
            offs_n = g * GROUP_SIZE + tl.minimum(in_group, GROUP_SIZE - 1)
            if HAS_BIAS:
                acc += tl.load(b_ptr + offs_n).to(tl.float32)[:, None]
            tok_on = tl.load(mask_ptr + offs_t * G + g, mask=valid_t, other=0) != 0
            acc = tl.where(tok_on[None, :], acc, 0.0)
            tl.store(y_ptr + offs_t[None, :] * N + offs_n[:, None], acc.to(y_ptr.dtype.element_ty),
                     mask=valid_n[:, None] & valid_t[None, :])
        else:  # a tile of a dense sibling (every token, no mask)
            d = a - grouped
            offs_n = (d % dense_per) * BLOCK_N + offs_r
            valid_n = offs_n < ND
            offs_nc = tl.minimum(offs_n, ND - 1)
            if d // dense_per == 0:
                if HAS_BIAS:
                    acc += tl.load(db0_ptr + offs_nc).to(tl.float32)[:, None]
                tl.store(yd0_ptr + offs_t[None, :] * ND + offs_n[:, None], acc.to(yd0_ptr.dtype.element_ty),
                         mask=valid_n[:, None] & valid_t[None, :])
            else:
                if HAS_BIAS:
                    acc += tl.load(db1_ptr + offs_nc).to(tl.float32)[:, None]
                tl.store(yd1_ptr + offs_t[None, :] * ND + offs_n[:, None], acc.to(yd1_ptr.dtype.element_ty),
                         mask=valid_n[:, None] & valid_t[None, :])


def balanced_config(gated: bool, dense: int = 0, num_tokens: int = 1) -> dict:
    """Launch configuration: ``PROGRAMS_PER_SM`` programs per SM (the grid), tiles and pipeline depth.

    The group list load before each weight load costs the software pipeliner stages: ``num_stages = 2 b - 1`` gives
    ``b`` weight buffers (sm_90a compile, Triton 3.6 and 3.7: 3 / 5 / 7 stages -> 2 / 3 / 4 buffers). At most 4 buffers,
    fewer where ``b`` buffers of weight and token tiles would not fit in 200 KB of shared memory."""
    if interpreting():
        return dict(BLOCK_N=32, BLOCK_K=64, PROGRAMS=5, num_warps=4, num_stages=1)
    block_n, block_k, block_t = 64, 128, max(16, next_pow2(num_tokens))
    per_buffer = ((2 if gated else 1) * block_n + block_t) * block_k * 2
    buffers = max(2, min(4, (200 * 1024) // per_buffer))
    return dict(BLOCK_N=block_n, BLOCK_K=block_k, PROGRAMS_PER_SM=1 if gated else 2, num_warps=4,
                num_stages=2 * buffers - 1)


def balanced_output_gemv(
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
    """Same contract as ``gemv_decode.output_groups_gemv`` (``y[M, N]`` on active output groups, exact zeros
    elsewhere; ``w_up``: fused ``act(x @ W.T) * (x @ Wu.T)``; ``dense``: up to two dense sibling linears of ``x``), for
    at most ``MAX_GROUPS`` groups. ``config["PROGRAMS"]`` fixes the grid (tests), else ``PROGRAMS_PER_SM`` x SMs."""
    num_tokens, k_dim = x.shape
    n_dim = weight.shape[0]
    num_groups = n_dim // group_size
    gated = w_up is not None
    if num_groups > MAX_GROUPS:
        raise ValueError(f"balanced_output_gemv: at most {MAX_GROUPS} output groups, got {num_groups}")
    if len(dense) > 2 or (dense and gated):
        raise ValueError("balanced_output_gemv: at most two dense linears, and not with the gated form")
    nd = dense[0][0].shape[0] if dense else 0
    if any(w.shape != (nd, k_dim) or w.dtype != weight.dtype or (b is None) != (bias is None) for w, b, _ in dense):
        raise ValueError("balanced_output_gemv: dense linears need weights [ND, K] of one ND and the weight's dtype, "
                         "and a bias exactly when the grouped linear has one")
    cfg = dict(balanced_config(gated, len(dense), num_tokens), **(config or {}))
    block_n, block_k = cfg["BLOCK_N"], min(cfg["BLOCK_K"], max(16, next_pow2(k_dim)))
    tiles_per_group = cdiv(group_size, block_n)
    max_tiles = num_groups * tiles_per_group + len(dense) * cdiv(max(nd, 1), block_n)
    programs = int(cfg.get("PROGRAMS", 0)) or int(cfg.get("PROGRAMS_PER_SM", 1)) * sm_count(x.device)
    block_t = max(16, next_pow2(num_tokens))
    y = torch.empty(num_tokens, n_dim, dtype=x.dtype, device=x.device) if out is None else out
    ws = torch.empty(programs * 2 * 2 * block_n * block_t, dtype=torch.float32, device=x.device)
    group_list = torch.empty(programs * num_groups, dtype=torch.int32, device=x.device)  # a row per program
    counters = arrival_counters(max_tiles, x.device)
    pads = [*dense, *(dense[-1:] if dense else [(weight, bias, y)]) * (2 - len(dense))]  # unused slots: any pointer
    _balanced_output_gemv_kernel[(programs,)](
        x, weight, w_up if gated else weight, bias if bias is not None else x, y, mask_rows, group_list, ws, counters,
        pads[0][0], pads[1][0], *(b if b is not None else x for _, b, _ in pads[:2]), pads[0][2], pads[1][2],
        num_tokens, n_dim, k_dim, num_groups, max(nd, 1),
        GROUP_SIZE=group_size,
        TILES_PER_GROUP=tiles_per_group,
        GATED=gated,
        ACTIVATION=ACTIVATION_CODES[activation],
        HAS_BIAS=bias is not None,
        DENSE=len(dense),
        BLOCK_G=max(16, next_pow2(num_groups)),
        BLOCK_T=block_t,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        EVEN_K=k_dim % block_k == 0,
        UPCAST=interpreting(),
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
        **pdl_launch(x.device),
    )
    return y


__all__ = ["MAX_GROUPS", "balanced_config", "balanced_output_gemv"]
