"""Probe (stop 28): the decode split kernel's K/V loads with eviction_policy evict_first / evict_last against the default
(results/decode_evict.json; run from benchmarks/: --out-dir OUT --rounds 5 --shapes 16:4096,4:16384,1:32768,4:4096)."""
import sys, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_split_rule as d
orig = d.candidates
def candidates(batch_kv, kv_len, sms):
    out = orig(batch_kv, kv_len, sms)
    out.pop("pps16"); out.pop("pps4")
    s, c = out["default"]
    out["evict_first"] = (s, dict(c, EVICT="evict_first"))
    out["evict_last"] = (s, dict(c, EVICT="evict_last"))
    return out
d.candidates = candidates
d.SPARSITIES = (0.0, 0.5)
d.main()
