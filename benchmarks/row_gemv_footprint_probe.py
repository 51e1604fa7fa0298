"""Probe (stop 30): is the input-group row GEMV's in-model slowness a matter of the weights' footprint (TLB reach)?

In the 8B model's decode step the row kernel takes about 12.3 µs per output projection against 7.8 on the split-K
GEMV, while alone it is faster. Here: output-projection-shaped weights (4096 x 4096 bf16), one token, 50% masks (a
draw per copy), x pre-masked; CUDA-graph replays over 6 / 48 / 400 rotated copies (0.2 / 1.5 / 12.5 GiB, the last
about the 8B model's weights); MMA GEMV (``ROWS=0``) against the row kernel (``ROWS=2``) and cuBLAS dense, medians
of 3 interleaved rounds. Result (``results/row_gemv_footprint_probe.txt``): the row kernel stays faster at every
footprint (7.18 against 8.01 µs at 12.5 GiB), so the footprint is not the cause. The second run
(``row_gemv_footprint_probe_masks.txt``) adds 0 / 1 bf16 and fp32 masks, as the model's routers give: the row kernel
then takes 13.05 / 12.95 µs (bool 7.20), the in-model time. After the fix (float masks read through an integer
view, ``gemv_rows.integer_mask``; ``row_gemv_footprint_probe_fixed.txt``): bool / bf16 / fp32 7.18 / 7.32 / 7.45 µs
against the split-K GEMV's 7.94 / 8.33 / 8.54.

    python3 benchmarks/row_gemv_footprint_probe.py [COPIES:DTYPE,...]   (repository root, CUDA)
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
MASK_DTYPE = {"bool": torch.bool, "bf16": torch.bfloat16, "fp32": torch.float32}
cases = [(c, "bool") for c in (6, 48, 400)] + [(48, "bf16"), (48, "fp32")]
if len(sys.argv) > 1:  # e.g. "48:bf16,48:bool"
    cases = [(int(c), d) for c, d in (p.split(":") for p in sys.argv[1].split(","))]


def run_case(copies: int, mask_dtype: str) -> None:
    ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / 64 for _ in range(copies)]
    masks = [(torch.rand(1, 8, device="cuda") < 0.5).to(MASK_DTYPE[mask_dtype]) for _ in range(copies)]
    xs = [(torch.randn(1, K, device="cuda") * m.repeat_interleave(gs, -1).float()).to(torch.bfloat16) for m in masks]
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
    print(f"copies {copies:4d} ({copies * N * K * 2 / 2**30:.1f} GiB), {mask_dtype:4s} masks: " +
          "  ".join(f"{k} {statistics.median(v):6.2f}us" for k, v in res.items()), flush=True)


for copies, mask_dtype in cases:
    run_case(copies, mask_dtype)
    torch.cuda.empty_cache()
