"""Benchmark of the group-skipping linear kernels on Llama-3-8B shapes vs cuBLAS (dense and half width).

    python3 benchmarks/kernels_linear.py --out DIR [--rounds N] [--ops ...] [--ms ...] [--masks ...] [--sweep-* --no-main]

Ops (bf16): gate_up (4096 -> 2 x 14336, fused gated_up_groups, groups of 128), down (14336 -> 4096,
input groups of 128), q_proj (4096 -> 4096, output groups of 512 = 4 heads x 128), o_proj (input groups
of 512), and ffn = plan + gate_up + down sharing one plan. Masks: i.i.d. random per token at 25 / 50 / 70%
sparsity, "pattern50": each token takes one of 8 random patterns with 50% of groups active (correlated,
router-like), and "trained": decisions of trained routers (results/trained_masks_smollm2.npz, laid out at these
group counts by kernels_linear_ops.trained_mask; run when that file exists). Every timing of ours includes building
the plan it needs.

Timing: each measured callable runs R rotation copies (distinct weights and inputs, so L2 cannot hold
them) inside one CUDA graph, median replay time divided by R. Each copy has its own mask draw (at least
``DECODE_DRAWS`` copies up to 16 tokens, ``MODERATE_DRAWS`` up to 256), so a row is the mean over R draws. Ceilings
measured in the same run: device-to-device copy (bytes read + written) and a
8192^3 bf16 matmul on random data. Bound per case: max(bytes / copy BW, flops / matmul rate) with bytes =
weights of groups active for any token + activations read/written, flops = 2 * active (token, group) pairs
* group_size * other dim (x2 for gate_up), averaged over the copies' draws.

The ops and mask kinds are in ``kernels_linear_ops.py``; the configuration grids of the ``--sweep-*`` flags in
``kernels_linear_sweeps.py``.
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
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from wide_compile.templates import build_group_plan, gated_up_groups, input_group_linear, output_group_linear
from wide_compile.templates.group_linear import (
    DENSE_OUTPUT_MAX_TOKENS, GEMV_MAX_TOKENS, MASKED_INPUT_GEMV_MAX_TOKENS,
)
from kernels_linear_ops import (  # noqa: E402  (benchmarks/ is the script's directory)
    MASKS, MS, OPS, TRAINED, TRAINED_MASKS, group_count, make_mask, mask_family,
)
from kernels_linear_sweeps import FLAGS as SWEEP_FLAGS, SWEEPS, chosen_grid, takes_token_counts  # noqa: E402
from kernels_targets import linear_targets  # noqa: E402
from stream_read import READ_VARIANTS, all_variant_fns  # noqa: E402

DT = torch.bfloat16


def bench_graph(fns: list, reps: int = 25) -> float:
    """Median µs of one call: the R callables (distinct weights / inputs) run back to back in one CUDA
    graph; each sample is one replay between two CUDA events. No explicit L2 flush: the rotation makes
    every call miss in L2 (R x weight bytes >= 3 x L2), as in a model where other layers run between."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):  # the warm-up stream: per-stream state (arrival counters) is ready
        for f in fns:
            f()
    torch.cuda.synchronize()
    for _ in range(3):
        graph.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for a, b in zip(starts, ends):
        a.record()
        graph.replay()
        b.record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in zip(starts, ends))
    del graph
    return times[len(times) // 2] * 1e3 / len(fns)


def ceilings() -> dict:
    a = torch.randn(2**29, device="cuda", dtype=DT)  # 1 GiB
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=20, rep=200, return_mode="median")
    copy_tbs = 2 * a.numel() * 2 / (ms * 1e-3) / 1e12
    del a, b
    n = 8192
    x, y = torch.randn(n, n, device="cuda", dtype=DT), torch.randn(n, n, device="cuda", dtype=DT)
    ms = do_bench(lambda: x @ y, warmup=50, rep=300, return_mode="median")
    tflops = 2 * n**3 / (ms * 1e-3) / 1e12
    return {"copy_TBps": copy_tbs, "bf16_mm_TFLOPs": tflops}


