"""Benchmark: the prefill attention kernel on the end-to-end prefill's layout, launch config by launch config.

``benchmarks/e2e.py`` prefills a static KV cache of ``T + 64`` slots: the kernel gets an explicit boolean mask
``[1, 1, T, S]`` (causal over the filled slots, the rest hidden) with its row extents computed once per forward,
queries and output token-major (``[B, T, H, D]`` memory seen as ``[B, H, T, D]``), K/V as the cache ``[B, Hkv, S, D]``.
Until stop 14 the launch configuration was chosen from ``max(T, S)``, so at T = 4096 the e2e prefill took the
128-row tiles of longer sequences while the isolated causal benchmark (``kernels_attention.py``, S = T) took 64-row
tiles; with a mask it is now chosen from T (``attention_prefill.prefill_config``). This
times every configuration of ``attention_prefill.SWEEP_CONFIGS`` and ``PACKED_SWEEP_CONFIGS`` (query heads of a group
packed into one tile) on that layout (Llama-3-8B attention shapes, 50%
random head-group masks), checks each against the default's output, and writes
``<out_dir>/kernels_attention_prefill_static.json`` (``--name``: another file name).

Usage: ``python benchmarks/kernels_attention_prefill_static.py [--out-dir DIR] [--lengths 1024,4096,16384] [--tma]
[--heads-first] [--active-first] [--skip-mask-pass] [--default-only]`` (``--tma``: every configuration also with K /
V blocks loaded as TMA boxes; ``--heads-first``: also with the grid's heads dimension first, ``HEADS_FIRST``;
``--active-first``: also with the zero-only tiles last, ``ACTIVE_FIRST``; ``--skip-mask-pass``: also without the
explicit mask's second launch, a timing probe.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_attention import HKV, HQ, D, DTYPE, graph_time_per_call, random_mask, versions  # noqa: E402

from wide_compile.templates.attention_checks import check_attention_inputs  # noqa: E402
from wide_compile.templates.attention_mask_extents import attn_mask_extents  # noqa: E402
from wide_compile.templates.attention_prefill import (  # noqa: E402
    PACKED_SWEEP_CONFIGS, SWEEP_CONFIGS, launch_prefill, prefill_config,
)

EXTRA_SLOTS = 64


def static_prefill_inputs(q_len: int, copies: int, gen: torch.Generator):
    """``copies`` rotating (q, k, v, out) sets in the e2e layouts, the static cache's mask and its extents."""
    slots = q_len + EXTRA_SLOTS
    sets = []
    for _ in range(copies):
        q = torch.randn(1, q_len, HQ, D, device="cuda", dtype=DTYPE, generator=gen).transpose(1, 2)
        k = torch.randn(1, HKV, slots, D, device="cuda", dtype=DTYPE, generator=gen)
        v = torch.randn(1, HKV, slots, D, device="cuda", dtype=DTYPE, generator=gen)
        out = torch.empty(1, q_len, HQ, D, device="cuda", dtype=DTYPE).transpose(1, 2)
        sets.append((q, k, v, out))
    keys = torch.arange(slots, device="cuda")
    mask = (keys[None, :] <= torch.arange(q_len, device="cuda")[:, None])[None, None]  # [1, 1, T, S]
    return sets, mask, attn_mask_extents(mask, slots)


