"""Benchmark: the unmasked decode's chunk-count rule against the earlier one, across sparsities, with SDPA beside.

For each (B, S) where the rules differ (and one where they agree, as a control) and each sparsity, in interleaved
rounds: SDPA (flash, ``enable_gqa``), the default rule (``PROGRAMS_PER_SM``), and the same kernel with the chunk
count of other programs-per-SM targets (16: the rule before stop 27) and the launch config ``decode_config`` gives
for that many programs. Llama-3-8B attention shapes, one new token, random head-group masks with exactly the stated
fraction of (batch, KV head) pairs inactive; CUDA-graph replays over rotated q/K/V copies (>= 512 MB of K/V). Times
are medians over rounds of the median replay. Split plus reduction launches are both timed.

Usage (GPU): ``python benchmarks/decode_split_rule.py [--out-dir benchmarks/results] [--rounds 3] [--shapes 16:4096,...]
[--name decode_split_rule.json] [--configs 128/8/3,...] [--sparsities 0.5,0]``. ``--baseline-module M`` also times
the default rule through ``M.launch_decode``
(label "baseline"): with a copy of the previous ``templates/attention_decode.py`` saved as
``templates/attention_decode_prev.py`` (not committed), ``M = wide_compile.templates.attention_decode_prev`` gives an
A/B of a kernel change in one process.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from kernels_attention import HKV, HQ, D, DTYPE, decode_inputs, graph_time_per_call, random_mask, versions
from wide_compile.templates.attention_checks import check_attention_inputs
from wide_compile.templates.attention_decode import PROGRAMS_PER_SM, choose_num_splits, decode_config, launch_decode
from wide_compile.templates.attention_reference import group_attention_reference

SHAPES = ((16, 4096), (4, 16384), (16, 16384), (4, 32768), (16, 32768), (1, 32768), (32, 4096), (4, 4096))
SPARSITIES = (0.0, 0.25, 0.5, 0.7)
OTHER_TARGETS = (16, 4)  # programs per SM: 16 was the default before stop 27


def candidates(batch_kv: int, kv_len: int, sms: int, configs: tuple = ()) -> dict[str, tuple[int, dict]]:
    """label -> (num_splits, launch config) for the default rule and each other programs-per-SM target, and the
    default rule's chunk count with each extra launch config ``(BLOCK_N, num_warps, num_stages)`` of ``configs``."""
    out = {}
    for label, pps in [("default", PROGRAMS_PER_SM)] + [(f"pps{p}", p) for p in OTHER_TARGETS]:
        splits, chunk = choose_num_splits(batch_kv, kv_len, torch.device("cuda"), programs_per_sm=pps)
        out[label] = (splits, decode_config(chunk, splits * batch_kv, sms))
    for block_n, warps, stages in configs:
        out[f"n{block_n}w{warps}s{stages}"] = (out["default"][0],
                                               {"BLOCK_N": block_n, "num_warps": warps, "num_stages": stages})
    return out


def parse_configs(text: str | None) -> tuple:
    """``"128/8/3,64/8/2"`` -> ((128, 8, 3), (64, 8, 2)): BLOCK_N / num_warps / num_stages."""
    if not text:
        return ()
    return tuple(tuple(int(v) for v in item.split("/")) for item in text.split(","))


def bench_shape(batch: int, kv_len: int, rounds: int, gen: torch.Generator, sms: int, baseline=None,
                configs: tuple = (), sparsities: tuple = SPARSITIES) -> list[dict]:
    qs, ks, vs, _ = decode_inputs(batch, kv_len)
    copies = len(qs)
    outs = [torch.empty(batch, HQ, 1, D, device="cuda", dtype=DTYPE) for _ in range(copies)]
    rules = candidates(batch * HKV, kv_len, sms, configs)
    launchers = {label: launch_decode for label in rules}
    if baseline is not None:  # the default rule's launch through another version of the kernels (A/B of a change)
        rules["baseline"], launchers["baseline"] = rules["default"], baseline.launch_decode
    rows = []
    for sp in sparsities:
        mask = random_mask(batch, 1, sp, gen)
        dims = check_attention_inputs(qs[0], ks[0], vs[0], mask, True, None)
        ref = group_attention_reference(qs[0].float(), ks[0].float(), vs[0].float(), mask, causal=True)
        fns, errs = {}, {}
        for label, (splits, cfg) in rules.items():
            def call(i, splits=splits, cfg=cfg, launch=launchers[label]):
                launch(qs[i], ks[i], vs[i], mask, outs[i], dims, True, splits, cfg)
            call(0)
            errs[label] = float((outs[0].float() - ref).abs().max())
            fns[label] = [lambda i=i, call=call: call(i) for i in range(copies)]
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fns["sdpa"] = [lambda i=i: sdpa(qs[i], ks[i], vs[i], enable_gqa=True) for i in range(copies)]
            times = {label: [] for label in fns}
            for _ in range(rounds):
                for label, calls in fns.items():
                    times[label].append(graph_time_per_call(calls, replays=9) * 1e3)
        us = {label: statistics.median(t) for label, t in times.items()}
        row = {"batch": batch, "S": kv_len, "sparsity": sp, "active_pairs": int(mask.sum()), "us": us,
               "rounds_us": times, "max_abs_err": errs,
               "rules": {label: {"num_splits": s, "config": c} for label, (s, c) in rules.items()},
               "speedup_vs_sdpa": {label: us["sdpa"] / us[label] for label in rules}}
        rows.append(row)
        print(f"B={batch:2d} S={kv_len:5d} sp={sp:.2f} SDPA {us['sdpa']:7.1f} | "
              + " | ".join(f"{label} ({rules[label][0]:2d}) {us[label]:7.1f} {us['sdpa'] / us[label]:.2f}x"
                           for label in rules)
              + f" | err {max(errs.values()):.1e}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-module", default=None,
                        help="a module with another version's launch_decode (e.g. a copy of the previous "
                             "attention_decode.py in wide_compile/templates), timed as 'baseline' with the default rule")
    parser.add_argument("--shapes", default=None, help="B:S pairs, e.g. 16:4096,4:16384 (default: SHAPES)")
    parser.add_argument("--name", default="decode_split_rule.json")
    parser.add_argument("--configs", default=None,
                        help="extra launch configs at the default chunk count, BLOCK_N/num_warps/num_stages, "
                             "comma-separated (e.g. 128/8/3,64/8/2)")
    parser.add_argument("--sparsities", default=None, help="comma-separated (default: 0,0.25,0.5,0.7)")
    args = parser.parse_args()
    baseline = importlib.import_module(args.baseline_module) if args.baseline_module else None
    shapes = [tuple(int(v) for v in p.split(":")) for p in args.shapes.split(",")] if args.shapes else SHAPES
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(7)
    rows = []
    for batch, kv_len in shapes:
        rows += bench_shape(batch, kv_len, args.rounds, gen, sms, baseline, parse_configs(args.configs),
                            tuple(float(v) for v in args.sparsities.split(",")) if args.sparsities else SPARSITIES)
        torch.cuda.empty_cache()  # the shape's q / K / V copies are gone with bench_shape's frame
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, args.name)
    with open(path, "w") as f:
        json.dump({"command": "python " + " ".join(sys.argv), "versions": versions(),
                   "programs_per_sm_default": PROGRAMS_PER_SM, "rows": rows}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
