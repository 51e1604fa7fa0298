"""Probe (stop 31): the fused gate/up GEMV at 32 and 64 tokens with pipelines small enough for two programs per SM.

At 64 tokens the default (64 rows, 128-wide K steps, 4 stages of (2 x 64 + 64) x 128 bf16 = 48 KB) holds one
program per SM, so its 224 programs (every group used) run in 1.7 waves; stop 28's probe tried deeper 64-wide
pipelines (6-8 stages, still one per SM). Here: 128-wide steps with 2 stages, 64-wide steps with 3-4 stages (96 KB or
less: two per SM, one wave), 5 interleaved rounds, random and clustered masks. Run from the repo root:

    OUT=DIR python3 benchmarks/gated_two_per_sm_probe.py    # writes DIR/kernels_linear_sweep_gated_two_per_sm.json
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernels_linear as kl  # noqa: E402
from kernels_linear_sweeps import _gated_gemv as G  # noqa: E402

configs = [G(64, 128, 4), G(64, 128, 2), G(64, 64, 4), G(64, 64, 3), G(64, 128, 3)]
sweeps = [("gate_up", m, mask, configs) for m in (64, 32) for mask in ("rand50", "pattern50")]
rows = kl.run_sweep(torch.Generator(device="cuda").manual_seed(0), sweeps, repeat=5)
with open(os.path.join(os.environ["OUT"], "kernels_linear_sweep_gated_two_per_sm.json"), "w") as f:
    json.dump({"command": "python3 benchmarks/gated_two_per_sm_probe.py", "sweep": rows}, f, indent=1)
