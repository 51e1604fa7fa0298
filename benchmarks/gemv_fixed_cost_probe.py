"""Probe: fixed cost and streaming rate of the one-token GEMVs, from masks with exactly k active groups.

At one token a GEMV's time is about ``F + k * b``: a fixed cost ``F`` (launch, first loads, split-K finish, tail)
and ``b`` per active group (its weight bytes at the streaming rate). For k = 1/8 ... 8/8 of the groups (random
groups, exact counts; Llama-3-8B shapes, bf16) this times, in interleaved rounds:

- ``down``: the input-group GEMV on a pre-masked input as the model runs it (``x_is_masked``, each program builds the
  union list itself), the same with the union list from a plan built once outside the timed region
  (``down_plan_union``: no list build in the kernel), the list kept in registers as prefix counts (``down_regs``:
  ``UNION_IN_REGS``), and unsplit 32-row programs (``down_split1``);
- ``gate_up``: the fused gated GEMV (default path);
- ``cublas_down_k`` / ``cublas_gate_up_k``: cuBLAS on a dense weight of the same k groups (what a static pruner
  with k groups would run).

A least-squares line over k gives ``F`` (µs) and the marginal rate (TB/s) per variant.

    python3 benchmarks/gemv_fixed_cost_probe.py --out FILE.json [--rounds 3]
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_linear import bench_graph  # noqa: E402
from wide_compile.templates import build_group_plan, gated_up_groups, input_group_linear  # noqa: E402

HIDDEN, INTER, GROUP = 4096, 14336, 128
G = INTER // GROUP
FRACTIONS = (1, 2, 4, 6, 8)  # eighths of the groups
MAX_COPIES = 12


def copies_for(active_bytes: int) -> int:
    """Rotated copies so that one replay streams >= 180 MB of active weights (3 x L2), at least 2."""
    return max(2, min(MAX_COPIES, -(-180_000_000 // active_bytes)))


def exact_mask(k: int, gen: torch.Generator) -> torch.Tensor:
    mask = torch.zeros(1, G, dtype=torch.bool, device="cuda")
    mask[0, torch.randperm(G, generator=gen, device="cuda")[:k]] = True
    return mask


def weights(n: int, k: int, copies: int, gen: torch.Generator) -> list:
    return [(torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(torch.bfloat16) for _ in range(copies)]


def fit(ks: list, us: list) -> tuple[float, float]:
    """Least-squares ``us = f + k * b``: returns (f, b)."""
    n = len(ks)
    mk, mu = sum(ks) / n, sum(us) / n
    b = sum((k - mk) * (u - mu) for k, u in zip(ks, us)) / sum((k - mk) ** 2 for k in ks)
    return mu - b * mk, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    wd = weights(HIDDEN, INTER, MAX_COPIES, gen)
    wg, wu = weights(INTER, HIDDEN, MAX_COPIES, gen), weights(INTER, HIDDEN, MAX_COPIES, gen)
    x = [torch.randn(1, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(MAX_COPIES)]
    rows = []
    for eighths in FRACTIONS:
        k = G * eighths // 8
        mask = exact_mask(k, gen)
        copies = copies_for(k * HIDDEN * GROUP * 2)
        r_gu = copies_for(k * 2 * GROUP * HIDDEN * 2)
        cols = mask[0].repeat_interleave(GROUP)
        h = [(torch.randn(1, INTER, device="cuda", generator=gen) * cols).to(torch.bfloat16) for _ in range(copies)]
        plan = build_group_plan(mask, parts=("union",))
        wd_k = [w[:, cols].contiguous() for w in wd[:copies]]
        h_k = [t[:, cols].contiguous() for t in h]
        rows_idx = mask[0].nonzero().flatten()
        wgu_k = [torch.cat([a.view(G, GROUP, HIDDEN)[rows_idx].reshape(-1, HIDDEN),
                            b.view(G, GROUP, HIDDEN)[rows_idx].reshape(-1, HIDDEN)])
                 for a, b in zip(wg[:r_gu], wu[:r_gu])]
        timed = {
            "down": [lambda h=h[i], w=wd[i]: input_group_linear(h, w, mask, GROUP, x_is_masked=True)
                     for i in range(copies)],
            "down_plan_union": [lambda h=h[i], w=wd[i]: input_group_linear(h, w, mask, GROUP, plan=plan,
                                                                            x_is_masked=True) for i in range(copies)],
            "down_regs": [lambda h=h[i], w=wd[i]: input_group_linear(h, w, mask, GROUP, x_is_masked=True,
                                                                      config=dict(UNION_IN_REGS=True))
                          for i in range(copies)],
            "down_split1": [lambda h=h[i], w=wd[i]: input_group_linear(
                h, w, mask, GROUP, x_is_masked=True,
                config=dict(BLOCK_N=32, BLOCK_K=128, SPLIT=1, num_warps=4, num_stages=12)) for i in range(copies)],
            "cublas_down_k": [lambda h=h_k[i], w=wd_k[i]: F.linear(h, w) for i in range(copies)],
            "gate_up": [lambda x=x[i], a=wg[i], b=wu[i]: gated_up_groups(x, a, b, mask, GROUP, "silu", None)
                        for i in range(r_gu)],
            "cublas_gate_up_k": [lambda x=x[i], w=wgu_k[i]: F.linear(x, w) for i in range(r_gu)],
        }
        ref = h[0].float() @ wd[0].float().t()
        for name in ("down", "down_plan_union", "down_regs", "down_split1"):
            got = timed[name][0]().float()
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            if err > 2e-2:
                raise SystemExit(f"{name} k={k}: relative error {err:.3g}")
        samples = {name: [] for name in timed}
        for _ in range(args.rounds):
            for name, fns in timed.items():
                samples[name].append(bench_graph(fns))
        med = {name: statistics.median(v) for name, v in samples.items()}
        rows.append(dict(k=k, copies_down=copies, copies_gate_up=r_gu, us=med, us_rounds=samples))
        print(f"k={k:3d}: " + "  ".join(f"{n} {v:6.2f}" for n, v in med.items()), flush=True)
        del wd_k, wgu_k
        torch.cuda.empty_cache()
    group_bytes = {"down": HIDDEN * GROUP * 2, "gate_up": 2 * GROUP * HIDDEN * 2}
    fits = {}
    for name in rows[0]["us"]:
        f0, b = fit([r["k"] for r in rows], [r["us"][name] for r in rows])
        nbytes = group_bytes["gate_up" if "gate_up" in name else "down"]
        fits[name] = dict(fixed_us=f0, us_per_group=b, marginal_TBps=nbytes / (b * 1e-6) / 1e12)
        print(f"{name:18s} F = {f0:5.2f} us, {b:.3f} us per group, marginal {fits[name]['marginal_TBps']:.2f} TB/s")
    meta = dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                command=" ".join(["python3", *sys.argv]))
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows, fits=fits), f, indent=1)


if __name__ == "__main__":
    main()
