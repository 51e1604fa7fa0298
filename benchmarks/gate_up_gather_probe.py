"""Diagnostic: what the gathered token rows cost the prefill gate/up GEMM (H200, Llama-3-8B shapes, 50% random masks).

Two copies of one minimal Triton kernel (128 x 128 tiles per weight, K steps of 64, 8 warps, 4 stages, weight tiles
by TMA, the activation product in registers, stores of the active tiles only) that differ in one thing: ``GATHER``
loads each tile's ``x`` rows through the group's token list (pointer loads, ``cp.async``: what
``templates/gemm_gated_up.py`` does), the other reads the tile's rows ``tile_start .. tile_start + 127`` as one TMA
box (the wrong rows: a timing-only variant that does the same number of tiles, K steps and MMAs without a gather).
Both are timed beside the library kernel (``gated_up_gemm``, default config) in interleaved rounds of CUDA-graph
replays over rotated weight copies.

    python3 benchmarks/gate_up_gather_probe.py [--tokens 4096] [--rounds 5] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels_attention import graph_time_per_call  # (benchmarks/ is the script's folder)
from wide_compile.templates import build_group_plan
from wide_compile.templates.gemm_gated_up import gated_up_gemm

HIDDEN, INTER, GROUP, BM, BN, BK = 4096, 14336, 128, 128, 128, 64


@triton.jit
def _probe_kernel(x_ptr, x_desc, wg_desc, wu_desc, h_ptr, tokens_ptr, counts_ptr, M, N, K,
                  T_TILES: tl.constexpr, GATHER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PAIRED: tl.constexpr = False, UP_FIRST: tl.constexpr = False):
    """``PAIRED`` (``gate_up_pair_probe.py``): ``wg_desc`` is a ``[2, N, K]`` descriptor over both weights and each K
    step one MMA of ``2 * BLOCK_N`` columns (``UP_FIRST``: the up weight is its first slice)."""
    pid = tl.program_id(0)
    g = pid // T_TILES
    tile_start = (pid % T_TILES) * BLOCK_M
    count = tl.load(counts_ptr + g)
    if tile_start < count:
        offs_m = tile_start + tl.arange(0, BLOCK_M)
        rows = tl.load(tokens_ptr + g.to(tl.int64) * M + offs_m, mask=offs_m < M, other=0).to(tl.int64)
        offs_k = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + rows[:, None] * K + offs_k[None, :]
        n0 = g * BLOCK_N
        if PAIRED:
            acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
            for k in tl.range(0, K, BLOCK_K):
                a = tl.load(x_ptrs + k)
                acc = tl.dot(a, wg_desc.load([0, n0, k]).reshape(2 * BLOCK_N, BLOCK_K).T, acc)
            first, second = acc.reshape(BLOCK_M, 2, BLOCK_N).permute(0, 2, 1).split()
            if UP_FIRST:
                acc_g, acc_u = second, first
            else:
                acc_g, acc_u = first, second
        else:
            acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in tl.range(0, K, BLOCK_K):
                if GATHER:
                    a = tl.load(x_ptrs + k)
                else:
                    a = x_desc.load([tile_start, k])
                bg = wg_desc.load([n0, k]).T
                bu = wu_desc.load([n0, k]).T
                acc_g = tl.dot(a, bg, acc_g)
                acc_u = tl.dot(a, bu, acc_u)
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        h = tl.where((offs_m < count)[:, None], h, 0.0)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        tl.store(h_ptr + rows[:, None] * N + offs_n[None, :], h.to(h_ptr.dtype.element_ty),
                 mask=(offs_m < M)[:, None])


class ProbeInputs:
    """``m`` tokens of bf16 ``x``, three rotated (gate, up) weight pairs of Llama-3-8B's shape, a 50% random mask and
    its per-group token lists, the output ``h`` and the probe kernel's descriptors (shared with
    ``gate_up_pair_probe.py``)."""

    def __init__(self, m: int):
        gen = torch.Generator(device="cuda").manual_seed(0)
        self.m = m
        self.x = torch.randn(m, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
        self.ws = [tuple((torch.randn(INTER, HIDDEN, device="cuda", generator=gen) / HIDDEN**0.5).to(torch.bfloat16)
                         for _ in range(2)) for _ in range(3)]
        self.mask = torch.rand(m, INTER // GROUP, device="cuda", generator=gen) < 0.5
        plan = build_group_plan(self.mask, parts=("output",))
        self.t, self.c = plan.group_tokens, plan.group_counts
        self.h = torch.empty(m, INTER, device="cuda", dtype=torch.bfloat16)
        self.x_desc = TensorDescriptor.from_tensor(self.x, [BM, BK])
        self.descs = [tuple(TensorDescriptor.from_tensor(w, [BN, BK]) for w in pair) for pair in self.ws]
        self.t_tiles = triton.cdiv(m, BM)
        self.active = self.mask.repeat_interleave(GROUP, dim=-1)
        self.flops = 2 * 2 * int(self.mask.sum()) * GROUP * HIDDEN  # gate and up over the active pairs

    def library(self, w, config: dict | None = None) -> torch.Tensor:
        return gated_up_gemm(self.x, w[0], w[1], self.t, self.c, GROUP, "silu", config=config)

    def two_dots(self, d, gather: bool = True) -> None:
        """The minimal kernel (two weight boxes, two MMAs per K step) into ``h``."""
        _probe_kernel[(self.t_tiles * (INTER // GROUP),)](
            self.x, self.x_desc, d[0], d[1], self.h, self.t, self.c, self.m, INTER, HIDDEN, T_TILES=self.t_tiles,
            GATHER=gather, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, num_warps=8, num_stages=4)

    def one_dot(self, pair, stages: int) -> None:
        """The minimal kernel with ``pair`` (``tma_weights.pair_descriptor``'s descriptor and order): one box and one
        MMA per K step, into ``h``."""
        _probe_kernel[(self.t_tiles * (INTER // GROUP),)](
            self.x, self.x_desc, pair[0], pair[0], self.h, self.t, self.c, self.m, INTER, HIDDEN,
            T_TILES=self.t_tiles, GATHER=True, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, PAIRED=True, UP_FIRST=pair[1],
            num_warps=8, num_stages=stages)


def timed_rounds(variants: dict, rounds: int) -> dict:
    """µs per call of each variant (a list of thunks over the rotated weights), ``rounds`` interleaved rounds."""
    samples = {k: [] for k in variants}
    for _ in range(rounds):
        for k, fns in variants.items():
            samples[k].append(graph_time_per_call(fns) * 1e3)
    return samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    inp = ProbeInputs(args.tokens)
    m, ws, descs, h = inp.m, inp.ws, inp.descs, inp.h
    inp.two_dots(descs[0])
    ref = inp.library(ws[0])
    active = inp.active
    err = float((h.float()[active] - ref.float()[active]).abs().max())
    variants = {"library": [lambda w=w: inp.library(w) for w in ws],
                "probe_gather": [lambda d=d: inp.two_dots(d) for d in descs],
                "probe_tma_rows_no_gather": [lambda d=d: inp.two_dots(d, gather=False) for d in descs]}
    samples = timed_rounds(variants, args.rounds)
    flops = inp.flops
    result = {"command": "python3 benchmarks/gate_up_gather_probe.py " + " ".join(sys.argv[1:]),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "tokens": m,
              "probe_gather_max_abs_diff_vs_library_on_active": err, "rounds_us": samples,
              "us": {k: statistics.median(v) for k, v in samples.items()}}
    for k, us in result["us"].items():
        print(f"{k:26s} {us:9.1f} us  {flops / (us * 1e-6) / 1e12:6.0f} TFLOP/s (active pairs)")
    print(f"probe (gather) vs library on active outputs: max |diff| {err:.3e}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
