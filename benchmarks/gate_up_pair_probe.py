"""Diagnostic: the prefill gate/up GEMM with one 256-wide MMA per K step instead of two 128-wide ones (H200,
Llama-3-8B shapes, 50% random masks).

Until stop 24 ``templates/gemm_gated_up.py`` loaded a group's gate and up weight tiles through two TMA descriptors and
ran two ``tl.dot`` calls per K step (two m64n128 wgmmas per warpgroup, each reading the same ``x`` tile from shared memory
again). Here one 3-D TMA descriptor sees the two weights as ``[2, N, K]``: dimension 0's stride is the distance
between the two weights' addresses (they need not share an allocation; TMA only computes addresses), so one box
``[2, BLOCK_N, BLOCK_K]`` brings both tiles, which Triton 3.6 reshapes in shared memory into one ``[256, BLOCK_K]``
operand of a single m64n256 wgmma; the accumulator is split into its gate and up halves once per tile. Timed beside
the library kernel (default config, which since stop 24 does this too (``PAIRED``), and with ``PAIRED=False``: two boxes
and two MMAs) and stop 21's minimal two-dot probe (``gate_up_gather_probe._probe_kernel``,
gathered rows) in interleaved rounds of CUDA-graph replays over rotated weight copies.

    python3 benchmarks/gate_up_pair_probe.py [--tokens 4096] [--rounds 5] [--out FILE]
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

from gate_up_gather_probe import BK, BM, BN, GROUP, HIDDEN, INTER, _probe_kernel  # (benchmarks/ is the script's folder)
from kernels_attention import graph_time_per_call
from wide_compile.templates import build_group_plan
from wide_compile.templates.gemm_gated_up import gated_up_gemm


@triton.jit
def _pair_kernel(x_ptr, wgu_desc, h_ptr, tokens_ptr, counts_ptr, M, N, K,
                 T_TILES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, UP_FIRST: tl.constexpr):
    pid = tl.program_id(0)
    g = pid // T_TILES
    tile_start = (pid % T_TILES) * BLOCK_M
    count = tl.load(counts_ptr + g)
    if tile_start < count:
        offs_m = tile_start + tl.arange(0, BLOCK_M)
        rows = tl.load(tokens_ptr + g.to(tl.int64) * M + offs_m, mask=offs_m < M, other=0).to(tl.int64)
        offs_k = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + rows[:, None] * K + offs_k[None, :]
        acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
        n0 = g * BLOCK_N
        for k in tl.range(0, K, BLOCK_K):
            a = tl.load(x_ptrs + k)
            b = wgu_desc.load([0, n0, k]).reshape(2 * BLOCK_N, BLOCK_K).T
            acc = tl.dot(a, b, acc)
        first, second = acc.reshape(BLOCK_M, 2, BLOCK_N).permute(0, 2, 1).split()
        if UP_FIRST:
            acc_g, acc_u = second, first
        else:
            acc_g, acc_u = first, second
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        h = tl.where((offs_m < count)[:, None], h, 0.0)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        tl.store(h_ptr + rows[:, None] * N + offs_n[None, :], h.to(h_ptr.dtype.element_ty),
                 mask=(offs_m < M)[:, None])


def pair_descriptor(w_gate: torch.Tensor, w_up: torch.Tensor) -> tuple[TensorDescriptor, bool]:
    """One ``[2, N, K]`` descriptor over two separate ``[N, K]`` weights (base: the lower address) and whether the up
    weight comes first."""
    up_first = w_up.data_ptr() < w_gate.data_ptr()
    lo, hi = (w_up, w_gate) if up_first else (w_gate, w_up)
    delta = (hi.data_ptr() - lo.data_ptr()) // lo.element_size()
    n, k = lo.shape
    return TensorDescriptor(lo, [2, n, k], [delta, k, 1], [2, BN, BK]), up_first


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--stages", default="4,3")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    m = args.tokens
    x = torch.randn(m, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    ws = [tuple((torch.randn(INTER, HIDDEN, device="cuda", generator=gen) / HIDDEN**0.5).to(torch.bfloat16)
                for _ in range(2)) for _ in range(3)]
    mask = torch.rand(m, INTER // GROUP, device="cuda", generator=gen) < 0.5
    plan = build_group_plan(mask, parts=("output",))
    t, c = plan.group_tokens, plan.group_counts
    h = torch.empty(m, INTER, device="cuda", dtype=torch.bfloat16)
    x_desc = TensorDescriptor.from_tensor(x, [BM, BK])
    descs = [tuple(TensorDescriptor.from_tensor(w, [BN, BK]) for w in pair) for pair in ws]
    pairs = [pair_descriptor(*pair) for pair in ws]
    t_tiles = triton.cdiv(m, BM)
    grid = (t_tiles * (INTER // GROUP),)

    def two_dots(d) -> None:
        _probe_kernel[grid](x, x_desc, d[0], d[1], h, t, c, m, INTER, HIDDEN, T_TILES=t_tiles, GATHER=True,
                            BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, num_warps=8, num_stages=4)

    def one_dot(d, stages: int) -> None:
        _pair_kernel[grid](x, d[0], h, t, c, m, INTER, HIDDEN, T_TILES=t_tiles, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
                           UP_FIRST=d[1], num_warps=8, num_stages=stages)

    ref = gated_up_gemm(x, ws[0][0], ws[0][1], t, c, GROUP, "silu", config={"PAIRED": False})
    active = mask.repeat_interleave(GROUP, dim=-1)
    errors = {}
    for stages in [int(s) for s in args.stages.split(",")]:
        h.fill_(float("nan"))
        one_dot(pairs[0], stages)
        errors[f"one_dot_{stages}_stages"] = float((h.float()[active] - ref.float()[active]).abs().max())
    errors["library"] = float((gated_up_gemm(x, ws[0][0], ws[0][1], t, c, GROUP, "silu").float() - ref.float())
                              .abs().max())
    variants = {"library": [lambda w=w: gated_up_gemm(x, w[0], w[1], t, c, GROUP, "silu") for w in ws],
                "library_two_boxes": [lambda w=w: gated_up_gemm(x, w[0], w[1], t, c, GROUP, "silu",
                                                                config={"PAIRED": False}) for w in ws],
                "two_dots_probe": [lambda d=d: two_dots(d) for d in descs]}
    for stages in [int(s) for s in args.stages.split(",")]:
        variants[f"one_dot_{stages}_stages"] = [lambda d=d, s=stages: one_dot(d, s) for d in pairs]
    samples = {k: [] for k in variants}
    for _ in range(args.rounds):
        for k, fns in variants.items():
            samples[k].append(graph_time_per_call(fns) * 1e3)  # µs per call
    flops = 2 * 2 * int(mask.sum()) * GROUP * HIDDEN
    result = {"command": "python3 benchmarks/gate_up_pair_probe.py " + " ".join(sys.argv[1:]),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "tokens": m,
              "max_abs_diff_vs_library_on_active": errors, "rounds_us": samples,
              "us": {k: statistics.median(v) for k, v in samples.items()}}
    for k, us in result["us"].items():
        print(f"{k:20s} {us:9.1f} us  {flops / (us * 1e-6) / 1e12:6.0f} TFLOP/s (active pairs)")
    print("max |diff| vs library on active outputs:", errors)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
