"""Probe (stop 28): the fused gate/up GEMV at 32 and 64 tokens with 64-wide K steps and 6-8 stages, 8 warps, 32-row
tiles, against its default (64 rows, 128-wide steps, 4 stages); 5 interleaved rounds. Run from the repo root with
OUT set: writes $OUT/kernels_linear_sweep_gated_64_tokens.json (the committed file was made by the same code as
.device-scripts/g64.py)."""
import sys, os, json, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernels_linear as kl
from kernels_linear_sweeps import _gated_gemv
gen = torch.Generator(device="cuda").manual_seed(0)
G = _gated_gemv
configs = [G(64, 128, 4), G(64, 64, 6), G(64, 64, 8), G(64, 64, 8, 8), G(64, 64, 7), G(64, 128, 4, 8), G(32, 64, 8)]
sweeps = [("gate_up", m, mask, configs) for m in (64, 32) for mask in ("rand50", "pattern50")]
rows = kl.run_sweep(gen, sweeps, repeat=5)
json.dump({"command": "python benchmarks/gated_64_tokens_probe.py", "sweep": rows}, open(os.path.join(os.environ["OUT"], "kernels_linear_sweep_gated_64_tokens.json"), "w"), indent=1)
