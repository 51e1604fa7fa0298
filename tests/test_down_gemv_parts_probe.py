"""benchmarks/down_gemv_parts_probe.py: the probe's kernel, which builds the down GEMV up from a bare tile read, must
compute what each of its parts claims (interpreter, small sizes, fp16: the interpreter mis-computes bf16 dots)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

N, BLOCK_N, BLOCK_T, GROUP = 64, 32, 32, 128


@pytest.fixture(scope="module")
def probe():
    import down_gemv_parts_probe as module

    return module


def _run(probe, w, x, mask, split, x_tile=False, mask_mode=0, finish=False, rotate=False):
    tiles = N // BLOCK_N
    out = torch.full((N * BLOCK_T,), float("nan"))
    work = torch.full((tiles * split * 2 * BLOCK_N * BLOCK_T,), probe.SENTINEL, dtype=torch.int32).view(torch.float32)
    counters = torch.zeros(tiles * (1 + split), dtype=torch.int32)
    probe._parts_kernel[(tiles * split,)](
        w, x, mask, out, work, counters, x.shape[0], N, w.shape[1], mask.shape[1], SPLIT=split, BLOCK_N=BLOCK_N,
        BLOCK_K=GROUP, BLOCK_T=BLOCK_T, STAGES=2, X_TILE=x_tile, MASK=mask_mode, FINISH=finish,
        ROTATE=rotate)
    assert not counters.any()  # the finish leaves its counters (and flags) at zero for the next call
    if finish == 3:  # ... and its workspace empty
        assert (work.view(torch.int32) == probe.SENTINEL).all()
    return out.view(N, BLOCK_T)


@pytest.mark.parametrize("groups", [4, 100])  # one word of group bits, both
def test_every_part_on_gives_the_masked_product(probe, groups):
    gen = torch.Generator().manual_seed(groups)
    m, k = 20, groups * GROUP
    w = torch.randn(N, k, generator=gen).to(torch.float16)
    x = torch.randn(m, k, generator=gen).to(torch.float16)
    mask = (torch.rand(m, groups, generator=gen) < 0.3).to(torch.uint8)
    mask[:, 1] = 0  # a group no token uses
    xm = x * mask.to(x.dtype).repeat_interleave(GROUP, dim=1)
    ref = xm.float() @ w.float().t()
    got = _run(probe, w, x, mask, split=2, x_tile=True, mask_mode=1, finish=True)  # mask row per step
    torch.testing.assert_close(got[:, :m].t(), ref, rtol=1e-4, atol=1e-3)
    got = _run(probe, w, xm, mask, split=2, x_tile=True, mask_mode=2, finish=True)  # group bits, pre-masked input
    torch.testing.assert_close(got[:, :m].t(), ref, rtol=1e-4, atol=1e-3)
    for finish in (2, 3):  # the arrival counted first: flags, or partials that signal their own arrival
        got = _run(probe, w, x, mask, split=4, x_tile=True, mask_mode=1, finish=finish)
        torch.testing.assert_close(got[:, :m].t(), ref, rtol=1e-4, atol=1e-3)
    for split in (1, 2):  # each tile's K loop started at its own step and wrapped around
        got = _run(probe, w, xm, mask, split=split, x_tile=True, mask_mode=2, finish=split > 1, rotate=True)
        torch.testing.assert_close(got[:, :m].t(), ref, rtol=1e-4, atol=1e-3)
    read = _run(probe, w, x, mask, split=1, mask_mode=2)  # no token tile: each row's sum over the used groups
    used = mask.any(0).to(torch.float32).repeat_interleave(GROUP)
    torch.testing.assert_close(read[:, 0], (w.float() * used).sum(1), rtol=1e-4, atol=1e-3)
