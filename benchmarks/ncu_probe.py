"""Workloads for Nsight Compute: where the two kernels that miss issue 4's targets spend their time.

Runs each case a few times (warm-up, then the launches ncu profiles), Llama-3-8B shapes, bf16, 50% random masks:

- ``gate_up``: the prefill gate/up GEMM at 4096 tokens (``--tokens``: another count; ``gated_up_groups``, default
  config) and, beside it, cuBLAS on the dense gate weight (the kernel whose tile cuBLAS picks for the dense model);
- ``decode``: the split-KV decode attention at B=16, S=4096 (``launch_decode``, default rule: split + reduce) and
  SDPA (flash, ``enable_gqa``) on the same shape;
- ``gemv``: the one-token GEMVs (``--tokens``: a few-token batch instead; gate/up, down on a pre-masked input, query
  projection; default paths) and cuBLAS's GEMV on the dense down weight.

Usage on the GPU machine (``--clock-control none`` leaves the clocks alone; ``benchmarks/run_ncu_probe.sh`` does it)::

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        --section Occupancy --launch-skip 2 --launch-count 1 -k regex:NAME python3 benchmarks/ncu_probe.py CASE

Not a timing benchmark: ncu serialises and replays every profiled launch.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from wide_compile.templates import build_group_plan, gated_up_groups

HIDDEN, INTER, GROUP, TOKENS = 4096, 14336, 128, 4096
HQ, HKV, D, BATCH, KV_LEN = 32, 8, 128, 16, 4096


def gate_up(repeats: int, tokens: int = TOKENS) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    wg, wu = ((torch.randn(INTER, HIDDEN, device="cuda", generator=gen) / HIDDEN**0.5).to(torch.bfloat16)
              for _ in range(2))
    mask = torch.rand(tokens, INTER // GROUP, device="cuda", generator=gen) < 0.5
    for _ in range(repeats):
        plan = build_group_plan(mask, parts=("output",))
        gated_up_groups(x, wg, wu, mask, GROUP, "silu", plan)
        F.linear(x, wg)
    torch.cuda.synchronize()


def decode(repeats: int) -> None:
    from wide_compile.templates.attention_checks import check_attention_inputs
    from wide_compile.templates.attention_decode import launch_decode

    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(BATCH, HQ, 1, D, device="cuda", generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(BATCH, HKV, KV_LEN, D, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
    mask = torch.rand(BATCH, 1, HKV, device="cuda", generator=gen) < 0.5
    dims = check_attention_inputs(q, k, v, mask, True, None)
    out = torch.empty_like(q)
    for _ in range(repeats):
        launch_decode(q, k, v, mask, out, dims, True)
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.cuda.synchronize()


def gemv(repeats: int, tokens: int = 1) -> None:
    from wide_compile.templates import input_group_linear, output_group_linear

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    wg, wu, wq = ((torch.randn(n, HIDDEN, device="cuda", generator=gen) / HIDDEN**0.5).to(torch.bfloat16)
                  for n in (INTER, INTER, HIDDEN))
    wd = (torch.randn(HIDDEN, INTER, device="cuda", generator=gen) / INTER**0.5).to(torch.bfloat16)
    mask = torch.rand(tokens, INTER // GROUP, device="cuda", generator=gen) < 0.5
    q_mask = torch.rand(tokens, HKV, device="cuda", generator=gen) < 0.5
    h = torch.randn(tokens, INTER, device="cuda", generator=gen).to(torch.bfloat16)
    h = h * mask.repeat_interleave(GROUP, dim=-1)
    for _ in range(repeats):
        gated_up_groups(x, wg, wu, mask, GROUP, "silu", None)
        input_group_linear(h, wd, mask, GROUP, x_is_masked=True)
        output_group_linear(x, wq, q_mask, HIDDEN // HKV)
        F.linear(h, wd)
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case", choices=("gate_up", "decode", "gemv"))
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=0, help="tokens of the gate/up GEMM (default 4096) or of the "
                        "GEMVs (default 1); decode ignores it")
    args = parser.parse_args()
    case = {"gate_up": gate_up, "decode": decode, "gemv": gemv}[args.case]
    if args.tokens and args.case != "decode":
        case(args.repeats, args.tokens)
    else:
        case(args.repeats)


if __name__ == "__main__":
    main()
