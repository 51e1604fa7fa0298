"""The fused router decision (``templates/router_mask.py``) vs the unfused PyTorch path, Llama-3-8B and SmolLM2 router
shapes.

    python3 benchmarks/kernels_router.py --out benchmarks/results [--sweep-decode]

A router maps ``x[M, H]`` (bf16 residual) to ``mask[M, G]`` through ``h = x W_in^T + b_in`` (R = 32) and two logit
columns per group: Llama-3-8B H = 4096 with G = 8 attention groups and 112 FFN groups, SmolLM2-135M H = 576 with
G = 3 and 12. "unfused" is what the model runs without the
lowering (``router_mask_reference``: fp32 cast of x, cuBLAS fp32 GEMM / GEMV x2, compare: several kernels); "fused"
is the template with its defaults (at M > 16 with bf16 x: W_in split in bf16 parts on tensor cores, two since
stop 15; see the template's docstring); "fused fp32" forces its fp32 FMA path (``W_SPLIT3 = False``), the only path of the last
measured version. Times: median µs of CUDA-graph replays, each replay running the op on rotated copies of x and the
weights (>= 150 MB, so L2 does not hold them, as in a model where other layers run in between), per call.
Decisions: fraction of (token, group) pairs where the fused mask differs from the unfused one (near-ties only).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_linear import bench_graph  # noqa: E402

from wide_compile.templates.router_mask import router_mask, split_router_weights  # noqa: E402
from wide_compile.templates.router_mask_reference import router_mask_reduction, router_mask_reference  # noqa: E402
from wide_compile.templates.router_one_token import router_one_token  # noqa: E402

RANK = 32
DEVICE = "cuda"
TOKENS = (1, 2, 8, 32, 64, 256, 1024, 4096, 16384)
SHAPES = ((4096, 8), (4096, 112), (576, 3), (576, 12))  # (H, G)
DECODE_SWEEP = [dict(SPLIT=split, BLOCK_K=block_k) for split in (1, 2, 4, 8, 16, 32, 64) for block_k in (64, 128, 256)]
VARIANTS = {
    "unfused": lambda x, w: router_mask_reference(x, *w),
    "fused": lambda x, w: router_mask(x, *w),
    "fused_fp32": lambda x, w: router_mask(x, *w, config={"W_SPLIT3": False}),
}


def make_weights(hidden: int, groups: int, gen: torch.Generator) -> list[torch.Tensor]:
    w_in = torch.randn(RANK, hidden, generator=gen) / hidden**0.5
    b_in = torch.randn(RANK, generator=gen) * 0.1
    w_out = torch.randn(2 * groups, RANK, generator=gen) / RANK**0.5
    b_out = torch.zeros(2 * groups)
    return [t.to(DEVICE) for t in (w_in, b_in, w_out, b_out)]


def operands(m: int, hidden: int, groups: int, gen: torch.Generator) -> tuple[list, list]:
    """Rotated copies of x and the router weights, >= 150 MB in all (at most 320 copies)."""
    rotations = max(1, min(320, (150 << 20) // (m * hidden * 2 + RANK * hidden * 4)))
    xs = [torch.randn(m, hidden, generator=gen).to(DEVICE, torch.bfloat16) for _ in range(rotations)]
    return xs, [make_weights(hidden, groups, gen) for _ in range(rotations)]


def measure(m: int, hidden: int, groups: int, gen: torch.Generator) -> dict:
    xs, ws = operands(m, hidden, groups, gen)
    row = {"M": m, "H": hidden, "G": groups, "rotations": len(xs)}
    ref = router_mask_reference(xs[0], *ws[0])
    for name, fn in VARIANTS.items():
        row[f"{name}_us"] = bench_graph([lambda x=x, w=w, fn=fn: fn(x, w) for x, w in zip(xs, ws)])
        row[f"{name}_differ"] = (fn(xs[0], ws[0]) != ref).float().mean().item()
    row["speedup"] = row["unfused_us"] / row["fused_us"]
    return row


def sweep_decode(gen: torch.Generator, path: str, meta: dict, tokens: tuple[int, ...] = (1, 2, 8)) -> list[dict]:
    """The fused kernel's decode configurations (SPLIT programs over H, BLOCK_K) at few tokens, every router shape;
    beside each, the unfused path eagerly and both PyTorch forms compiled by Inductor as the model's graph would run
    them (``unfused_compiled``: the matmul form; ``reduction_compiled``: ``router_mask_reduction``, the backend's
    ``wide.one_token_routers="reduction"``). The rows so far are written to ``path`` after every shape (a run cut short
    keeps them)."""
    rows = []
    for hidden, groups in SHAPES:
        for m in tokens:
            xs, ws = operands(m, hidden, groups, gen)
            base = bench_graph([lambda x=x, w=w: router_mask_reference(x, *w) for x, w in zip(xs, ws)])
            torch._dynamo.reset()  # one compile per shape: past Dynamo's recompile limit a function would run eagerly
            compiled = {"unfused_compiled_us": torch.compile(router_mask_reference, dynamic=False),
                        "reduction_compiled_us": torch.compile(router_mask_reduction, dynamic=False)}
            forms = {name: bench_graph([lambda x=x, w=w, fn=fn: fn(x, *w) for x, w in zip(xs, ws)])
                     for name, fn in compiled.items()}
            for cfg in DECODE_SWEEP:
                if cfg["SPLIT"] * cfg["BLOCK_K"] > 2 * hidden + cfg["BLOCK_K"]:
                    continue  # the split would be clamped to a smaller one
                us = bench_graph([lambda x=x, w=w: router_mask(x, *w, config=cfg) for x, w in zip(xs, ws)])
                rows.append({"M": m, "H": hidden, "G": groups, **cfg, "fused_us": us, "unfused_us": base, **forms})
            best = min((r for r in rows if (r["M"], r["H"], r["G"]) == (m, hidden, groups)),
                       key=lambda r: r["fused_us"])
            print(f"sweep H={hidden} G={groups} M={m}: unfused {base:.1f} us (compiled "
                  f"{forms['unfused_compiled_us']:.1f}, reduction form compiled {forms['reduction_compiled_us']:.1f}), "
                  f"best fused {best['fused_us']:.1f} us (SPLIT {best['SPLIT']}, BLOCK_K {best['BLOCK_K']})",
                  flush=True)
    return rows


PREFILL_SWEEP = [dict(BLOCK_M=bm, BLOCK_K=bk, num_warps=w, num_stages=st, SPLIT=sp)
                 for bm in (32, 64, 128) for bk in (64, 128) for w in (4, 8) for st in (3,) for sp in (0, 1)]
PREFILL_SHAPES = ((4096, 112, 4096), (4096, 8, 4096), (576, 12, 4096))
SMALL_SHAPES = ((4096, 112, 8), (4096, 112, 32), (576, 12, 8), (576, 12, 32), (576, 12, 1024))


def prefill_configs(hidden: int, m: int) -> list[dict]:
    return [c for c in PREFILL_SWEEP if not (c["BLOCK_M"] * c["BLOCK_K"] >= 128 * 128 and c["num_warps"] == 4)]


EPILOGUE_SHAPES = ((4096, 112, 4096), (4096, 8, 4096), (4096, 112, 1024), (4096, 8, 1024), (576, 12, 4096),
                   (576, 3, 4096), (576, 12, 1024), (4096, 112, 32), (576, 12, 32))


TILE_SHAPES = ((4096, 112, 4096), (4096, 8, 4096))


def tile_configs(hidden: int, m: int) -> list[dict]:
    """Token tile, K step, explicit SPLIT (1-8 programs per tile), stages, on today's kernel (two-part W_in split,
    one 3xTF32 epilogue product); 8 warps for 128-token tiles, 4 below."""
    return [dict(BLOCK_M=bm, BLOCK_K=bk, num_warps=8 if bm == 128 else 4, num_stages=st, SPLIT=sp)
            for bm in (32, 64, 128) for bk in (64, 128, 256) for sp in (1, 2, 4, 8) for st in (3, 4)
            if (sp - 1) * bk < hidden and bm * bk <= 128 * 128]


def epilogue_configs(hidden: int, m: int) -> list[dict]:
    """The epilogue's forms (two products or one on the logit difference; fp32 FMA or 3xTF32) and group chunk, on
    the default token tile / K step / split."""
    return [dict(LOGIT_DIFF=d, EPILOGUE_PRECISION=p, BLOCK_G=bg) for d in (False, True) for p in ("ieee", "tf32x3")
            for bg in (16, 32, 64, 128)]


def parts_configs(hidden: int, m: int) -> list[dict]:
    """W_in's split in two parts (hi + mid) against three, with 3 and 4 pipeline stages, on the default tiles."""
    return [dict(W_PARTS=p, num_stages=st) for p in (3, 2) for st in (3, 4)]