def first_pass_only(q, k, v, head_mask, out, dims, cfg, mask, ext) -> None:
    """``launch_prefill`` without its second launch (``TILE_MASK=True``, the mask-tile pass): a timing probe only,
    correct where every row of the mask is contiguous (the causal mask here)."""
    import wide_compile.templates.attention_prefill as prefill

    real = prefill._prefill_kernel

    class FirstPass:
        def __getitem__(self, grid):
            def run(*a, **meta):
                if not meta["TILE_MASK"]:
                    real[grid](*a, **meta)
            return run

    prefill._prefill_kernel = FirstPass()
    try:
        launch_prefill(q, k, v, head_mask, out, dims, False, cfg, attn_mask=mask, attn_mask_extents=ext)
    finally:
        prefill._prefill_kernel = real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--name", default="kernels_attention_prefill_static.json", help="result file in --out-dir")
    parser.add_argument("--tma", action="store_true", help="also time every configuration with K / V loaded as TMA "
                        "boxes (config TMA=True)")
    parser.add_argument("--heads-first", action="store_true", help="also time every configuration with the grid's "
                        "heads dimension first (config HEADS_FIRST=True: longest tiles first over all heads)")
    parser.add_argument("--active-first", action="store_true", help="also time every configuration with the tiles "
                        "past every group's count (zeros only) launched last (config ACTIVE_FIRST=True)")
    parser.add_argument("--skip-mask-pass", action="store_true", help="timing probe: also time each configuration "
                        "without the explicit mask's second launch (the mask-tile pass; its programs all exit on this "
                        "causal mask), to price that launch")
    parser.add_argument("--default-only", action="store_true", help="time only the default configuration (and its "
                        "--tma / --heads-first / --active-first / --skip-mask-pass variants)")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for q_len in (int(v) for v in args.lengths.split(",")):
        copies = max(1, min(8, (256 << 20) // (2 * (q_len + EXTRA_SLOTS) * HKV * D * 2)))
        sets, mask, ext = static_prefill_inputs(q_len, copies, gen)
        head_mask = random_mask(1, q_len, 0.5, gen)
        q0, k0, v0, _ = sets[0]
        dims = check_attention_inputs(q0, k0, v0, head_mask, False, None, mask, ext)
        default = prefill_config(q_len, q_len + EXTRA_SLOTS, D, masked=True)
        keys = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "H_PACK")
        configs = [default] + ([] if args.default_only else
                               [dict(zip(keys, c)) for c in SWEEP_CONFIGS + PACKED_SWEEP_CONFIGS])
        if args.tma:
            configs += [{**cfg, "TMA": True} for cfg in configs]
        if args.heads_first:
            configs += [{**cfg, "HEADS_FIRST": True} for cfg in configs]
        if args.active_first:
            configs += [{**cfg, "ACTIVE_FIRST": True} for cfg in configs]
        if args.skip_mask_pass:
            configs += [{**cfg, "SKIP_MASK_PASS": True} for cfg in configs]

        def call(s, cfg):
            q, k, v, out = s
            cfg = dict(cfg)
            if cfg.pop("SKIP_MASK_PASS", False):
                return lambda: first_pass_only(q, k, v, head_mask, out, dims, cfg, mask, ext)
            return lambda: launch_prefill(q, k, v, head_mask, out, dims, False, cfg, attn_mask=mask,
                                          attn_mask_extents=ext)

        call(sets[0], default)()
        expected = sets[0][3].float().clone()
        for cfg in configs:
            try:
                sets[0][3].fill_(float("nan"))
                call(sets[0], cfg)()
                err = (sets[0][3].float() - expected).abs().max().item()
                ms = graph_time_per_call([call(s, cfg) for s in sets])
            except Exception as e:  # a configuration that does not fit: report, go on
                ms = err = float("nan")
                print(f"  config {cfg} failed: {type(e).__name__}: {str(e)[:100]}", flush=True)
            rows.append({"T": q_len, "S": q_len + EXTRA_SLOTS, **cfg, "default": cfg is default, "ms": ms,
                         "max_abs_err_vs_default": err})
            print(f"T={q_len:6d} {'default ' if cfg is default else ''}{cfg}: {ms:.4f} ms (err {err:.1e})", flush=True)
    os.makedirs(args.out_dir, exist_ok=True)
    result = {"command": "python3 benchmarks/kernels_attention_prefill_static.py " + " ".join(sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "versions": versions(), "rows": rows}
    with open(os.path.join(args.out_dir, args.name), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
