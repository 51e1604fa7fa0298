"""Probe (stop 28) of the balanced decode kernel's variants against the split-KV default, through decode_split_rule.py's
bench_shape: ``bal_both`` = q of both pairs loaded before the loop and selected per block (Q_SELECT) and the first pair's
partial stored under a branch (FLUSH_BRANCH); ``bal_hoist`` = the same with the reduction reading every pair's flags
beside its own (REDUCE_HOIST). Run from benchmarks/: ``python decode_balanced_probe.py --out-dir OUT --rounds 3
--shapes 16:4096,... --name decode_balanced_v3.json`` (results/decode_balanced_v3.json; v2 timed Q_SELECT and
FLUSH_BRANCH one at a time and together, and 4 stages, at 25% and 50%)."""
import sys, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_split_rule as d
from wide_compile.templates import attention_decode_balanced as ab, attention_decode as ad
orig = d.candidates
def launch(q, k, v, mask, out, dims, causal, splits=None, cfg=None):
    cfg = dict(cfg) if cfg else cfg
    ab.REDUCE_HOIST = bool(cfg and cfg.pop("_HOIST", False))
    try:
        return ad.launch_decode(q, k, v, mask, out, dims, causal, splits, cfg)
    finally:
        ab.REDUCE_HOIST = False
def candidates(batch_kv, kv_len, sms):
    out = orig(batch_kv, kv_len, sms)
    out.pop("pps16"); out.pop("pps4"); out.pop("balanced")
    base = dict(BLOCK_N=128, num_warps=4, num_stages=3, Q_SELECT=True, FLUSH_BRANCH=True)
    out["bal_both"] = (None, base)
    out["bal_hoist"] = (None, dict(base, _HOIST=True))
    return out
d.candidates = candidates
d.launch_decode = launch
d.SPARSITIES = (0.0, 0.25, 0.5)
d.main()
