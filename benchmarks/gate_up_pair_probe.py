"""Diagnostic: the prefill gate/up GEMM with one 256-wide MMA per K step instead of two 128-wide ones (H200,
Llama-3-8B shapes, 50% random masks).

Until stop 24 ``templates/gemm_gated_up.py`` loaded a group's gate and up weight tiles through two TMA descriptors and
ran two ``tl.dot`` calls per K step (two m64n128 wgmmas per warpgroup, each reading the same ``x`` tile from shared memory
again). Here one 3-D TMA descriptor (``tma_weights.pair_descriptor``) sees the two weights as ``[2, N, K]``: dimension
0's stride is the distance between the two weights' addresses (they need not share an allocation; TMA only computes
addresses), so one box ``[2, BLOCK_N, BLOCK_K]`` brings both tiles, which Triton 3.6 reshapes in shared memory into one
``[256, BLOCK_K]`` operand of a single m64n256 wgmma; the accumulator is split into its gate and up halves once per
tile (``gate_up_gather_probe._probe_kernel`` with ``PAIRED``). Timed beside the library kernel (default config, which
since stop 24 does this too, and with ``PAIRED=False``: two boxes and two MMAs) and stop 21's minimal two-dot probe
(gathered rows) in interleaved rounds of CUDA-graph replays over rotated weight copies.

    python3 benchmarks/gate_up_pair_probe.py [--tokens 4096] [--rounds 5] [--stages 4,3] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import triton

from gate_up_gather_probe import BK, BN, ProbeInputs, timed_rounds  # (benchmarks/ is the script's folder)
from wide_compile.templates.tma_weights import pair_descriptor


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--stages", default="4,3")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    inp = ProbeInputs(args.tokens)
    ws, h, active = inp.ws, inp.h, inp.active
    pairs = [pair_descriptor(*pair, BN, BK) for pair in ws]
    stage_counts = [int(s) for s in args.stages.split(",")]

    ref = inp.library(ws[0], {"PAIRED": False})
    errors = {}
    for stages in stage_counts:
        h.fill_(float("nan"))
        inp.one_dot(pairs[0], stages)
        errors[f"one_dot_{stages}_stages"] = float((h.float()[active] - ref.float()[active]).abs().max())
    errors["library"] = float((inp.library(ws[0]).float() - ref.float()).abs().max())
    variants = {"library": [lambda w=w: inp.library(w) for w in ws],
                "library_two_boxes": [lambda w=w: inp.library(w, {"PAIRED": False}) for w in ws],
                "two_dots_probe": [lambda d=d: inp.two_dots(d) for d in inp.descs]}
    for stages in stage_counts:
        variants[f"one_dot_{stages}_stages"] = [lambda d=d, s=stages: inp.one_dot(d, s) for d in pairs]
    samples = timed_rounds(variants, args.rounds)
    flops = inp.flops
    result = {"command": "python3 benchmarks/gate_up_pair_probe.py " + " ".join(sys.argv[1:]),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "tokens": inp.m,
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
