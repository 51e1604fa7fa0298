"""Benchmark: the decode attention kernel on a half-filled static KV cache, split count x launch config.

This is the shape the end-to-end decode runs (``benchmarks/e2e.py``: 2048 slots, decode from position 1024): the
kernel sees every slot and an explicit boolean mask ``[B, 1, 1, S]`` hiding the unfilled ones, so K/V blocks past the
fill are never loaded but each split program still walks its chunk's mask. Llama-3-8B attention shapes (32 query
heads, 8 KV heads, head dim 128, bf16), one new token, random head-group masks at 50%. Many launches over rotating
q/K/V copies are captured in one CUDA graph; time per call = median replay / calls.

Writes ``<out_dir>/kernels_attention_static.json``. Usage:
``python benchmarks/kernels_attention_static.py [--out-dir benchmarks/results] [--slots 2048] [--batches 1,8,32]``

``--unmasked`` sweeps the kernel target's shape instead: a full cache of ``--slots`` keys with no explicit mask (what
``benchmarks/kernels_attention.py`` times against SDPA), SDPA (flash, ``enable_gqa``) timed in the same graph way
beside it, into ``kernels_attention_unmasked_s<slots>.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

from kernels_attention import HKV, HQ, D, DTYPE, graph_time_per_call, random_mask, versions
from wide_compile.templates.attention_checks import check_attention_inputs
from wide_compile.templates.attention_decode import choose_num_splits, decode_config, launch_decode
from wide_compile.templates.attention_reference import group_attention_reference

SPLITS = (1, 2, 4, 8, 16, 32)
UNMASKED_SPLITS = (4, 8, 16, 32, 64)
CONFIGS = ((64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 4, 3), (32, 4, 3))


def static_inputs(batch: int, slots: int, filled: int):
    """Rotating q/K/V copies (>= 256 MB of K/V) and the static cache's mask: slots ``< filled`` visible (``None``
    when every slot is)."""
    set_bytes = 2 * batch * HKV * slots * D * 2
    copies = max(2, min(64, math.ceil((256 << 20) / set_bytes)))
    qs = [torch.randn(batch, HQ, 1, D, device="cuda", dtype=DTYPE) for _ in range(copies)]
    ks = [torch.randn(batch, HKV, slots, D, device="cuda", dtype=DTYPE) for _ in range(copies)]
    vs = [torch.randn(batch, HKV, slots, D, device="cuda", dtype=DTYPE) for _ in range(copies)]
    amask = (torch.arange(slots, device="cuda") < filled).expand(batch, 1, 1, slots).contiguous()
    return qs, ks, vs, (None if filled >= slots else amask)


def sweep_shape(batch: int, slots: int, filled: int, gen: torch.Generator, splits_list: tuple[int, ...] | None = None,
                configs: tuple[tuple[int, int, int], ...] = CONFIGS) -> list[dict]:
    qs, ks, vs, amask = static_inputs(batch, slots, filled)
    mask = random_mask(batch, 1, 0.5, gen)
    dims = check_attention_inputs(qs[0], ks[0], vs[0], mask, False, None, amask)
    outs = [torch.empty(batch, HQ, 1, D, device="cuda", dtype=DTYPE) for _ in qs]
    ref = group_attention_reference(qs[0].float(), ks[0].float(), vs[0].float(), mask, causal=False,
                                    attn_mask=amask)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    masked = amask is not None
    default_splits, default_chunk = choose_num_splits(batch * HKV, slots, qs[0].device, masked=masked)
    if splits_list is None:
        splits_list = SPLITS if masked else UNMASKED_SPLITS
    candidates = [(None, None)] + [(s, c) for s in splits_list for c in configs]
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
    if not masked:  # the kernel target's baseline, timed the same way
        sdpa = graph_time_per_call([lambda i=i: F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=True)
                                    for i in range(len(qs))], replays=9)
        for row in rows:
            row["sdpa_us"] = sdpa * 1e3
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--slots", type=int, default=2048)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--unmasked", action="store_true", help="every slot filled, no explicit mask, SDPA beside")
    parser.add_argument("--splits", default=None, help="comma list of split counts (default: the mode's list)")
    parser.add_argument("--configs", default=None,
                        help="BLOCK_N/num_warps/num_stages triples, e.g. 128/4/3,64/4/5 (default: CONFIGS)")
    parser.add_argument("--name", default=None, help="output file name (default: by mode and slots)")
    args = parser.parse_args()
    splits_list = tuple(int(s) for s in args.splits.split(",")) if args.splits else None  # None: the mode's list
    configs = tuple(tuple(int(v) for v in c.split("/")) for c in args.configs.split(",")) if args.configs else CONFIGS
    gen = torch.Generator(device="cuda").manual_seed(5)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        shape_rows = sweep_shape(batch, args.slots, args.slots if args.unmasked else args.slots // 2 + 50, gen,
                                 splits_list, configs)
        rows += shape_rows
        default = next(r for r in shape_rows if r["default"])
        best = min((r for r in shape_rows if not r["default"]), key=lambda r: r["us"])
        print(f"B={batch:2d} slots={args.slots}: default {default['us']:.1f} us (splits {default['num_splits']}, "
              f"{default['config']}); best {best['us']:.1f} us (splits {best['num_splits']}, {best['config']}); "
              f"max err {max(r['max_abs_err'] for r in shape_rows):.1e}"
              + (f"; SDPA {default['sdpa_us']:.1f} us: default {default['sdpa_us'] / default['us']:.2f}x, best "
                 f"{default['sdpa_us'] / best['us']:.2f}x" if args.unmasked else ""), flush=True)
        for splits in sorted({r["num_splits"] for r in shape_rows if not r["default"]}):
            line = [f"{r['us']:6.1f}" for r in shape_rows if r["num_splits"] == splits and not r["default"]]
            print(f"   splits {splits:2d}: " + " ".join(line), flush=True)
    os.makedirs(args.out_dir, exist_ok=True)
    name = args.name or (f"kernels_attention_unmasked_s{args.slots}.json" if args.unmasked
                         else "kernels_attention_static.json")
    path = os.path.join(args.out_dir, name)
    with open(path, "w") as f:
        json.dump({"command": "python " + " ".join(sys.argv), "versions": versions(), "configs": configs,
                   "rows": rows}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
