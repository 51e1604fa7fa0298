"""benchmarks/kernels_attention.py: the decode rows' read reference reads exactly the active pairs' K and V bytes
(interpreter, small sizes, fp16 half-integers: exact sums whatever the order)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.mark.parametrize("active_pairs", [0, 3, 8])
def test_kv_read_thunks_read_the_active_pairs_bytes(active_pairs):
    import kernels_attention as ka
    import stream_read

    s, sms = 32, 2
    bufs = ka.kv_read_buffers(1, s, 2, device="cpu", dtype=torch.float16)
    gen = torch.Generator().manual_seed(active_pairs)
    for b in bufs:
        b.copy_(torch.randint(-8, 8, b.shape, generator=gen).float() + 0.5)
    assert bufs[0].numel() == 2 * ka.HKV * s * ka.D  # K and V of every (batch, KV head) pair
    thunks, out = ka.kv_read_thunks(bufs, active_pairs, s, sms)
    assert set(thunks) == set(stream_read.READ_VARIANTS)
    numel = active_pairs * 2 * s * ka.D
    for label, fns in thunks.items():
        kind, shape = stream_read.READ_VARIANTS[label]
        programs = shape[0] * sms if kind == "reg" else stream_read._dot_programs(numel, ka.READ_ROW, shape[0])
        for buf, fn in zip(bufs, fns):
            out.fill_(float("nan"))
            fn()
            assert torch.equal(out[:programs].double().sum(), buf[:numel].double().sum()), label