def cost(op: str, mask: torch.Tensor, m: int) -> tuple[float, float]:
    """(bytes, flops) lower bounds of one call on this mask."""
    cfg = OPS[op]
    k_dim, n_dim, gs = cfg["K"], cfg["N"], cfg["gs"]
    pairs = int(mask.sum())
    union = int(mask.any(0).sum())
    if cfg["kind"] == "gated":
        return 2 * union * gs * k_dim * 2 + m * k_dim * 2 + m * n_dim * 2, 2 * 2 * pairs * gs * k_dim
    if cfg["kind"] == "output":
        return union * gs * k_dim * 2 + m * k_dim * 2 + m * n_dim * 2, 2 * pairs * gs * k_dim
    if cfg["kind"] == "input":
        return union * gs * n_dim * 2 + pairs * gs * 2 + m * n_dim * 2, 2 * pairs * gs * n_dim
    b1, f1 = cost("gate_up", mask, m)
    b2, f2 = cost("down", mask, m)
    return b1 + b2, f1 + f2


class Case:
    """Weights / inputs for one op and token count, R rotation copies."""

    def __init__(self, op: str, m: int, rotations: int, gen: torch.Generator):
        cfg = OPS[op]
        self.op, self.m, self.cfg = op, m, cfg
        k_dim, n_dim = cfg["K"], cfg["N"]
        r = range(rotations)

        def w(n, k):
            return (torch.randn(n, k, generator=gen, device="cuda", dtype=torch.float32) / k**0.5).to(DT)

        if cfg["kind"] in ("gated", "ffn"):
            self.wg = [w(n_dim, k_dim) for _ in r]
            self.wu = [w(n_dim, k_dim) for _ in r]
            self.wcat = [torch.cat([a, b]) for a, b in zip(self.wg, self.wu)]
            self.wcat_half = [torch.cat([a[: n_dim // 2], b[: n_dim // 2]]) for a, b in zip(self.wg, self.wu)]
            if cfg["kind"] == "ffn":
                self.wd = [w(k_dim, n_dim) for _ in r]
                self.wd_half = [t[:, : n_dim // 2].contiguous() for t in self.wd]
        else:
            self.w = [w(n_dim, k_dim) for _ in r]
            if cfg["kind"] == "output":
                self.w_half = [t[: n_dim // 2].contiguous() for t in self.w]
            else:
                self.w_half = [t[:, : k_dim // 2].contiguous() for t in self.w]
        self.x = [torch.randn(m, k_dim, generator=gen, device="cuda").to(DT) for _ in r]
        self.x_half = [t[:, : k_dim // 2].contiguous() for t in self.x]

    def dense_fns(self, half: bool, act: bool) -> list:
        kind, fns = self.cfg["kind"], []
        for i in range(len(self.x)):
            if kind in ("gated", "ffn"):
                wc = self.wcat_half[i] if half else self.wcat[i]
                if kind == "gated":
                    if act:
                        fns.append(lambda x=self.x[i], wc=wc: _silu_mul(F.linear(x, wc)))
                    else:
                        fns.append(lambda x=self.x[i], wc=wc: F.linear(x, wc))
                else:
                    wd = self.wd_half[i] if half else self.wd[i]
                    fns.append(lambda x=self.x[i], wc=wc, wd=wd: F.linear(_silu_mul(F.linear(x, wc)), wd))
            elif kind == "output":
                fns.append(lambda x=self.x[i], w=(self.w_half[i] if half else self.w[i]): F.linear(x, w))
            else:
                x = self.x_half[i] if half else self.x[i]
                fns.append(lambda x=x, w=(self.w_half[i] if half else self.w[i]): F.linear(x, w))
        return fns

    def union_fns(self, masks: list) -> list | None:
        """cuBLAS on a dense weight holding exactly the groups some token of the batch uses (an oracle static pruner
        for this batch: the fewest bytes a dense kernel could read), per rotation copy on that copy's mask draw, or
        None for ffn or when every copy's batch uses every group (then it is the dense row). Input groups: x
        restricted to the same columns, copied outside the timing."""
        kind, gs = self.cfg["kind"], self.cfg["gs"]
        used = [mask.any(0) for mask in masks]
        if kind == "ffn" or all(bool(u.all()) for u in used):
            return None
        fns = []
        for i in range(len(self.x)):
            idx = used[i].repeat_interleave(gs).nonzero().flatten()
            if kind == "gated":
                w = torch.cat([self.wg[i][idx], self.wu[i][idx]])
                fns.append(lambda x=self.x[i], w=w: F.linear(x, w))
            elif kind == "output":
                fns.append(lambda x=self.x[i], w=self.w[i][idx].contiguous(): F.linear(x, w))
            else:
                x_u, w_u = self.x[i][:, idx].contiguous(), self.w[i][:, idx].contiguous()
                fns.append(lambda x=x_u, w=w_u: F.linear(x, w))
        return fns

    def read_fns(self, masks: list, sms: int) -> dict | None:
        """Per read variant (``stream_read.READ_VARIANTS``), thunks that only read as many weight bytes as the union
        of each copy's draw holds (contiguous, from the start of that copy's weight; whole rows of the other dim), or
        None for ffn. The table takes the faster of these and the union cuBLAS (``read_us``): what reading the bytes
        the op needs costs without its arithmetic, by the fastest reads measured."""
        kind, gs = self.cfg["kind"], self.cfg["gs"]
        if kind == "ffn":
            return None
        other = self.cfg["K"] if kind in ("gated", "output") else self.cfg["N"]
        per_group = gs * other * (2 if kind == "gated" else 1)
        srcs = self.wcat if kind == "gated" else self.w
        numels = [int(mask.any(0).sum()) * per_group for mask in masks]
        return all_variant_fns(srcs, numels, sms, other)[0]

    def ours_fns(self, mask, config: dict | None = None, block_m: int | None = None) -> list:
        """Our op on each rotation copy; ``mask``: one mask for every copy, or a list with each copy's draw."""
        kind, gs, fns = self.cfg["kind"], self.cfg["gs"], []
        masks = mask if isinstance(mask, list) else [mask] * len(self.x)
        decode = self.m <= (MASKED_INPUT_GEMV_MAX_TOKENS if self.cfg.get("premasked") else
                            GEMV_MAX_TOKENS["input_group_linear"])  # input groups: as "auto", no plan for the GEMV
        forced = None
        if config is not None and "path" in config:  # config["path"]: force the GEMV / GEMM / cuBLAS path
            config = dict(config)
            forced = config.pop("path")
        out_path = forced or "auto"
        # as in the model: no plan where the op's GEMV runs (it needs none; "auto" takes it up to GEMV_MAX_TOKENS),
        # nor where the output-group op runs cuBLAS ("auto" up to DENSE_OUTPUT_MAX_TOKENS)
        no_plan_limit = GEMV_MAX_TOKENS["gated_up_groups" if kind in ("gated", "ffn") else "output_group_linear"]
        if kind == "output":
            no_plan_limit = max(no_plan_limit, DENSE_OUTPUT_MAX_TOKENS)
        no_plan = out_path in ("gemv", "dense") or (out_path == "auto" and self.m <= no_plan_limit)
        for i in range(len(self.x)):
            x, mask = self.x[i], masks[i]
            if kind == "gated":
                def f(x=x, wg=self.wg[i], wu=self.wu[i], mask=mask):
                    plan = None if no_plan else build_group_plan(mask, parts=("output",))
                    return gated_up_groups(x, wg, wu, mask, gs, "silu", plan, config=config, path=out_path)
            elif kind == "output":
                def f(x=x, w=self.w[i], mask=mask):
                    plan = None if no_plan else build_group_plan(mask, parts=("output",))
                    return output_group_linear(x, w, mask, gs, plan=plan, config=config, path=out_path)
            elif kind == "input":
                pm = self.cfg.get("premasked", False)
                if pm:  # zero x outside each token's groups once, outside the timed region
                    x = x * (mask != 0).repeat_interleave(gs, dim=-1).to(x.dtype)

                path = self.cfg.get("path", "auto")

                def f(x=x, w=self.w[i], pm=pm, path=path, mask=mask):
                    p = forced or ("gemm" if (config is not None and not decode) else path)
                    if p in ("gemv", "dense") or (p == "auto" and decode):  # as in the model: no plan launch
                        plan = None  # (the GEMV finds the groups itself; cuBLAS on the masked input needs none)
                    elif p == "gemm":
                        plan = build_group_plan(mask, parts=("input",), block_m=block_m)
                    else:  # "auto" prefill = cuBLAS on the masked input: no plan
                        plan = None
                    return input_group_linear(x, w, mask, gs, plan=plan, config=config or None, x_is_masked=pm,
                                              path=p)
            else:
                def f(x=x, wg=self.wg[i], wu=self.wu[i], wd=self.wd[i], mask=mask):
                    plan = None if no_plan else build_group_plan(mask)  # shared by gate/up and down
                    h = gated_up_groups(x, wg, wu, mask, gs, "silu", plan)
                    return input_group_linear(h, wd, mask, gs, plan=plan, x_is_masked=True)
            fns.append(f)
        return fns


def _silu_mul(gu: torch.Tensor) -> torch.Tensor:
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


# Main table: each rotation copy gets its own mask draw, and up to 16 tokens at least this many copies. With few
# tokens one draw decides the bytes (a token's active count among 8 query / output groups is Binomial(8, p): one
# 50% draw may use 2 groups, another 6), so a row reports the mean over draws, as a decode step sees many tokens.
# 32 since stop 31: with 8 the mean active count of an 8-group op still varied by +-6% between runs (the o_proj row at
# one token read a 9.4 µs union in stop 31's first table against 7.0 in stop 30's, on other draws).
DECODE_DRAWS = 32
# Up to this many tokens the table also times a kernel that only reads the union's weight bytes ("read"): there the
# bound is the bytes (at 1-16 tokens) or mostly the bytes (the 32 MB projections up to 256 tokens).
READ_MAX_TOKENS = 256
# 17-256 tokens: at least this many copies too. Random masks' unions are the whole weight there, but each draw of the
# trained routers' masks takes its own layers, whose skip rates differ (stop 31's first table: 2 draws per 64-token
# gate/up row, 65% skipped).
MODERATE_DRAWS = 8


def draws_for(op: str, m: int) -> int:
    """Rotation copies of an (op, M) case, each on its own mask draw."""
    return max(rotations_for(op, m), DECODE_DRAWS if m <= 16 else MODERATE_DRAWS if m <= 256 else 0)


def rotations_for(op: str, m: int) -> int:
    """Copies so that one graph replay streams >= ~3 x the 60 MB L2 of weights (at least 2)."""
    cfg = OPS[op]
    wbytes = cfg["K"] * cfg["N"] * 2 * (3 if cfg["kind"] == "ffn" else 2 if cfg["kind"] == "gated" else 1)
    return max(2, min(8, -(-180_000_000 // wbytes)))


def mean_cost(op: str, masks: list, m: int, ceil: dict | None = None) -> tuple[float, float, float | None]:
    """(bytes, flops, bound µs) averaged over the copies' mask draws; each draw's bound is
    max(bytes / copy BW, flops / matmul rate) (None without ``ceil``)."""
    costs = [cost(op, mask, m) for mask in masks]
    bound = None
    if ceil is not None:
        bound = statistics.fmean(max(b / (ceil["copy_TBps"] * 1e12), f / (ceil["bf16_mm_TFLOPs"] * 1e12)) * 1e6
                                 for b, f in costs)
    return statistics.fmean(b for b, _ in costs), statistics.fmean(f for _, f in costs), bound


def interleaved(timed: dict, rounds: int) -> dict:
    """``bench_graph`` of every entry, ``rounds`` times in turn (A B C A B C ...): a drift of the GPU's clock during
    the run moves every variant alike instead of favouring the one timed last. Per entry, the samples (µs)."""
    samples = {key: [] for key in timed}
    for _ in range(rounds):
        for key, fns in timed.items():
            samples[key].append(bench_graph(fns))
    return samples


def run_main(args, ceil: dict, gen: torch.Generator) -> list:
    rows = []
    ops = args.ops.split(",")
    ms = [int(v) for v in args.ms.split(",")] if args.ms else MS
    masks = args.masks.split(",") if args.masks else list(MASKS) + ([TRAINED] if os.path.exists(TRAINED_MASKS) else [])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for op in ops:
        for m in ms:
            if m < OPS[op].get("min_m", 0):
                continue
            copies = draws_for(op, m)
            case = Case(op, m, copies, gen)
            g = group_count(op)
            mask_list = [(mname, [make_mask(mname, m, g, gen, mask_family(op)) for _ in range(copies)])
                         for mname in masks]
            timed = {"dense": case.dense_fns(half=False, act=False), "half": case.dense_fns(half=True, act=False)}
            if op == "gate_up":
                timed["dense_act"] = case.dense_fns(half=False, act=True)
            timed.update({f"ours:{mname}": case.ours_fns(mask) for mname, mask in mask_list})
            timed.update({f"union:{mname}": fns for mname, mask in mask_list
                          if (fns := case.union_fns(mask)) is not None})
            if m <= READ_MAX_TOKENS:
                for mname, mask in mask_list:
                    reads = case.read_fns(mask, sms) or {}
                    timed.update({f"read:{mname}:{label}": fns for label, fns in reads.items()})
            samples = interleaved(timed, args.rounds)
            med = {key: statistics.median(v) for key, v in samples.items()}
            dense, half = med["dense"], med["half"]
            dense_act = med.get("dense_act", dense)
            for mname, mask in mask_list:
                ours = med[f"ours:{mname}"]
                union = med.get(f"union:{mname}", dense if OPS[op]["kind"] != "ffn" else float("nan"))
                nbytes, flops, bound = mean_cost(op, mask, m, ceil)
                reads = {k.split(":")[2]: v for k, v in med.items() if k.startswith(f"read:{mname}:")}
                read_kernel = min(reads.values()) if reads else None
                read = min(read_kernel, union) if read_kernel is not None else None
                row = dict(op=op, mask=mname, M=m, ours_us=ours, dense_us=dense, dense_act_us=dense_act,
                           half_us=half, union_us=union, bound_us=bound, speedup=dense / ours,
                           speedup_vs_dense_act=dense_act / ours,
                           frac_bound=bound / ours, TBps=nbytes / (ours * 1e-6) / 1e12,
                           TFLOPs=flops / (ours * 1e-6) / 1e12, bytes=nbytes, flops=flops,
                           draws=len(mask), active_frac=statistics.fmean(float(d.float().mean()) for d in mask),
                           union_frac=statistics.fmean(float(d.any(0).float().mean()) for d in mask),
                           ours_us_rounds=samples[f"ours:{mname}"], dense_us_rounds=samples["dense"],
                           union_us_rounds=samples.get(f"union:{mname}"),
                           read_us=read, read_kernel_us=read_kernel, read_variants_us=reads or None)
                rows.append(row)
                print(f"{op:8s} {mname:9s} M={m:6d} ours {ours:9.1f}us dense {dense:9.1f} half {half:9.1f} "
                      f"union {union:9.1f} read {read if read is not None else float('nan'):9.1f} "
                      f"bound {bound:9.1f} x{dense / ours:5.2f} {100 * bound / ours:5.1f}%bound", flush=True)
            del case
            torch.cuda.empty_cache()
    return rows


def run_sweep(gen: torch.Generator, sweeps: list | None = None, repeat: int = 1) -> list:
    """Time each case's configurations (each rotation copy on its own mask draw, as the main table; sweeps before
    stop 30 timed one draw); with ``repeat`` > 1 the configurations are timed in ``repeat`` interleaved
    rounds (A B A B ...) and ``us`` is the median over rounds, so that drift of the GPU's clocks during the sweep
    does not favour one configuration (between two single timings the same configuration moved by up to 16%)."""
    out = []
    for op, m, mname, configs in SWEEPS if sweeps is None else sweeps:
        copies = draws_for(op, m)
        case = Case(op, m, copies, gen)
        kind = OPS[op]["kind"]
        g = group_count(op)
        mask = [make_mask(mname, m, g, gen, mask_family(op)) for _ in range(copies)]  # a draw per copy, as the table
        dense = bench_graph(case.dense_fns(half=False, act=False))
        expected = case.ours_fns(mask)[0]().float()  # the default configuration's result: each config must match it
        runs = []
        for cfg in configs:
            cfg = dict(cfg)
            block_m = cfg.pop("BLOCK_M") if kind == "input" and "BLOCK_M" in cfg else None
            try:
                fns = case.ours_fns(mask, config=cfg, block_m=block_m)
                err = ((fns[0]().float() - expected).abs().max() / expected.abs().max().clamp_min(1e-6)).item()
            except Exception as e:  # a config that does not compile / fit: report, continue
                fns, err = None, float("nan")
                print(f"  config failed: {type(e).__name__}: {str(e)[:120]}")
            runs.append((cfg, block_m, fns, err))
        timed = interleaved({i: run[2] for i, run in enumerate(runs) if run[2] is not None}, repeat)
        nbytes, flops, _ = mean_cost(op, mask, m)
        for i, (cfg, block_m, _fns, err) in enumerate(runs):
            samples = timed.get(i, [])
            t = statistics.median(samples) if samples else float("nan")
            row = dict(op=op, M=m, mask=mname, config=cfg, block_m=block_m, us=t, dense_us=dense, rel_err=err,
                       bytes=nbytes, flops=flops, draws=len(mask))
            if repeat > 1:
                row["us_rounds"] = samples
            out.append(row)
            print(f"SWEEP {op:8s} M={m:5d} {mname:9s} {cfg} bm={block_m} -> {t:8.1f}us (dense {dense:8.1f}) "
                  f"rel err vs default {err:.1e}" + (f" rounds {[round(v, 1) for v in samples]}" if repeat > 1 else ""),
                  flush=True)
        del case, runs
        torch.cuda.empty_cache()
    return out


def targets(rows: list) -> list:
    """Issue 4's linear targets of this table (``kernels_targets.linear_targets``): (op, M, target, value, met)."""
    return [(t["op"], t["M"], t["target"] + (" (trained)" if t["mask"] == TRAINED else ""), t["value"], t["met"])
            for t in linear_targets({"rows": rows})]


def write_markdown(path: str, meta: dict, rows: list, tg: list) -> None:
    lines = ["# Group-skipping linear kernels vs cuBLAS (Llama-3-8B shapes, bf16)", "",
             f"GPU: {meta['gpu']}; torch {meta['torch']}; triton {meta['triton']}; {meta['date']}; "
             f"WIDE_PDL={meta.get('WIDE_PDL', '0')}", "",
             f"Command: `{meta['command']}` on the device machine after `pip install -e .` (the recipe "
             "`OUT=$OUT bash benchmarks/run_kernels_linear_gpu.sh` also runs tests/test_gpu_group_linear.py first)", "",
             f"Measured ceilings: copy {meta['ceilings']['copy_TBps']:.2f} TB/s (read+write), "
             f"bf16 matmul {meta['ceilings']['bf16_mm_TFLOPs']:.0f} TFLOP/s (8192^3, random).", "",
             "Times in µs: median of 25 CUDA-graph replays timed with CUDA events, each replay running the op on R "
             "rotated weight/input copies (R x weight bytes >= 180 MB = 3 x L2, no explicit flush), divided by R; "
             f"each copy has its own mask draw (at least {DECODE_DRAWS} copies up to 16 tokens, {MODERATE_DRAWS} up to "
             "256), so every value is "
             "the mean over R draws (bound and union included); "
             "ours includes building the plan its path needs (none for the GEMVs, as in the model). Dense, half "
             "and ours of one (op, M) are timed in "
             f"{meta.get('rounds', 1)} interleaved rounds; each value is the median over rounds. "
             "Because of the graph capture, the \"auto\" input-group path never takes the skipping GEMM here "
             "(its choice needs a host sync, skipped while capturing): see the *_gemm rows for that kernel. "
             "Input-group ops (down, o_proj, *_pm) run the default path: union-reading GEMV for M <= "
             f"{GEMV_MAX_TOKENS['input_group_linear']} ({MASKED_INPUT_GEMV_MAX_TOKENS} for *_pm; one launch, "
             "no plan, as in the model), cuBLAS on the input masked in one launch above (*_pm: input already zero "
             "outside each "
             "token's groups, x_is_masked=True); "
             "*_gemm rows force the skipping GEMM kernel. ffn = plan + gate_up + down (auto paths). "
             "dense = cuBLAS F.linear on the full weight (gate_up: one GEMM on [Wg; Wu], no activation); "
             "dense+act adds silu(g)*u; half = cuBLAS on a statically half-width weight; union = cuBLAS on a dense "
             "weight of exactly the groups some token of the batch uses (an oracle static pruner for this batch; "
             "input groups with x restricted to those columns; equal to dense where every group is used). "
             f"read (up to {READ_MAX_TOKENS} tokens) = the faster of union and a kernel that only reads as many "
             "contiguous weight bytes as each draw's union holds (benchmarks/stream_read.py: register loads, or a "
             f"pipelined cp.async loop as the GEMVs read; best of {len(READ_VARIANTS)} launch shapes). "
             "speedup = dense / ours. bound = max(bytes / copy BW, flops / matmul rate) per draw, averaged.", "",
             "| op | mask | M | ours | dense | dense+act | half | union | read | bound | speedup | % bound | TB/s | "
             "TFLOP/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        union = r.get("union_us", float("nan"))
        read = f"{r['read_us']:.1f}" if r.get("read_us") is not None else "-"
        lines.append(f"| {r['op']} | {r['mask']} | {r['M']} | {r['ours_us']:.1f} | {r['dense_us']:.1f} | "
                     f"{r['dense_act_us']:.1f} | {r['half_us']:.1f} | {union:.1f} | {read} | {r['bound_us']:.1f} | "
                     f"{r['speedup']:.2f} | "
                     f"{100 * r['frac_bound']:.0f}% | {r['TBps']:.2f} | {r['TFLOPs']:.0f} |")
    lines += ["", "## Targets (rand50, per linear; speed-up against dense without activation)", "",
              "| op | M | target | value | met |", "|---|---:|---|---:|---|"]
    for op, m, name, v, ok in tg:
        lines.append(f"| {op} | {m} | {name} | {v:.2f} | {'yes' if ok else 'NO'} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def build_parser() -> argparse.ArgumentParser:
    """The command line: the main table's options and one ``--sweep-<name>`` flag per ``kernels_linear_sweeps.FLAGS``
    entry."""
    ap = argparse.ArgumentParser(description="Group-skipping linear kernels against cuBLAS (Llama-3-8B shapes)")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--sweep", action="store_true", help="also time tile-config variants")
    for name, (make, out, what) in SWEEP_FLAGS.items():
        counts = "; --ms: token counts" if takes_token_counts(make) else ""
        ap.add_argument(f"--sweep-{name}", action="store_true", help=f"time {what} instead ({out}{counts})")
    ap.add_argument("--repeat", type=int, default=1, help="sweeps: interleaved timing rounds per configuration "
                    "(the median is reported)")
    ap.add_argument("--rounds", type=int, default=3, help="main table: interleaved timing rounds of dense, half "
                    "and ours per case; each value is the median over rounds")
    ap.add_argument("--no-main", action="store_true")
    ap.add_argument("--ops", default="gate_up,down,q_proj,o_proj,down_pm,o_proj_pm,down_gemm,o_proj_gemm,ffn")
    ap.add_argument("--ms", default="")
    ap.add_argument("--masks", default="")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                command="python3 benchmarks/kernels_linear.py " + " ".join(sys.argv[1:]),
                WIDE_PDL=os.environ.get("WIDE_PDL", "0"),  # programmatic dependent launch on / off
                rounds=args.rounds)
    t0 = time.time()
    meta["ceilings"] = ceilings()
    print("ceilings", meta["ceilings"], flush=True)
    result = dict(meta=meta)
    chosen = chosen_grid(vars(args), tuple(int(v) for v in args.ms.split(",")) if args.ms else ())
    if chosen:
        grid, name = chosen
        result["sweep"] = run_sweep(gen, grid, repeat=args.repeat)
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(result, f, indent=1)
    if not args.no_main:
        rows = run_main(args, meta["ceilings"], gen)
        tg = targets(rows)
        result["rows"], result["targets"] = rows, [dict(op=a, M=b, target=c, value=d, met=e) for a, b, c, d, e in tg]
        with open(os.path.join(args.out, "kernels_linear.json"), "w") as f:
            json.dump(result, f, indent=1)
        write_markdown(os.path.join(args.out, "kernels_linear.md"), meta, rows, tg)
        print("\n== rand50 summary ==")
        print(f"{'op':8s} {'M':>6s} {'ours':>9s} {'dense':>9s} {'half':>9s} {'bound':>9s} {'x':>5s} {'%bnd':>5s} {'TB/s':>5s} {'TF/s':>5s}")
        for r in rows:
            if r["mask"] in ("rand50",):
                print(f"{r['op']:8s} {r['M']:6d} {r['ours_us']:9.1f} {r['dense_us']:9.1f} {r['half_us']:9.1f} "
                      f"{r['bound_us']:9.1f} {r['speedup']:5.2f} {100 * r['frac_bound']:5.0f} {r['TBps']:5.2f} {r['TFLOPs']:5.0f}")
        print("targets:", sum(t[4] for t in tg), "/", len(tg), "met")
        for t in tg:
            if not t[4]:
                print("  NOT MET", t)
    print(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
