"""Diagnostic: the memset cuBLAS puts before some of its Hopper GEMMs inside a CUDA graph, and ways to call the same
product without it (H200, the Llama-3-8B prefill's dense projections at 4096 tokens).

In the 8B-shape prefill profile (``notes_e2e.md``, stop 22) a ``Memset`` node precedes the cuBLAS GEMM of the output
and down projections, and each is followed by a ~4 µs gap before the GEMM starts (0.26 ms per 4096-token prefill;
the dense model has more). Each variant below computes ``x @ W^T`` inside a CUDA graph, preceded by a small Triton /
ATen pointwise kernel as in the model (the residual add that produced ``x``), on rotated weights; reported per call:
median µs, the memsets and kernels one replay runs (``torch.profiler``), and the largest difference from
``F.linear``:

- ``linear``: ``F.linear(x, W)`` (what the model runs; cuBLAS through ``at::cuda::blas::gemm``);
- ``addmm_zero_bias``: ``torch.addmm(zeros(N), x, W^T)`` (cuBLASLt with a bias epilogue; adding 0 changes nothing);
- ``cublaslt``: ``F.linear`` with ``torch.backends.cuda.preferred_blas_library("cublaslt")`` (restored after).

    python3 benchmarks/cublas_memset_probe.py [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from kernels_attention import capture_graph, replay_ms  # (benchmarks/ is the script's folder)

SHAPES = {"o_proj": (4096, 4096, 4096), "down_proj": (4096, 14336, 4096), "k_proj": (4096, 4096, 1024)}  # M, K, N


def variants(n: int, device: str) -> dict:
    zero = torch.zeros(n, dtype=torch.bfloat16, device=device)
    return {"linear": lambda x, w: F.linear(x, w),
            "addmm_zero_bias": lambda x, w: torch.addmm(zero, x, w.t()),
            "cublaslt": lambda x, w: F.linear(x, w)}


def capture(fn, xs, ws, library: str | None):
    """One CUDA graph of ``fn`` on every rotation (each after the pointwise add that produced x), captured with
    ``library`` as cuBLAS's preferred backend; the graph and its outputs."""
    prev = torch.backends.cuda.preferred_blas_library()
    if library:
        torch.backends.cuda.preferred_blas_library(library)
    try:
        return capture_graph([lambda x=x, w=w: fn(x.add_(0.0), w) for x, w in zip(xs, ws)])
    finally:
        torch.backends.cuda.preferred_blas_library(prev)


def time_graph(graph, calls: int, reps: int = 25) -> float:
    """Median µs per call of one replay of ``graph`` (``calls`` products)."""
    return replay_ms(graph, reps) * 1e3 / calls


def profile_graph(graph, calls: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            key = e.name[:60]
            kernels[key] = kernels.get(key, 0) + 1
    memsets = sum(v for k, v in kernels.items() if "memset" in k.lower())
    return {"memsets_per_call": memsets / calls, "kernels": kernels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "cublas_memset_probe.json"))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, (m, k, n) in SHAPES.items():
        rot = max(2, (180 << 20) // (n * k * 2))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) / k**0.5 for _ in range(rot)]
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2)]
        xs = [xs[i % 2] for i in range(rot)]
        fns = variants(n, "cuda")
        graphs = {v: capture(fn, xs, ws, "cublaslt" if v == "cublaslt" else None) for v, fn in fns.items()}
        ref = graphs["linear"][1][0]
        samples = {v: [] for v in fns}
        for _ in range(args.rounds):  # interleaved rounds
            for v, (graph, _) in graphs.items():
                samples[v].append(time_graph(graph, rot))
        for v, (graph, outs) in graphs.items():
            row = {"shape": name, "M": m, "K": k, "N": n, "variant": v, "rotations": rot,
                   "us_per_call": statistics.median(samples[v]), "rounds_us": samples[v],
                   "max_abs_diff_vs_linear": (outs[0].float() - ref.float()).abs().max().item(),
                   **profile_graph(graph, rot)}
            rows.append(row)
            print(f"{name:9s} {v:16s} {row['us_per_call']:8.1f} us  memsets/call {row['memsets_per_call']:.1f}  "
                  f"diff {row['max_abs_diff_vs_linear']:.2e}  kernels {list(row['kernels'])[:3]}", flush=True)
        del graphs
    meta = {"command": "python3 benchmarks/cublas_memset_probe.py", "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
