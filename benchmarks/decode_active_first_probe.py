"""Probe (stop 28): the decode split kernel with ACTIVE_FIRST (the first programs of the grid take the active pairs'
chunks) against the default (results/decode_active_first.json; run from benchmarks/: --out-dir OUT --rounds 5
--shapes 16:4096,4:16384,16:16384,1:32768,4:4096,4:32768)."""
import sys, os, triton
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_split_rule as d
orig = d.candidates
def candidates(batch_kv, kv_len, sms):
    out = orig(batch_kv, kv_len, sms)
    out.pop("pps16"); out.pop("pps4")
    s, c = out["default"]
    if s > 1:
        out["active_first"] = (s, dict(c, ACTIVE_FIRST=True, BLOCK_P=max(2, triton.next_power_of_2(batch_kv))))
    return out
d.candidates = candidates
d.SPARSITIES = (0.0, 0.25, 0.5, 0.7)
d.main()
