"""Masking an input-group linear's input before cuBLAS: PyTorch's two-kernel ``torch.where`` (the reference, what
``group_linear`` ran until stop 32) against ``templates/zero_groups.py``'s one launch, bf16, 50% random masks, the
Llama-3-8B down (112 groups of 128) and output projections (8 groups of 512).

    python3 benchmarks/mask_input_probe.py --out-dir $OUT      # -> mask_input_probe.json

Per shape, R input copies (R x input bytes >= 180 MB, so the copies are not all in L2) run back to back in one CUDA
graph (``kernels_linear.bench_graph``); µs per call, median over interleaved rounds; outputs checked equal first."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_linear import interleaved  # noqa: E402
from wide_compile.templates.zero_groups import zero_inactive_groups, zero_inactive_groups_reference  # noqa: E402

SHAPES = [(m, k, gs) for m in (64, 256, 1024, 4096, 16384) for k, gs in ((14336, 128), (4096, 512))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for m, k, gs in SHAPES:
        copies = max(2, min(64, -(-180 * 2**20 // (m * k * 2))))
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(copies)]
        masks = [(torch.rand(m, k // gs, device="cuda", generator=gen) < 0.5).view(torch.uint8) for _ in range(copies)]
        for x, mk in zip(xs, masks):
            assert torch.equal(zero_inactive_groups(x, mk, gs), zero_inactive_groups_reference(x, mk, gs))
        pairs = list(zip(xs, masks))
        timed = {"torch_where": [lambda x=x, mk=mk: zero_inactive_groups_reference(x, mk, gs) for x, mk in pairs],
                 "triton": [lambda x=x, mk=mk: zero_inactive_groups(x, mk, gs) for x, mk in pairs]}
        med = {key: statistics.median(v) for key, v in interleaved(timed, args.rounds).items()}
        rows.append(dict(M=m, K=k, group_size=gs, copies=copies, **{f"{key}_us": v for key, v in med.items()}))
        print(f"M={m:6d} K={k:6d} gs={gs:4d}  torch.where {med['torch_where']:8.1f} us  triton {med['triton']:8.1f} us",
              flush=True)
        del xs, masks
        torch.cuda.empty_cache()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                command="python3 benchmarks/mask_input_probe.py " + " ".join(sys.argv[1:]))
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "mask_input_probe.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
