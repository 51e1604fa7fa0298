"""Probe (stop 30): is the input-group row GEMV's in-model slowness a matter of the weights' footprint (TLB reach)?

In the 8B model's decode step the row kernel takes about 12.3 µs per output projection against 7.8 on the split-K
GEMV, while alone it is faster. Here: output-projection-shaped weights (4096 x 4096 bf16), one token, 50% masks (a
draw per copy), x pre-masked; CUDA-graph replays over 6 / 48 / 400 rotated copies (0.2 / 1.5 / 12.5 GiB, the last
about the 8B model's weights); MMA GEMV (``ROWS=0``) against the row kernel (``ROWS=2``) and cuBLAS dense, medians
of 3 interleaved rounds. Result (``results/row_gemv_footprint_probe.txt``): the row kernel stays faster at every
footprint (7.18 against 8.01 µs at 12.5 GiB), so the footprint is not the cause.

    python3 benchmarks/row_gemv_footprint_probe.py   (repository root, CUDA)
"""
import sys, statistics
sys.path.insert(0, "benchmarks")
import torch
import torch.nn.functional as F
from kernels_linear import bench_graph
from wide_compile.templates import input_group_linear

torch.manual_seed(0)
K = N = 4096
gs = 512
for copies in (6, 48, 400):
    ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / 64 for _ in range(copies)]
    masks = [torch.rand(1, 8, device="cuda") < 0.5 for _ in range(copies)]
    xs = [torch.randn(1, K, device="cuda", dtype=torch.bfloat16) * m.repeat_interleave(gs, -1) for m in masks]
    fns = {
        "mma": [lambda i=i: input_group_linear(xs[i], ws[i], masks[i], gs, x_is_masked=True, config={"ROWS": 0})
                for i in range(copies)],
        "rows2": [lambda i=i: input_group_linear(xs[i], ws[i], masks[i], gs, x_is_masked=True,
                                                 config={"ROWS": 2, "num_warps": 4}) for i in range(copies)],
        "cublas": [lambda i=i: F.linear(xs[i], ws[i]) for i in range(copies)],
    }
    res = {k: [] for k in fns}
    for _ in range(3):
        for k, f in fns.items():
            res[k].append(bench_graph(f, reps=9))
    print(f"copies {copies:4d} ({copies * N * K * 2 / 2**30:.1f} GiB): " +
          "  ".join(f"{k} {statistics.median(v):6.2f}us" for k, v in res.items()), flush=True)
    del ws, xs, masks, fns
    torch.cuda.empty_cache()
