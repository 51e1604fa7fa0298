"""The per-list scans of a prefill: step size and warps (``templates/list_scan.py``), H200.

Times ``group_plan._group_token_lists`` (per-group token lists of the gate/up and query GEMMs: 112 FFN groups, 8
attention groups) and ``attention_compact.compact_active_rows`` (the prefill attention's row order of one sequence, 8
groups) on 50% random float masks, for each ``BLOCK`` cap and warp count of the one-kernel build, and in two chunked
passes (``group_lists_two_pass``); each configuration's tables are checked against the default's. µs per call: median
CUDA-graph replay of 8 calls on distinct masks back to back (the masks are small and stay in L2, as the router's
freshly written mask does in the model).

Usage: ``python3 benchmarks/kernels_group_lists.py [--out DIR] [--tokens 1024,4096,16384] [--two-pass-only]
[--name kernels_group_lists.json]``
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_linear import bench_graph  # noqa: E402

from wide_compile.templates.attention_compact import compact_active_rows  # noqa: E402
from wide_compile.templates.group_plan import _group_token_lists  # noqa: E402

CAPS = (1024, 2048, 4096, 8192)
KEYS = ("max_block", "num_warps", "two_pass", "tile_elements", "offsets_pass")  # a configuration's printed keys
WARPS = (4, 8, 16)
COPIES = 8


def configs(tokens: int, kind: str = "lists", two_pass_only: bool = False) -> list[dict]:
    """The one-kernel build's step caps and warps (with ``two_pass_only`` only its default step), and the chunked
    two-pass build (``group_lists_two_pass``) with 4096-element chunk tiles (the token lists also with 8192), each
    with the chunks' offsets summed in the lists pass and from an offsets pass of their own (stop 35); the
    compaction builds one sequence's order with it since stop 35."""
    if two_pass_only:
        one = [dict(two_pass=False)]
    else:
        one = [dict(max_block=cap, num_warps=w, two_pass=False) for cap in CAPS for w in WARPS
               if cap <= max(1024, 2 * tokens)]
    return one + [dict(two_pass=True, tile_elements=t, offsets_pass=o)
                  for t in ((4096, 8192) if kind == "lists" else (4096,)) for o in (False, True)]


def sweep(tokens: int, groups: int, kind: str, gen: torch.Generator, two_pass_only: bool = False) -> list[dict]:
    masks = [(torch.rand(tokens, groups, generator=gen) < 0.5).float().cuda() for _ in range(COPIES)]
    if kind == "lists":
        call = lambda m, scan=None: _group_token_lists(m, scan)  # noqa: E731
    else:
        call = lambda m, scan=None: compact_active_rows(m.unsqueeze(0), scan)  # noqa: E731
    ref = call(masks[0])
    default = bench_graph([lambda m=m: call(m) for m in masks])
    rows = []
    for cfg in configs(tokens, kind, two_pass_only):
        out = call(masks[0], cfg)
        same = all(torch.equal(a, b) for a, b in zip(out, ref))
        us = bench_graph([lambda m=m, cfg=cfg: call(m, cfg) for m in masks])
        rows.append({"kind": kind, "M": tokens, "G": groups, **cfg, "us": us, "default_us": default, "same": same})
    best = min(rows, key=lambda r: r["us"])
    print(f"{kind} M={tokens} G={groups}: default {default:.2f} us; best {best['us']:.2f} us with "
          f"{ {k: v for k, v in best.items() if k in KEYS} }; "
          + "; ".join(f"{r.get('tile_elements')}-element chunks{' + offsets pass' if r.get('offsets_pass') else ''} "
                      f"{r['us']:.2f}" for r in rows if r.get("two_pass"))
          + f"; all equal: {all(r['same'] for r in rows)}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--tokens", default="1024,4096,16384")
    parser.add_argument("--two-pass-only", action="store_true", help="time only the one-kernel build at its "
                        "default step and the chunked two-pass build, of the token lists and of the compaction")
    parser.add_argument("--name", default="kernels_group_lists.json")
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    meta = {"command": "python3 benchmarks/kernels_group_lists.py " + " ".join(sys.argv[1:]),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        for kind, groups in (("lists", 112), ("lists", 8), ("compact", 8)):
            rows += sweep(tokens, groups, kind, gen, args.two_pass_only)
            with open(os.path.join(args.out, args.name), "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
