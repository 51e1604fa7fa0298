"""Benchmark: the input-group decode GEMV on the row-major weight vs the same weight blocked by input group.

A token's active input groups are column ranges of ``W[N, K]``: in the row layout every group is N separate runs of
``group_size * 2`` bytes (256 B for the FFN's 128-channel groups), one per weight row; blocked (``[G, N, group_size]``,
``templates/gemv_decode.block_by_input_groups``) a group is one contiguous run. This measures what the layout costs
in HBM efficiency, Llama-3-8B down and o_proj shapes, random masks, bf16, CUDA-graph replays over rotating weights.
Also times cuBLAS dense and the kernel with every group active in both layouts. Bytes counted: the union of the active
groups' columns.

Usage: ``python benchmarks/kernels_input_layout.py [--out-dir benchmarks/results] [--ms 1,4] [--splits 2,4,8]``
Writes ``kernels_input_layout.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from kernels_linear import DT, OPS, bench_graph, rotations_for
from kernels_attention import versions
from wide_compile.templates.gemv_decode import block_by_input_groups, input_groups_gemv
from wide_compile.templates.group_linear_reference import input_group_linear_reference


def time_case(op: str, m: int, active: float, splits: list[int], gen: torch.Generator) -> list[dict]:
    cfg = OPS[op]
    n, k, gs = cfg["N"], cfg["K"], cfg["gs"]
    g = k // gs
    reps = rotations_for(op, m)
    ws = [torch.randn(n, k, device="cuda", dtype=DT) / 64 for _ in range(reps)]
    blocked = [block_by_input_groups(w, gs) for w in ws]
    x = torch.randn(m, k, device="cuda", dtype=DT)
    mask = torch.rand(m, g, generator=gen, device="cuda") < active
    mask_rows = mask.to(torch.uint8)
    union = int(mask.any(0).sum())
    nbytes = union * gs * n * 2
    ref = input_group_linear_reference(x, ws[0], mask, gs).float()
    outs = [torch.empty(m, n, device="cuda", dtype=DT) for _ in range(reps)]
    rows = [{"op": op, "M": m, "active": active, "union_groups": union, "groups": g, "variant": "cublas_dense",
             "us": bench_graph([lambda i=i: torch.matmul(x, ws[i].t(), out=outs[i]) for i in range(reps)])}]
    for split in splits:
        for layout, weights in (("rows", ws), ("blocked", blocked)):
            conf = {"SPLIT": split}

            def call(i, weights=weights, conf=conf):
                input_groups_gemv(x, weights[i], None, mask_rows, None, None, gs, config=conf, out=outs[i])

            call(0)
            err = float((outs[0].float() - ref).abs().max())
            us = bench_graph([lambda i=i: call(i) for i in range(reps)])
            rows.append({"op": op, "M": m, "active": active, "union_groups": union, "groups": g,
                         "variant": f"{layout}_split{split}", "us": us, "TBps": nbytes / (us * 1e-6) / 1e12,
                         "max_abs_err": err})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--ms", default="1,4")
    parser.add_argument("--splits", default="2,4,8")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(11)
    splits = [int(s) for s in args.splits.split(",")]
    rows = []
    for op in ("down", "o_proj"):
        for m in (int(v) for v in args.ms.split(",")):
            for active in (0.5, 1.0):
                case = time_case(op, m, active, splits, gen)
                rows += case
                dense = case[0]["us"]
                line = " ".join(f"{r['variant']} {r['us']:.1f} ({r['TBps']:.2f} TB/s)" for r in case[1:])
                print(f"{op} M={m} active={active} union={case[1]['union_groups']}/{case[1]['groups']}: "
                      f"cuBLAS {dense:.1f} us | {line} | max err {max(r['max_abs_err'] for r in case[1:]):.1e}",
                      flush=True)
            torch.cuda.empty_cache()
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "kernels_input_layout.json")
    with open(path, "w") as f:
        json.dump({"command": "python " + " ".join(sys.argv), "versions": versions(), "rows": rows}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
