"""Diagnostic: the decode attention's two launches (split kernel, then the reduction) with and without programmatic
dependent launch (``WIDE_PDL=1``, ``templates/dependent_launch.py``), against SDPA in the same process.

Stop 21's Nsight Compute run put the B=16, S=4096 row's miss of the 1.8x target (1.68x) on the reduction's launch
(about 6.6 µs of 43.5), not on bandwidth. With PDL the reduction may be scheduled while the split kernel's last
programs run. Shapes of ``kernels_attention.py``'s decode table where B x S >= 64k and two below; 50% random
head-group masks; each variant timed as in that benchmark (CUDA-graph replays over rotated q / K / V copies, >= 512 MB
of K / V), in interleaved rounds (SDPA, PDL off, PDL on, ...); medians and speed-ups over SDPA. Outputs of both
variants are compared (they run the same kernels; must be equal).

    python3 benchmarks/decode_pdl_probe.py [--rounds 5] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from kernels_attention import HKV, HQ, D, DTYPE, decode_inputs, graph_time_per_call, random_mask, versions
from wide_compile.templates.attention import group_attention

SHAPES = ((16, 4096), (4, 16384), (16, 16384), (4, 32768), (16, 32768), (16, 1024), (1, 4096))


def with_pdl(on: bool, fn):
    prev = os.environ.get("WIDE_PDL")
    os.environ["WIDE_PDL"] = "1" if on else "0"
    try:
        return fn()
    finally:
        if prev is None:
            os.environ.pop("WIDE_PDL")
        else:
            os.environ["WIDE_PDL"] = prev


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "decode_pdl_probe.json"))
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(1)
    rows = []
    for b, s in SHAPES:
        qs, ks, vs, _ = decode_inputs(b, s)
        copies = len(qs)
        mask = random_mask(b, 1, 0.5, gen)
        outs = {on: [torch.empty(b, HQ, 1, D, device="cuda", dtype=DTYPE) for _ in range(copies)]
                for on in (False, True)}
        for on in (False, True):
            with_pdl(on, lambda: group_attention(qs[0], ks[0], vs[0], mask, out=outs[on][0]))  # compile
        samples = {"sdpa": [], "pdl_off": [], "pdl_on": []}
        for _ in range(args.rounds):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                samples["sdpa"].append(graph_time_per_call(
                    [lambda i=i: sdpa(qs[i], ks[i], vs[i], enable_gqa=True) for i in range(copies)]))
            for on in (False, True):
                calls = [lambda i=i, on=on: group_attention(qs[i], ks[i], vs[i], mask, out=outs[on][i])
                         for i in range(copies)]
                samples["pdl_on" if on else "pdl_off"].append(with_pdl(on, lambda: graph_time_per_call(calls)))
        med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
        equal = all(torch.equal(a, c) for a, c in zip(outs[False], outs[True]))
        row = {"batch": b, "S": s, "sparsity": 0.5, "copies": copies, **{f"{k}_us": v for k, v in med.items()},
               "rounds_us": {k: [t * 1e3 for t in v] for k, v in samples.items()},
               "speedup_pdl_off": med["sdpa"] / med["pdl_off"], "speedup_pdl_on": med["sdpa"] / med["pdl_on"],
               "outputs_equal": equal}
        rows.append(row)
        print(f"B={b:2d} S={s:6d}: sdpa {med['sdpa']:7.1f} us | PDL off {med['pdl_off']:7.1f} "
              f"({row['speedup_pdl_off']:.2f}x) | PDL on {med['pdl_on']:7.1f} ({row['speedup_pdl_on']:.2f}x) | "
              f"equal {equal}", flush=True)
        del qs, ks, vs, outs
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"command": f"python3 benchmarks/decode_pdl_probe.py --rounds {args.rounds}",
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "versions": versions(), "rows": rows},
                  f, indent=1)


if __name__ == "__main__":
    main()
