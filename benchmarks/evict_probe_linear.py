"""Probe (stop 28): the GEMVs' weight loads with eviction_policy="evict_first" against the default (results/kernels_linear_sweep_evict.json;
run from the repo root with OUT set)."""
import sys, os, json, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernels_linear as kl
gen = torch.Generator(device="cuda").manual_seed(0)
def g(st, **kw): return dict(path="gemv", BLOCK_N=64, BLOCK_K=128, SPLIT=1, num_warps=4, num_stages=st, **kw)
def dn(**kw): return dict(BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=5, SPLIT=4, **kw)
sweeps = [("gate_up", m, "rand50", [g(st), g(st, EVICT="evict_first")]) for m, st in ((1, 4), (4, 3), (16, 3), (64, 4))]
sweeps += [("down", m, "rand50", [dn(), dn(EVICT="evict_first")]) for m in (1, 8)]
sweeps += [("q_proj", m, "rand50", [dict(path="gemv", BLOCK_N=64, BLOCK_K=128, SPLIT=8, num_warps=4, num_stages=4), dict(path="gemv", BLOCK_N=64, BLOCK_K=128, SPLIT=8, num_warps=4, num_stages=4, EVICT="evict_first")]) for m in (1,)]
rows = kl.run_sweep(gen, sweeps, repeat=3)
json.dump({"command": "python .device-scripts/evict_probe.py", "sweep": rows}, open(os.path.join(os.environ["OUT"], "evict_linear.json"), "w"), indent=1)
