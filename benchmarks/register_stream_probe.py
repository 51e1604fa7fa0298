"""Probe: a Triton kernel that only streams N bytes through register loads, against cuBLAS's GEMV on a weight of the
same N bytes (stop 29; the question was stop 28's untried idea, a non-MMA GEMV that streams whole weight rows).

Each program of ``stream_read._read_kernel`` sums its contiguous chunk of a bf16 buffer with plain ``tl.load`` steps (no
shared-memory pipeline: Triton 3.6 software-pipelines only loads that feed a dot), ``UNROLL`` loads of ``BLOCK``
elements issued per step, and stores one fp32. Grid: 1-8 programs per SM x 8-16 KB steps x 1 / 4 / 8 loads per step;
the fastest variant per size is reported next to cuBLAS's one-token GEMV (``F.linear`` of a ``[1, 4096]`` input on the
same bytes as a ``[N / 8 KB, 4096]`` weight) and an empty launch, for the byte counts of the decode rows (8-234 MB).
Result (``results/register_stream_probe.json``): below about 50 MB the register-load kernel is faster than cuBLAS's
GEMV (8 MB: 4.6 against 7.7 µs) and than the library's cp.async GEMVs, from 58 MB it is slower; hence
``templates/gemv_rows.py`` for the one-token GEMVs of small weights.

    python3 benchmarks/register_stream_probe.py --out FILE.json [--rounds 3]

Timing: ``kernels_linear.bench_graph`` (CUDA-graph replays of R rotated copies, R x bytes >= 180 MB, median of 25
replays divided by R), every variant of one size in ``--rounds`` interleaved rounds, median over rounds.
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
from kernels_linear import bench_graph, ceilings  # noqa: E402
from stream_read import read_call  # noqa: E402

MB = 1 << 20
SIZES_MB = (8, 16, 32, 58, 64, 117, 128, 134, 234)  # q/o 25-100%, down 50% / 100%, gate/up 50%, attention B16 S4k
PER_SM_PROGRAMS = (16, 32, 64, 132)


@triton.jit
def _empty_kernel(out_ptr):
    pass


def read_fns(srcs: list, out: torch.Tensor, programs: int, block: int, warps: int, unroll: int) -> list:
    return [read_call(s, s.numel(), out, programs, block, warps, unroll) for s in srcs]


def variants(sms: int) -> dict:
    """(programs, BLOCK, warps, UNROLL): 1-8 programs per SM, 8-64 KB in flight per program."""
    return {f"p{per_sm * sms}_b{block}_w{warps}_u{unroll}": (per_sm * sms, block, warps, unroll)
            for per_sm in (1, 2, 4, 8) for block, warps in ((4096, 4), (8192, 8)) for unroll in (1, 4, 8)}


def rotations(nbytes: int) -> int:
    return max(2, min(48, -(-180 * MB // nbytes)))


def probe_size(size_mb: int, sms: int, rounds: int) -> dict:
    numel = size_mb * MB // 2
    nbytes = numel * 2
    r = rotations(nbytes)
    srcs = [torch.randn(numel, device="cuda", dtype=torch.bfloat16) for _ in range(r)]
    out = torch.empty(8 * sms, device="cuda", dtype=torch.float32)
    grid = variants(sms)
    timed = {name: read_fns(srcs, out, *v) for name, v in grid.items()}
    k_dim = 4096
    ws = [s.view(numel // k_dim, k_dim) for s in srcs]
    xs = [torch.randn(1, k_dim, device="cuda", dtype=torch.bfloat16) for _ in range(r)]
    timed["cublas_gemv"] = [lambda w=w, x=x: F.linear(x, w) for w, x in zip(ws, xs)]
    samples = {k: [] for k in timed}
    for _ in range(rounds):
        for k, fns in timed.items():
            samples[k].append(bench_graph(fns))
    med = {k: statistics.median(v) for k, v in samples.items()}
    reads = {k: v for k, v in med.items() if k != "cublas_gemv"}
    best = min(reads, key=reads.get)
    ref = float(srcs[0].double().sum())
    programs = grid[best][0]
    read_fns(srcs[:1], out, *grid[best])[0]()
    got = float(out[:programs].double().sum())
    rel = abs(got - ref) / max(1.0, abs(ref))
    del srcs, ws
    torch.cuda.empty_cache()
    return dict(size_MB=nbytes / MB, bytes=nbytes, rotations=r, best=best, best_us=reads[best],
                best_TBps=nbytes / (reads[best] * 1e-6) / 1e12, cublas_gemv_us=med["cublas_gemv"],
                sum_rel_err=rel, us=med, us_rounds=samples)


def probe_per_sm(sms: int, rounds: int, chunk_kb: int = 512) -> list:
    """P programs (P <= SMs: at most one per SM) each streaming ``chunk_kb``: the rate one SM reaches alone."""
    rows = []
    for programs in PER_SM_PROGRAMS:
        numel = programs * chunk_kb * 1024 // 2
        r = rotations(numel * 2)
        srcs = [torch.randn(numel, device="cuda", dtype=torch.bfloat16) for _ in range(r)]
        out = torch.empty(programs, device="cuda", dtype=torch.float32)
        timed = {f"b{b}_w{w}_u{u}": read_fns(srcs, out, programs, b, w, u)
                 for b, w in ((4096, 4), (8192, 8)) for u in (1, 4, 8)}
        samples = {k: [] for k in timed}
        for _ in range(rounds):
            for k, fns in timed.items():
                samples[k].append(bench_graph(fns))
        med = {k: statistics.median(v) for k, v in samples.items()}
        best = min(med, key=med.get)
        rows.append(dict(programs=programs, chunk_KB=chunk_kb, best=best, best_us=med[best],
                         per_SM_GBps=chunk_kb * 1024 / (med[best] * 1e-6) / 1e9,
                         total_TBps=numel * 2 / (med[best] * 1e-6) / 1e12, us=med))
        print(f"per-SM: {programs:4d} programs x {chunk_kb} KB: {med[best]:7.2f} us ({best}), "
              f"{rows[-1]['per_SM_GBps']:6.1f} GB/s per program, {rows[-1]['total_TBps']:5.2f} TB/s", flush=True)
        del srcs
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES_MB), help="MB, comma-separated")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.empty(sms, device="cuda")
    empty = statistics.median(bench_graph([lambda: _empty_kernel[(sms,)](out)] * 8) for _ in range(args.rounds))
    print(f"empty launch ({sms} programs): {empty:.2f} us", flush=True)
    sizes = []
    for s in (int(v) for v in args.sizes.split(",")):
        row = probe_size(s, sms, args.rounds)
        sizes.append(row)
        print(f"{row['size_MB']:7.1f} MB: register loads {row['best_us']:7.2f} us ({row['best']}), "
              f"{row['best_TBps']:5.2f} TB/s; cuBLAS GEMV {row['cublas_gemv_us']:7.2f} us; "
              f"sum rel err {row['sum_rel_err']:.1e}", flush=True)
    per_sm = probe_per_sm(sms, args.rounds)
    meta = dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                command=" ".join(["python3", *sys.argv]), ceilings=ceilings(), empty_launch_us=empty)
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, sizes=sizes, per_sm=per_sm), f, indent=1)


if __name__ == "__main__":
    main()