def small_configs(hidden: int, m: int) -> list[dict]:
    """Token tile up to the batch, K step, SPLIT programs per tile (only splits the kernel would not clamp)."""
    tiles = [bm for bm in (16, 32, 64) if bm <= max(16, 1 << (m - 1).bit_length())]
    return [dict(BLOCK_M=bm, BLOCK_K=bk, num_warps=4, num_stages=3, SPLIT=sp) for bm in tiles for bk in (64, 128, 256)
            for sp in (1, 2, 4, 8, 16, 32) if (sp - 1) * bk < hidden]


def sweep_configs(gen: torch.Generator, path: str, meta: dict, shapes: tuple = PREFILL_SHAPES,
                  configs=prefill_configs, rounds: int = 1) -> list[dict]:
    """The fused kernel at each ``(H, G, M)`` of ``shapes`` under each of ``configs(H, M)`` (token tile, K step,
    warps, SPLIT: 0 = automatic), against its default; with ``rounds`` > 1 the default and every configuration are
    timed in interleaved rounds (A B C A B C ...) and the medians reported. Rows are written to ``path`` after every
    shape. ``--sweep-prefill``: the prefill shapes of Llama-3-8B (H = 4096) and SmolLM2-135M (H = 576);
    ``--sweep-small``: 8-1024 tokens, where a router decision is a chain of a few dependent memory round trips."""
    rows = []
    for hidden, groups, m in shapes:
        xs, ws = operands(m, hidden, groups, gen)
        ref = router_mask_reference(xs[0], *ws[0])
        cfgs = [None, *configs(hidden, m)]
        samples, differ = [[] for _ in cfgs], [float("nan")] * len(cfgs)
        for r in range(rounds):
            for i, cfg in enumerate(cfgs):
                try:
                    samples[i].append(bench_graph([lambda x=x, w=w: router_mask(x, *w, config=cfg)
                                                   for x, w in zip(xs, ws)]))
                    if r == 0:  # the decisions do not change between rounds
                        differ[i] = (router_mask(xs[0], *ws[0], config=cfg) != ref).float().mean().item()
                except Exception as e:  # a configuration that does not compile / fit: report, go on
                    samples[i].append(float("nan"))
                    print(f"  config {cfg} failed: {type(e).__name__}: {str(e)[:100]}", flush=True)
        default = statistics.median(samples[0])
        for cfg, times, diff in zip(cfgs[1:], samples[1:], differ[1:]):
            rows.append({"M": m, "H": hidden, "G": groups, **cfg, "fused_us": statistics.median(times),
                         "default_us": default, "differ": diff, **({"rounds_us": times} if rounds > 1 else {})})
        shape_rows = [r for r in rows
                      if (r["M"], r["H"], r["G"]) == (m, hidden, groups) and r["fused_us"] == r["fused_us"]]
        for r in sorted(shape_rows, key=lambda r: r["fused_us"])[:4]:
            config = {k: v for k, v in r.items()
                      if k not in ("M", "H", "G", "fused_us", "default_us", "differ", "rounds_us")}
            print(f"sweep H={hidden} G={groups} M={m}: default {default:.1f} us; {config}: {r['fused_us']:.1f} us "
                  f"(differ {r['differ']:.1e})", flush=True)
        with open(path, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return rows


PRESPLIT_SHAPES = ((4096, 112, 4096), (4096, 8, 4096), (4096, 112, 16384), (4096, 112, 1024), (576, 12, 4096))
PRESPLIT_CONFIGS = [{}, dict(BLOCK_K=128), dict(BLOCK_K=128, num_stages=4), dict(SPLIT=8),
                    dict(BLOCK_M=128, num_warps=8, num_stages=4),
                    dict(BLOCK_M=128, BLOCK_K=128, num_warps=8, num_stages=4)]


def sweep_presplit(gen: torch.Generator, path: str, meta: dict, rounds: int) -> list[dict]:
    """W_in's two bf16 parts made once (``split_router_weights``, ``w_parts=``) instead of per K step in registers:
    the default kernel against the pre-split one at ``PRESPLIT_CONFIGS`` (interleaved rounds, medians), and the
    split itself per router (eager, and compiled by Inductor as a model's graph would run it)."""
    rows = []
    for hidden, groups, m in PRESPLIT_SHAPES:
        xs, ws = operands(m, hidden, groups, gen)
        parts = [split_router_weights(w[0], torch.bfloat16) for w in ws]
        ref = router_mask_reference(xs[0], *ws[0])
        torch._dynamo.reset()
        split_compiled = torch.compile(split_router_weights, dynamic=False)
        fns = {"default": [lambda x=x, w=w: router_mask(x, *w) for x, w in zip(xs, ws)],
               "split_eager": [lambda w=w: split_router_weights(w[0], torch.bfloat16) for w in ws],
               "split_compiled": [lambda w=w: split_compiled(w[0], torch.bfloat16) for w in ws]}
        for i, cfg in enumerate(PRESPLIT_CONFIGS):
            fns[f"presplit{i}"] = [lambda x=x, w=w, p=p, cfg=cfg: router_mask(x, *w, config=cfg, w_parts=p)
                                   for x, w, p in zip(xs, ws, parts)]
        samples = {k: [] for k in fns}
        for _ in range(rounds):
            for k, calls in fns.items():
                samples[k].append(bench_graph(calls))
        for k in fns:
            row = {"M": m, "H": hidden, "G": groups, "variant": k, "us": statistics.median(samples[k]),
                   "rounds_us": samples[k]}
            if k.startswith("presplit"):
                cfg = PRESPLIT_CONFIGS[int(k[8:])]
                row["config"] = cfg
                mask = router_mask(xs[0], *ws[0], config=cfg, w_parts=parts[0])
                row["differ"] = (mask != ref).float().mean().item()
            rows.append(row)
            print(f"presplit H={hidden} G={groups} M={m}: {k:15s} {row['us']:7.1f} us {row.get('config', '')} "
                  f"differ {row.get('differ', '')}", flush=True)
        with open(path, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return rows


ONE_TOKEN_CONFIGS = [dict(block_h=bh, num_warps=w) for bh in (1024, 4096) for w in (4, 8)]


def one_token(gen: torch.Generator, meta: dict, path: str) -> list[dict]:
    """One token, Llama-3-8B router shapes: ``templates/router_one_token.py`` (one launch of R programs) at each of
    ``ONE_TOKEN_CONFIGS`` against the backend's default one-token form (``router_mask_reduction`` compiled by
    Inductor: two reduction kernels) and the generic fused template. Written to ``path``."""
    rows = []
    for hidden, groups in [s for s in SHAPES if s[0] == 4096]:
        xs, ws = operands(1, hidden, groups, gen)
        torch._dynamo.reset()
        reduction = torch.compile(router_mask_reduction, dynamic=False)
        row = {"M": 1, "H": hidden, "G": groups, "rotations": len(xs),
               "reduction_compiled_us": bench_graph([lambda x=x, w=w: reduction(x, *w) for x, w in zip(xs, ws)]),
               "fused_us": bench_graph([lambda x=x, w=w: router_mask(x, *w) for x, w in zip(xs, ws)])}
        ref = router_mask_reference(xs[0], *ws[0])
        for cfg in ONE_TOKEN_CONFIGS:
            key = f"one_token_bh{cfg['block_h']}_w{cfg['num_warps']}"
            row[f"{key}_us"] = bench_graph([lambda x=x, w=w: router_one_token(x, *w, **cfg) for x, w in zip(xs, ws)])
            row[f"{key}_differ"] = (router_one_token(xs[0], *ws[0], **cfg) != ref).float().mean().item()
        rows.append(row)
        print(f"one token H={hidden} G={groups}: " + ", ".join(f"{k[:-3]} {v:.1f}" for k, v in row.items()
                                                               if k.endswith("_us")) + " us", flush=True)
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return rows


LARGE_SHAPES = ((4096, 112, 4096), (4096, 8, 4096), (4096, 112, 8192), (4096, 112, 16384), (4096, 8, 16384))


def large_configs(hidden: int, m: int) -> list[dict]:
    """The candidates of two earlier sweeps at 4096+ tokens (``_sweep_tiles``: K steps of 128; ``_sweep_transposed``,
    commit ``680df27``: h made transposed, a form since removed), in interleaved rounds against the default. The
    rows of ``kernels_router_sweep_large.json`` with ``H_TRANSPOSED`` came from that commit's code. The second
    configuration became the default from 8192 tokens (``router_mask.LARGE_TOKENS``): re-run today, it times the
    default against itself there."""
    return [dict(BLOCK_M=128, BLOCK_K=128, num_warps=8, num_stages=4), dict(BLOCK_M=64, BLOCK_K=128, num_stages=3)]


# The "only this sweep" flags: argument name -> (shapes, configurations); results in kernels_router_<name>.json.
SWEEPS = {"sweep_prefill": (PREFILL_SHAPES, prefill_configs), "sweep_small": (SMALL_SHAPES, small_configs),
          "sweep_tiles": (TILE_SHAPES, tile_configs), "sweep_epilogue": (EPILOGUE_SHAPES, epilogue_configs),
          "sweep_parts": (EPILOGUE_SHAPES[:7], parts_configs),
          "sweep_large": (LARGE_SHAPES, large_configs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--sweep-decode", action="store_true", help="also sweep the decode configurations at 1-8 "
                        "tokens (kernels_router_sweep_decode.json)")
    parser.add_argument("--sweep-prefill", action="store_true", help="only a sweep of the prefill configurations "
                        "(kernels_router_sweep_prefill.json)")
    parser.add_argument("--sweep-small", action="store_true", help="only a sweep of token tile / K step / split at "
                        "8-1024 tokens (kernels_router_sweep_small.json)")
    parser.add_argument("--sweep-epilogue", action="store_true", help="only a sweep of the epilogue's forms and "
                        "group chunk (kernels_router_sweep_epilogue.json)")
    parser.add_argument("--sweep-parts", action="store_true", help="only a sweep of W_in's split in two or three "
                        "parts at the prefill shapes (kernels_router_sweep_parts.json)")
    parser.add_argument("--sweep-tiles", action="store_true", help="only a sweep of token tile / K step / explicit "
                        "split / stages at 4096 tokens, H = 4096 (kernels_router_sweep_tiles.json)")
    parser.add_argument("--sweep-large", action="store_true", help="only the best tiles of the earlier sweeps at "
                        "4096-16384 tokens, H = 4096 (use with --rounds; kernels_router_sweep_large.json)")
    parser.add_argument("--sweep-presplit", action="store_true", help="only W_in split once (w_parts=) against the "
                        "default, and the split's own time (kernels_router_sweep_presplit.json)")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds of a sweep (median reported)")
    parser.add_argument("--one-token", action="store_true", help="only the one-token kernels against the default "
                        "one-token form (kernels_router_one_token.json)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # the unfused path is an fp32 GEMM, as in the model
    gen = torch.Generator().manual_seed(0)
    only = next((name for name in (*SWEEPS, "one_token", "sweep_presplit") if getattr(args, name)), None)
    flags = (" --" + only.replace("_", "-") if only else "") + (" --sweep-decode" if args.sweep_decode and not only
                                                               else "")
    flags += f" --rounds {args.rounds}" if args.rounds > 1 else ""
    meta = {"command": f"python3 benchmarks/kernels_router.py --out {args.out}{flags}",
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    os.makedirs(args.out, exist_ok=True)
    if only in SWEEPS:
        shapes, configs = SWEEPS[only]
        sweep_configs(gen, os.path.join(args.out, f"kernels_router_{only}.json"), meta, shapes, configs, args.rounds)
        return
    if only == "sweep_presplit":
        sweep_presplit(gen, os.path.join(args.out, "kernels_router_sweep_presplit.json"), meta, args.rounds)
        return
    if only == "one_token":
        one_token(gen, meta, os.path.join(args.out, "kernels_router_one_token.json"))
        return
    rows = []
    for hidden, groups in SHAPES:
        for m in TOKENS:
            rows.append(measure(m, hidden, groups, gen))
            r = rows[-1]
            print(f"H={hidden:5d} G={groups:4d} M={m:6d}  unfused {r['unfused_us']:8.1f}  fused {r['fused_us']:8.1f}  "
                  f"fused_fp32 {r['fused_fp32_us']:8.1f} us  speedup {r['speedup']:.2f}x  "
                  f"differ {r['fused_differ']:.1e}", flush=True)
    with open(os.path.join(args.out, "kernels_router.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    write_markdown(os.path.join(args.out, "kernels_router.md"), meta, rows)  # before the (long) sweep
    if args.sweep_decode:
        sweep_decode(gen, os.path.join(args.out, "kernels_router_sweep_decode.json"), meta)


def write_markdown(path: str, meta: dict, rows: list[dict]) -> None:
    lines = [f"# Fused router decision vs unfused PyTorch ops (R={RANK}, bf16 x, fp32 routers)", "",
             f"GPU: {meta['gpu']}; torch {meta['torch']}; triton {meta['triton']}; {meta['date']}", "",
             f"Command: `{meta['command']}`", "", __doc__.split("\n\n", 2)[2].strip(), "",
             "| H | G | M | unfused µs | fused µs | fused fp32 µs | speed-up | decisions differ |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['H']} | {r['G']} | {r['M']} | {r['unfused_us']:.1f} | {r['fused_us']:.1f} | "
              f"{r['fused_fp32_us']:.1f} | {r['speedup']:.2f}x | {r['fused_differ']:.1e} |" for r in rows]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
