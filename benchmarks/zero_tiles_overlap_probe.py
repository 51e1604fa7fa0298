"""Probe: what the prefill output-group GEMMs' zero-only programs cost, and whether a concurrent launch can write
those zeros instead (H200, Llama-3-8B shapes, 50% random masks).

At 50% about half of each GEMM's programs (``gemm_gated_up``, ``gemm_output_groups``) only store zeros: a group's
token tiles past its active count. Each holds a whole SM's shared-memory allocation while it loads its rows and
stores (one program per SM), and stop 21's probe put them at about 5% of the gate/up GEMM at 4096 tokens. Here the
GEMM runs with ``STORE_ZEROS=False`` (those programs exit after their count load) and the zeros come from
``zero_groups.zero_inactive_groups(..., in_place=True)`` (small programs, no shared memory) either on a side stream
forked before the GEMM's plan, so that its programs can share the SMs with the GEMM's, or after the GEMM on the same
stream. Variants, timed in interleaved rounds of CUDA-graph replays over ``--copies`` rotated inputs and weights, each
call building its plan as the library does:

- ``default``: the library call (zeros stored by the GEMM's own programs);
- ``no_zero_tiles``: ``STORE_ZEROS=False`` alone (wrong output: the fully inactive tiles are left unwritten; the
  time a GEMM without those programs' stores would take);
- ``zeros_side_stream``: ``STORE_ZEROS=False`` plus the zeros on a side stream;
- ``zeros_after``: ``STORE_ZEROS=False`` plus the zeros after the GEMM on the same stream.

The two complete variants must equal ``default`` bit for bit (checked on poisoned outputs before timing).

    python3 benchmarks/zero_tiles_overlap_probe.py [--tokens 4096,16384] [--rounds 7] [--copies 3] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_linear import bench_graph  # noqa: E402

from wide_compile.templates import gated_up_groups, output_group_linear  # noqa: E402
from wide_compile.templates.zero_groups import zero_inactive_groups  # noqa: E402

DT = torch.bfloat16
HIDDEN, INTER, FFN_GS, Q_GS = 4096, 14336, 128, 512
NO_ZEROS = {"STORE_ZEROS": False}


class Op:
    """One op's rotated inputs, weights, masks and preallocated outputs."""

    def __init__(self, name: str, tokens: int, copies: int, gen: torch.Generator):
        self.name = name
        n, gs = (INTER, FFN_GS) if name == "gate_up" else (HIDDEN, Q_GS)
        self.gs = gs
        self.x = [torch.randn(tokens, HIDDEN, device="cuda", generator=gen).to(DT) for _ in range(copies)]
        self.m = [torch.rand(tokens, n // gs, device="cuda", generator=gen) < 0.5 for _ in range(copies)]
        scale = HIDDEN ** -0.5
        self.w = [[(torch.randn(n, HIDDEN, device="cuda", generator=gen) * scale).to(DT)
                   for _ in range(2 if name == "gate_up" else 1)] for _ in range(copies)]
        self.out = [torch.empty(tokens, n, device="cuda", dtype=DT) for _ in range(copies)]
        self.side = torch.cuda.Stream()

    def gemm(self, i: int, config: dict | None = None) -> torch.Tensor:
        if self.name == "gate_up":
            return gated_up_groups(self.x[i], *self.w[i], self.m[i], self.gs, path="gemm", config=config,
                                   out=self.out[i])
        return output_group_linear(self.x[i], self.w[i][0], self.m[i], self.gs, path="gemm", config=config,
                                   out=self.out[i])

    def zeros(self, i: int) -> None:
        zero_inactive_groups(self.out[i], self.m[i], self.gs, in_place=True)

    def variant(self, name: str, i: int) -> None:
        if name == "default":
            self.gemm(i)
        elif name == "no_zero_tiles":
            self.gemm(i, NO_ZEROS)
        elif name == "zeros_after":
            self.gemm(i, NO_ZEROS)
            self.zeros(i)
        elif name == "zeros_side_stream":
            main = torch.cuda.current_stream()
            self.side.wait_stream(main)
            with torch.cuda.stream(self.side):
                self.zeros(i)
            self.gemm(i, NO_ZEROS)
            main.wait_stream(self.side)
        else:
            raise ValueError(name)


VARIANTS = ("default", "no_zero_tiles", "zeros_side_stream", "zeros_after")


def check(op: Op) -> dict:
    """Poison, run, compare with the default's output (bit for bit)."""
    op.out[0].fill_(float("nan"))
    op.variant("default", 0)
    want = op.out[0].clone()
    active = op.m[0].repeat_interleave(op.gs, dim=1)
    result = {"default_has_nan": bool(want.isnan().any())}
    for name in VARIANTS[1:]:
        op.out[0].fill_(float("nan"))
        op.variant(name, 0)
        torch.cuda.synchronize()
        got = op.out[0]
        if name == "no_zero_tiles":
            result[name] = bool(torch.equal(got[active], want[active]))
        else:
            result[name] = bool(torch.equal(got, want))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--ops", default="gate_up,q_proj")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    meta = {"command": "python3 benchmarks/zero_tiles_overlap_probe.py " + " ".join(sys.argv[1:]),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        for name in args.ops.split(","):
            op = Op(name, tokens, args.copies, gen)
            same = check(op)
            samples = {v: [] for v in VARIANTS}
            for _ in range(args.rounds):
                for v in VARIANTS:
                    samples[v].append(bench_graph([lambda i=i, v=v: op.variant(v, i) for i in range(args.copies)]))
            med = {v: statistics.median(s) for v, s in samples.items()}
            rows.append({"op": name, "tokens": tokens, "median_us": med, "rounds_us": samples, "equal": same})
            print(f"{name:8s} M={tokens:6d} " + " ".join(f"{v} {med[v]:8.1f}" for v in VARIANTS) + f" equal {same}",
                  flush=True)
            del op
            torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "zero_tiles_overlap_probe.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
