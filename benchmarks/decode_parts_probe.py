"""Probe (stop 28): what the decode attention's two launches cost apart. ``split_only`` runs the split kernel with the
reduction launch replaced by nothing, ``reduce_only`` the reduction after no split kernel (outputs wrong; times only),
beside the default and SDPA, through decode_split_rule.py's bench_shape. Run from benchmarks/: ``python
decode_parts_probe.py --out-dir OUT --rounds 5 --shapes 16:4096,4:16384,1:32768 --name decode_parts.json``."""
import sys, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_split_rule as d
from wide_compile.templates import attention_decode as ad
class Noop:
    def __getitem__(self, grid):
        return lambda *a, **k: None
real_split, real_reduce = ad._decode_split_kernel, ad._decode_reduce_kernel
def make(which):
    def launch(*a, **k):
        if which == "split_only":
            ad._decode_reduce_kernel = Noop()
        elif which == "reduce_only":
            ad._decode_split_kernel = Noop()
        try:
            return ad.launch_decode(*a, **k)
        finally:
            ad._decode_split_kernel, ad._decode_reduce_kernel = real_split, real_reduce
    return launch
orig = d.candidates
def candidates(batch_kv, kv_len, sms):
    out = orig(batch_kv, kv_len, sms)
    out.pop("pps16"); out.pop("pps4")
    out["split_only"] = out["default"]; out["reduce_only"] = out["default"]
    return out
d.candidates = candidates
labels_launch = {}  # bench_shape maps every label to d.launch_decode: route by the config object instead
def launch_router(q, k, v, mask, out, dims, causal, splits, cfg):
    return labels_launch.get(id(cfg), ad.launch_decode)(q, k, v, mask, out, dims, causal, splits, cfg)
def candidates2(batch_kv, kv_len, sms):
    out = candidates(batch_kv, kv_len, sms)
    for lab in ("split_only", "reduce_only"):
        s, c = out[lab]; c = dict(c); out[lab] = (s, c); labels_launch[id(c)] = make(lab)
    return out
d.candidates = candidates2
d.launch_decode = launch_router
d.SPARSITIES = (0.0, 0.5)
d.main()
