"""Benchmark: the decode attention kernel on a half-filled static KV cache, split count x launch config.

This is the shape the end-to-end decode runs (``benchmarks/e2e.py``: 2048 slots, decode from position 1024): the
kernel sees every slot and an explicit boolean mask ``[B, 1, 1, S]`` hiding the unfilled ones, so K/V blocks past the
fill are never loaded but each split program still walks its chunk's mask. Llama-3-8B attention shapes (32 query
heads, 8 KV heads, head dim 128, bf16), one new token, random head-group masks at 50%. Many launches over rotating
q/K/V copies are captured in one CUDA graph; time per call = median replay / calls.

Writes ``<out_dir>/kernels_attention_static.json``. Usage:
``python benchmarks/kernels_attention_static.py [--out-dir benchmarks/results] [--slots 2048] [--batches 1,8,32]``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

from kernels_attention import HKV, HQ, D, DTYPE, graph_time_per_call, random_mask, versions
from wide_compile.templates.attention_checks import check_attention_inputs
from wide_compile.templates.attention_decode import choose_num_splits, decode_config, launch_decode
from wide_compile.templates.attention_reference import group_attention_reference

SPLITS = (1, 2, 4, 8, 16, 32)
CONFIGS = ((64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 4, 3), (32, 4, 3))


def static_inputs(batch: int, slots: int, filled: int):
    """Rotating q/K/V copies (>= 256 MB of K/V) and the static cache's mask: slots ``< filled`` visible."""
    set_bytes = 2 * batch * HKV * slots * D * 2
    copies = max(2, min(64, math.ceil((256 << 20) / set_bytes)))
    qs = [torch.randn(batch, HQ, 1, D, device="cuda", dtype=DTYPE) for _ in range(copies)]
    ks = [torch.randn(batch, HKV, slots, D, device="cuda", dtype=DTYPE) for _ in range(copies)]
    vs = [torch.randn(batch, HKV, slots, D, device="cuda", dtype=DTYPE) for _ in range(copies)]
    amask = (torch.arange(slots, device="cuda") < filled).expand(batch, 1, 1, slots).contiguous()
    return qs, ks, vs, amask


def sweep_shape(batch: int, slots: int, filled: int, gen: torch.Generator) -> list[dict]:
    qs, ks, vs, amask = static_inputs(batch, slots, filled)
    mask = random_mask(batch, 1, 0.5, gen)
    dims = check_attention_inputs(qs[0], ks[0], vs[0], mask, False, None, amask)
    outs = [torch.empty(batch, HQ, 1, D, device="cuda", dtype=DTYPE) for _ in qs]
    ref = group_attention_reference(qs[0].float(), ks[0].float(), vs[0].float(), mask, causal=False,
                                    attn_mask=amask)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    default_splits, default_chunk = choose_num_splits(batch * HKV, slots, qs[0].device, masked=True)
    candidates = [(None, None)] + [(s, c) for s in SPLITS for c in CONFIGS]
    rows = []
    for splits, cfg in candidates:
        config = None if cfg is None else {"BLOCK_N": cfg[0], "num_warps": cfg[1], "num_stages": cfg[2]}

        def call(i, splits=splits, config=config):
            launch_decode(qs[i], ks[i], vs[i], mask, outs[i], dims, False, splits, config, amask)

        try:
            call(0)
            err = float((outs[0].float() - ref).abs().max())
            ms = graph_time_per_call([lambda i=i: call(i) for i in range(len(qs))], replays=9)
        except Exception as exc:  # noqa: BLE001 - a config that does not compile is a row, not a crash
            print(f"B={batch} splits={splits} {cfg} failed: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
            err, ms = float("nan"), float("nan")
        if splits is None:
            used = {"num_splits": default_splits, "chunk": default_chunk,
                    "config": decode_config(default_chunk, default_splits * batch * HKV, sms)}
        else:
            used = {"num_splits": splits, "config": config}
        rows.append({"batch": batch, "slots": slots, "filled": filled, "default": splits is None, **used,
                     "us": ms * 1e3, "max_abs_err": err})
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--slots", type=int, default=2048)
    parser.add_argument("--batches", default="1,8,32")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(5)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        shape_rows = sweep_shape(batch, args.slots, args.slots // 2 + 50, gen)
        rows += shape_rows
        default = next(r for r in shape_rows if r["default"])
        best = min((r for r in shape_rows if not r["default"]), key=lambda r: r["us"])
        print(f"B={batch:2d} slots={args.slots}: default {default['us']:.1f} us (splits {default['num_splits']}, "
              f"{default['config']}); best {best['us']:.1f} us (splits {best['num_splits']}, {best['config']}); "
              f"max err {max(r['max_abs_err'] for r in shape_rows):.1e}", flush=True)
        for splits in SPLITS:
            line = [f"{r['us']:6.1f}" for r in shape_rows if r["num_splits"] == splits and not r["default"]]
            print(f"   splits {splits:2d}: " + " ".join(line), flush=True)
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "kernels_attention_static.json")
    with open(path, "w") as f:
        json.dump({"command": "python " + " ".join(sys.argv), "versions": versions(), "configs": CONFIGS,
                   "rows": rows}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
