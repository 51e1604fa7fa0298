"""Probe (stop 30): the input-group row GEMV against the dtype of its mask (the question: why it took 12.3 µs per
8B output projection in the decode step and about 7.5 alone).

Output-projection-shaped weights (4096 x 4096 bf16), one token, 50% masks (a draw per copy, 48 rotated copies),
``gemv_rows.input_rows_gemv`` called directly with the same masks as uint8, bf16, bf16 viewed as int16, int32 and
fp32; outputs checked equal; medians of 3 interleaved rounds of CUDA-graph replays. Result, run on the kernel
before stop 30 read float masks through an integer view (``results/row_gemv_mask_dtype_probe.txt``): uint8 7.44,
bf16 13.20, bf16 as int16 7.47, int32 7.44, fp32 12.91 µs. The model's masks are bf16. Run now, the bf16 and fp32
rows take the integer path too (``gemv_rows.integer_mask``).

    python3 benchmarks/row_gemv_mask_dtype_probe.py   (repository root, CUDA)
"""
import sys, statistics
sys.path.insert(0, "benchmarks")
import torch
from kernels_linear import bench_graph
import wide_compile.templates.gemv_rows as gr

K = N = 4096; gs = 512; copies = 48
ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / 64 for _ in range(copies)]
base = [(torch.rand(1, 8, device="cuda") < 0.5) for _ in range(copies)]
xs = [(torch.randn(1, K, device="cuda") * m.repeat_interleave(gs, -1).float()).to(torch.bfloat16) for m in base]
views = {
    "u8": [m.view(torch.uint8) for m in base],
    "bf16": [m.to(torch.bfloat16) for m in base],
    "bf16_as_i16": [m.to(torch.bfloat16).view(torch.int16) for m in base],
    "i32": [m.to(torch.int32) for m in base],
    "fp32": [m.to(torch.float32) for m in base],
}
fns = {k: [lambda i=i, v=v: gr.input_rows_gemv(xs[i], ws[i], None, v[i], gs, {"ROWS": 2, "num_warps": 4})
           for i in range(copies)] for k, v in views.items()}
ref = gr.input_rows_gemv(xs[0], ws[0], None, views["u8"][0], gs, {"ROWS": 2, "num_warps": 4}).float()
for k in views:
    out = fns[k][0]().float()
    assert torch.equal(out, ref), k
res = {k: [] for k in fns}
for _ in range(3):
    for k, f in fns.items():
        res[k].append(bench_graph(f, reps=9))
print("row kernel, 48 copies, mask dtype -> us: " + "  ".join(f"{k} {statistics.median(v):.2f}" for k, v in res.items()))
