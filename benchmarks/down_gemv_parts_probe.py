"""Probe: where the down GEMV at a few tokens loses its ~10% to a read of the same bytes (stop 37).

Stop 36 timed a pipelined read of the union's bytes beside every decode row (``stream_read.py``): at 8 tokens the
down projection's input-group GEMV took 32.4 µs, the read 29.3, cuBLAS dense 32.2. The read streams the bytes as
rows of 4096 elements (8 KB, the other dimension of the weight); the GEMV reads 128-row x 128-column tiles of the
``[4096, 14336]`` weight (256 B per row per step, rows 28 KB apart) and adds per step: a token tile of ``x``, a mask
row with a predicate on the weight load, and at the end a split-K finish. This probe builds the GEMV up from the bare
read, one part at a time, in one kernel (``_parts_kernel``, each part a constexpr), so each part's cost is a
difference of two rows timed in the same interleaved rounds:

- ``read`` rows: the bare tile read, on the down layout with the GEMV's tiling and others, and on the transposed
  layout (``[14336, 4096]``, the read of ``stream_read``);
- ``+x``: the token tile of ``x`` loaded per step (the read's MMA takes a constant ones tile);
- ``+mask``: the group's mask row loaded per step, weight loads predicated off for unused groups, ``x`` zero-filled
  for tokens off the group (as ``ALL_GROUPS``);
- ``+finish``: the fp32 partials and arrival counter of ``gemv_decode._split_k_finish``; ``finish counted first``:
  :func:`_split_k_finish_counted_first`, the last arrival skipping its own store and release; ``finish sentinel``:
  :func:`_split_k_finish_sentinel`, partials that signal their own arrival (both added after stop 37's runs, not
  timed yet);
- ``gemv``: the library's ``input_groups_gemv`` on the same masks; ``cublas``: ``F.linear`` on the dense weight,
  in both layouts.

    python3 benchmarks/down_gemv_parts_probe.py --out FILE.json [--tokens 8] [--rounds 5]

Timing: ``kernels_linear.interleaved`` (CUDA-graph replays of 4 rotated copies, 470 MB per replay), ``--rounds``
interleaved rounds, median.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from wide_compile.templates.arrival_counters import arrival_counters
from wide_compile.templates.gemv_decode import _split_k_finish, input_groups_gemv

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_linear import ceilings, interleaved  # noqa: E402

N_OUT, K_IN, GROUP = 4096, 14336, 128
COPIES = 4
# the library GEMV without a split-K finish (every program over the whole K) and its current default
GEMV_CONFIGS = [dict(BLOCK_N=bn, BLOCK_K=128, SPLIT=1, num_warps=w, num_stages=st, ALL_GROUPS=True)
                for bn, w, st in ((32, 4, 12), (32, 4, 8), (16, 4, 12), (16, 4, 8), (64, 4, 6))]


@triton.jit
def _split_k_finish_counted_first(acc, ws_ptr, counter_ptr, flag_ptr, tile, split, SPLIT: tl.constexpr,
                                  BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr):
    """A split-K finish with the arrival counted before the partial is stored (``FINISH=2``; untimed so far): the
    last to arrive does not store its own partial or wait for its release; it polls the others' flags (they have
    arrived, so they are running and only store theirs), loads their partials, sums them into its own. The others
    store their partial and raise their flag (release). The last resets the flags and the counter for the next call.
    Against ``gemv_decode._split_k_finish``: one dependent round trip fewer for the program that finishes the tile."""
    offs = tl.arange(0, BLOCK_N)[:, None] * BLOCK_T + tl.arange(0, BLOCK_T)[None, :]
    ws_tile = ws_ptr + tile.to(tl.int64) * (SPLIT * BLOCK_N * BLOCK_T)
    flags = flag_ptr + tile * SPLIT
    arrived = tl.atomic_add(counter_ptr + tile, 1, sem="relaxed")
    last = arrived == SPLIT - 1
    if last:
        for s in tl.static_range(SPLIT):
            if s != split:
                while tl.atomic_add(flags + s, 0, sem="acquire") == 0:
                    pass
                acc += tl.load(ws_tile + s * BLOCK_N * BLOCK_T + offs, cache_modifier=".cg")
                tl.atomic_xchg(flags + s, 0, sem="relaxed")
        tl.atomic_xchg(counter_ptr + tile, 0, sem="relaxed")
    else:
        tl.store(ws_tile + split * BLOCK_N * BLOCK_T + offs, acc)
        tl.debug_barrier()
        tl.atomic_xchg(flags + split, 1, sem="release")
    return last, acc


SENTINEL = -1  # int32 bits of an empty workspace word: a NaN that GPU arithmetic never makes (it makes 0x7FFFFFFF)
_SENTINEL = tl.constexpr(SENTINEL)  # the same, for the kernels


@triton.jit
def _split_k_finish_sentinel(acc, ws_ptr, counter_ptr, tile, split, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_T: tl.constexpr):
    """A split-K finish whose partials signal their own arrival (``FINISH=3``; untimed so far): the workspace holds
    ``SENTINEL`` between calls. Every program counts its arrival first; the others just store their partial (no
    fence, no flag); the last re-reads each other partial (volatile loads) until no word is ``SENTINEL``, sums, and
    writes ``SENTINEL`` back. The last program's chain: the counter, then one read of the partials (two dependent
    round trips where ``gemv_decode._split_k_finish`` and ``FINISH=2`` take three). Safe against deadlock: the
    programs it waits for have arrived, so they are running and only store."""
    offs = tl.arange(0, BLOCK_N)[:, None] * BLOCK_T + tl.arange(0, BLOCK_T)[None, :]
    ws_tile = ws_ptr + tile.to(tl.int64) * (SPLIT * BLOCK_N * BLOCK_T)
    arrived = tl.atomic_add(counter_ptr + tile, 1, sem="relaxed")
    last = arrived == SPLIT - 1
    if last:
        empty = tl.full([BLOCK_N, BLOCK_T], _SENTINEL, tl.int32).to(tl.float32, bitcast=True)
        for s in tl.static_range(SPLIT):
            if s != split:
                part = tl.load(ws_tile + s * BLOCK_N * BLOCK_T + offs, volatile=True)
                while tl.max((part.to(tl.int32, bitcast=True) == _SENTINEL).to(tl.int32)) > 0:
                    part = tl.load(ws_tile + s * BLOCK_N * BLOCK_T + offs, volatile=True)
                acc += part
                tl.store(ws_tile + s * BLOCK_N * BLOCK_T + offs, empty)
        tl.atomic_xchg(counter_ptr + tile, 0, sem="relaxed")
    else:
        tl.store(ws_tile + split * BLOCK_N * BLOCK_T + offs, acc)
    return last, acc


@triton.jit
def _parts_kernel(w_ptr, x_ptr, mask_ptr, out_ptr, ws_ptr, counter_ptr, M, R, C: tl.constexpr, G,
                  SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
                  STAGES: tl.constexpr, X_TILE: tl.constexpr, MASK: tl.constexpr, FINISH: tl.constexpr,
                  ROTATE: tl.constexpr = False):
    """A ``[R, C]`` weight read in ``[BLOCK_N, BLOCK_K]`` tiles, C split in ``SPLIT``; optional parts of the GEMV.
    ``ROTATE``: tile ``i`` starts its K loop at step ``i`` (mod the steps) and wraps around, so that the programs read
    different columns of x at any moment instead of all the same ones."""
    pid = tl.program_id(0)
    split = pid % SPLIT
    tile = pid // SPLIT
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = offs_n < R
    offs_nc = tl.minimum(offs_n, R - 1).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    offs_t = tl.arange(0, BLOCK_T)
    valid_t = offs_t < M
    k_len: tl.constexpr = C // SPLIT
    k_begin = split * k_len
    w_rows = w_ptr + offs_nc[:, None] * C + (k_begin + offs_k)[None, :]
    x_cols = x_ptr + offs_t[None, :] * C + (k_begin + offs_k)[:, None]
    ones = tl.full([BLOCK_K, BLOCK_T], 1.0, dtype=w_ptr.dtype.element_ty)
    acc = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
    if MASK == 2:  # every group's "any token uses it" bit, packed into two words at the start (G <= 128)
        offs_g = tl.arange(0, 64)
        lo_on = tl.load(mask_ptr + offs_t[:, None] * G + offs_g[None, :],
                        mask=valid_t[:, None] & (offs_g < G)[None, :], other=0) != 0
        hi_on = tl.load(mask_ptr + offs_t[:, None] * G + 64 + offs_g[None, :],
                        mask=valid_t[:, None] & (offs_g + 64 < G)[None, :], other=0) != 0
        lo_word = tl.sum(tl.max(lo_on.to(tl.int64), axis=0) << offs_g.to(tl.int64), axis=0)
        hi_word = tl.sum(tl.max(hi_on.to(tl.int64), axis=0) << offs_g.to(tl.int64), axis=0)
    rot = (tile % (k_len // BLOCK_K)) * BLOCK_K if ROTATE else 0
    for k_step in tl.range(0, k_len, BLOCK_K, num_stages=STAGES):
        k = k_step
        if ROTATE:  # a select, not a modulo: the pipeliner keeps cp.async for it
            k = k_step + rot
            k = tl.where(k >= k_len, k - k_len, k)
        if MASK == 2:
            g = (k_begin + k) // 128
            word = tl.where(g < 64, lo_word, hi_word)
            used = ((word >> (g % 64).to(tl.int64)) & 1) != 0
            w = tl.load(w_rows + k, mask=row_ok[:, None] & used, other=0.0)
            if X_TILE:
                xt = tl.load(x_cols + k, mask=valid_t[None, :] & used, other=0.0)
            else:
                xt = ones
        elif MASK == 1:
            g = (k_begin + k) // 128
            tok_on = tl.load(mask_ptr + offs_t * G + g, mask=valid_t, other=0) != 0
            used = tl.max(tok_on.to(tl.int32), axis=0) > 0
            w = tl.load(w_rows + k, mask=row_ok[:, None] & used, other=0.0)
            if X_TILE:
                xt = tl.load(x_cols + k, mask=tok_on[None, :], other=0.0)
            else:
                xt = ones
        else:
            w = tl.load(w_rows + k)
            if X_TILE:
                xt = tl.load(x_cols + k, mask=valid_t[None, :], other=0.0)
            else:
                xt = ones
        acc = tl.dot(w, xt, acc)
    finish = True
    if FINISH == 3:
        finish, acc = _split_k_finish_sentinel(acc, ws_ptr, counter_ptr, tile, split, SPLIT, BLOCK_N, BLOCK_T)
    elif FINISH == 2:
        flags = counter_ptr + tl.cdiv(R, BLOCK_N)  # after the tiles' counters
        finish, acc = _split_k_finish_counted_first(acc, ws_ptr, counter_ptr, flags, tile, split, SPLIT, BLOCK_N,
                                                    BLOCK_T)
    elif FINISH:
        finish, acc, _unused = _split_k_finish(acc, acc, ws_ptr, counter_ptr, tile, split, SPLIT, False, BLOCK_N,
                                               BLOCK_T)
    if finish:
        tl.store(out_ptr + offs_n[:, None] * BLOCK_T + offs_t[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None])


def parts_fns(ws: list, xs: list, masks: list, out: torch.Tensor, rows: int, cols: int, block_n: int, block_k: int,
              split: int, stages: int, warps: int, x_tile: bool = False, mask: int = 0,
              finish: int = 0, rotate: bool = False) -> list:
    tiles = triton.cdiv(rows, block_n)
    m = xs[0].shape[0]
    block_t = max(16, triton.next_power_of_2(m))
    work = torch.full((tiles * split * 2 * block_n * block_t,), SENTINEL, device="cuda", dtype=torch.int32).view(
        torch.float32)  # FINISH=3 needs it empty; the other finishes overwrite it
    counters = arrival_counters(tiles * (1 + split), torch.device("cuda"))  # FINISH=2: then a flag per program

    def one(w, x, mk):
        return lambda: _parts_kernel[(tiles * split,)](
            w, x, mk, out, work, counters, m, rows, cols, mk.shape[1], SPLIT=split, BLOCK_N=block_n,
            BLOCK_K=block_k, BLOCK_T=block_t, STAGES=stages, X_TILE=x_tile, MASK=mask, FINISH=finish, ROTATE=rotate,
            num_warps=warps)
    return [one(w, x, mk) for w, x, mk in zip(ws, xs, masks)]


def variants(ws: list, wts: list, xs: list, masks: list, out: torch.Tensor) -> dict:
    down = dict(rows=N_OUT, cols=K_IN)
    gemv_tiling = dict(block_n=128, block_k=128, split=4, stages=4, warps=8)
    every_part = dict(x_tile=True, mask=1, finish=True)
    timed = {
        "read down layout, 128x128 split 4 (the GEMV's tiling)": parts_fns(ws, xs, masks, out, **down, **gemv_tiling),
        "read down layout, 64x128 split 4, 5 stages": parts_fns(ws, xs, masks, out, **down, block_n=64, block_k=128,
                                                                  split=4, stages=5, warps=4),
        "read down layout, 64x128 split 2": parts_fns(ws, xs, masks, out, **down, block_n=64, block_k=128, split=2,
                                                      stages=4, warps=4),
        "read down layout, 32x256 split 4": parts_fns(ws, xs, masks, out, **down, block_n=32, block_k=256, split=4,
                                                      stages=4, warps=4),
        "read down layout, 16x512 split 4": parts_fns(ws, xs, masks, out, **down, block_n=16, block_k=512, split=4,
                                                      stages=4, warps=4),
        "read transposed, 64x128 (stream_read's)": parts_fns(wts, xs, masks, out, rows=K_IN, cols=N_OUT,
                                                               block_n=64, block_k=128, split=1, stages=4, warps=4),
        "read transposed, 128x128 split 1": parts_fns(wts, xs, masks, out, rows=K_IN, cols=N_OUT, block_n=128,
                                                      block_k=128, split=1, stages=4, warps=8),
        "+x (GEMV's tiling)": parts_fns(ws, xs, masks, out, **down, **gemv_tiling, x_tile=True),
        "+x +mask": parts_fns(ws, xs, masks, out, **down, **gemv_tiling, x_tile=True, mask=1),
        "+x +mask +finish": parts_fns(ws, xs, masks, out, **down, **gemv_tiling, x_tile=True, mask=1, finish=True),
        "+x +finish (no mask)": parts_fns(ws, xs, masks, out, **down, **gemv_tiling, x_tile=True, finish=True),
        "+x +mask +finish counted first": parts_fns(ws, xs, masks, out, **down, **gemv_tiling, x_tile=True, mask=1,
                                                     finish=2),
        "+x +finish counted first (no mask)": parts_fns(ws, xs, masks, out, **down, **gemv_tiling, x_tile=True,
                                                        finish=2),
        "+x +mask +finish sentinel": parts_fns(ws, xs, masks, out, **down, **gemv_tiling, x_tile=True, mask=1,
                                                finish=3),
        "+x +finish sentinel (no mask)": parts_fns(ws, xs, masks, out, **down, **gemv_tiling, x_tile=True, finish=3),
        "+x +mask +finish, 64x128 split 4, 5 stages": parts_fns(ws, xs, masks, out, **down, block_n=64, block_k=128,
                                                                 split=4, stages=5, warps=4, **every_part),
        "+x +mask +finish, 64x128 split 2": parts_fns(ws, xs, masks, out, **down, block_n=64, block_k=128, split=2,
                                                       stages=4, warps=4, **every_part),
        "gemv (library, masked x)": [lambda w=w, x=x, mk=mk: input_groups_gemv(x, w, None, mk, None, None, GROUP)
                                     for w, x, mk in zip(ws, xs, masks)],
        "gemv (library, pre-masked x)": [lambda w=w, x=x, mk=mk: input_groups_gemv(x, w, None, mk, None, None, GROUP,
                                                                                   x_is_masked=True)
                                         for w, x, mk in zip(ws, xs, masks)],
        **{f"gemv {c['BLOCK_N']}x128 split {c['SPLIT']}, {c['num_stages']} stages, {c['num_warps']} warps":
           [lambda w=w, x=x, mk=mk, c=c: input_groups_gemv(x, w, None, mk, None, None, GROUP, config=c)
            for w, x, mk in zip(ws, xs, masks)] for c in GEMV_CONFIGS},
        "read down layout, 32x128 split 1, 12 stages": parts_fns(ws, xs, masks, out, **down, block_n=32,
                                                                  block_k=128, split=1, stages=12, warps=4),
        "+x +mask, 32x128 split 1, 12 stages": parts_fns(ws, xs, masks, out, **down, block_n=32, block_k=128,
                                                          split=1, stages=12, warps=4, x_tile=True, mask=1),
        **{f"{name}, {bn}x128 split {sp}, {st} stages": parts_fns(ws, xs, masks, out, **down, block_n=bn, block_k=128,
                                                                    split=sp, stages=st, warps=wp, **parts)
           for name, parts in (("+x", dict(x_tile=True)), ("+mask", dict(mask=1)),
                               ("+x +mask words", dict(x_tile=True, mask=2)),
                               ("+x +mask words +finish", dict(x_tile=True, mask=2, finish=True)))
           for bn, sp, st, wp in ((32, 1, 12, 4), (32, 1, 8, 4), (16, 1, 12, 4), (64, 2, 6, 4), (128, 4, 4, 8))
           if (sp > 1) == ("finish" in name)},
        **{f"{name}, {bn}x128 split {sp}, {st} stages, rotated": parts_fns(
            ws, xs, masks, out, **down, block_n=bn, block_k=128, split=sp, stages=st, warps=wp, rotate=True, **parts)
           for name, parts in (("read", {}), ("+x", dict(x_tile=True)), ("+x +mask words", dict(x_tile=True, mask=2)),
                               ("+x +mask +finish", dict(x_tile=True, mask=1, finish=True)))
           for bn, sp, st, wp in ((32, 1, 8, 4), (32, 1, 12, 4), (16, 1, 12, 4), (128, 4, 4, 8))
           if (sp > 1) == ("finish" in name) or name == "read"},
        "cublas dense": [lambda w=w, x=x: F.linear(x, w) for w, x in zip(ws, xs)],
        "cublas dense, transposed storage": [lambda wt=wt, x=x: F.linear(x, wt.t()) for wt, x in zip(wts, xs)],
    }
    return timed


def check(ws: list, xs: list, masks: list, mask_mode: int = 1, finish: int = 1, tiling: tuple = (128, 128, 4, 4, 8),
          rotate: bool = False) -> float:
    """The parts kernel with every part on computes the masked product (max abs error against torch, fp32, worst of
    two back-to-back calls on different inputs into a NaN-poisoned output, so a finish that must leave its workspace
    reset is checked on its second call too; x must be pre-masked for ``mask_mode`` 2)."""
    block_t = max(16, triton.next_power_of_2(xs[0].shape[0]))
    out = torch.empty(N_OUT, block_t, device="cuda", dtype=torch.float32)
    fns = parts_fns(ws[:2], xs[:2], masks[:2], out, N_OUT, K_IN, *tiling, x_tile=True, mask=mask_mode,
                    finish=finish if tiling[2] > 1 else 0, rotate=rotate)
    worst = 0.0
    for fn, w, x, mk in zip(fns, ws, xs, masks):
        out.fill_(float("nan"))
        fn()
        ref = (x.float() * mk.float().repeat_interleave(GROUP, dim=1)) @ w.float().t()
        err = (out[:, :x.shape[0]].t() - ref).abs().max()
        worst = max(worst, float("inf") if err.isnan() else float(err))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(37)
    ws = [torch.randn(N_OUT, K_IN, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(COPIES)]
    wts = [w.t().contiguous() for w in ws]
    xs = [torch.randn(args.tokens, K_IN, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(COPIES)]
    masks = [(torch.rand(args.tokens, K_IN // GROUP, device="cuda", generator=gen) < 0.5).to(torch.uint8)
             for _ in range(COPIES)]
    out = torch.empty(max(N_OUT, K_IN) * max(16, triton.next_power_of_2(args.tokens)), device="cuda",
                      dtype=torch.float32)
    xms = [x * mk.to(x.dtype).repeat_interleave(GROUP, dim=1) for x, mk in zip(xs, masks)]
    errs = {f"finish {f}": check(ws, xs, masks, finish=f) for f in (1, 2, 3)}
    errs["mask words"] = check(ws, xms, masks, mask_mode=2)
    errs["mask words rotated, 32 rows split 1"] = check(ws, xms, masks, mask_mode=2, tiling=(32, 128, 1, 8, 4),
                                                         rotate=True)
    errs["finish 1 rotated"] = check(ws, xs, masks, rotate=True)
    err = max(errs.values())
    ceil = ceilings()
    samples = interleaved(variants(ws, wts, xs, masks, out), args.rounds)
    med = {k: statistics.median(v) for k, v in samples.items()}
    union_bytes = statistics.fmean(int(mk.any(0).sum()) for mk in masks) * GROUP * N_OUT * 2
    checks = ", ".join(f"{k} {v:.3g}" for k, v in errs.items())
    print(f"tokens {args.tokens}, union {union_bytes / 1e6:.1f} MB of {N_OUT * K_IN * 2 / 1e6:.1f}; parts check max "
          f"abs err {err:.3g} ({checks}); copy {ceil['copy_TBps']:.2f} TB/s")
    print(f"{'variant':60s} {'µs':>7s} {'TB/s (all bytes)':>17s}")
    for k, v in med.items():
        print(f"{k:60s} {v:7.2f} {N_OUT * K_IN * 2 / (v * 1e-6) / 1e12:17.2f}")
    res = {"meta": {"command": "python3 benchmarks/down_gemv_parts_probe.py " + " ".join(sys.argv[1:]),
                    "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                    "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                    "python": platform.python_version(), "tokens": args.tokens, "rounds": args.rounds,
                    "union_MB": union_bytes / 1e6, "parts_check_max_abs_err": err, "parts_check": errs, **ceil},
           "median_us": med, "samples_us": samples}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
