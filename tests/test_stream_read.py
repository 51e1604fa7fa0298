"""benchmarks/stream_read.py: the read-only kernel whose time is the floor beside issue 4's linear rows (interpreter,
small sizes: it must read exactly the first ``numel`` elements, no more, no fewer)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.fixture(scope="module")
def stream_read():
    import stream_read as module

    return module


@pytest.mark.parametrize("numel, programs, block, unroll", [(4096, 2, 256, 1), (5000, 3, 256, 2), (1, 4, 128, 1),
                                                            (999, 1, 128, 4)])
def test_read_sums_exactly_the_first_numel_elements(stream_read, numel, programs, block, unroll):
    gen = torch.Generator().manual_seed(numel)
    # small half-integers: exact in bf16 and in the fp32 sums, whatever the order of the additions
    src = (torch.randint(-8, 8, (6000,), generator=gen).float() + 0.5).to(torch.bfloat16)
    out = torch.full((8,), float("nan"))
    stream_read.read_call(src, numel, out, programs, block, 4, unroll)()
    assert torch.equal(out[:programs].double().sum(), src[:numel].double().sum())


@pytest.mark.parametrize("rows, row, block_n, block_k", [(10, 64, 4, 32), (7, 128, 16, 64), (16, 32, 16, 32),
                                                         (0, 64, 16, 32)])
def test_pipelined_read_sums_exactly_the_first_rows(stream_read, rows, row, block_n, block_k):
    """fp16 (the interpreter mis-computes bf16 dots); ragged last tile; no rows (a draw whose union is empty)."""
    gen = torch.Generator().manual_seed(rows * row)
    src = (torch.randint(-8, 8, (20 * 128,), generator=gen).float() + 0.5).to(torch.float16)
    out = torch.full((8,), float("nan"))
    call, programs = stream_read.read_dot_call(src, rows * row, out, row, block_n, block_k, 2, 4)
    call()
    assert programs == max(1, -(-rows // block_n))
    assert torch.equal(out[:programs].double().sum(), src[: rows * row].double().sum())


def test_read_fns_give_each_copy_its_own_length(stream_read, monkeypatch):
    monkeypatch.setattr(stream_read, "READ_VARIANTS", {"reg": ("reg", (1, 256, 4, 1)), "dot": ("dot", (8, 32, 2, 4))})
    srcs = [torch.ones(3072, dtype=torch.float16), torch.full((3072,), 2.0, dtype=torch.float16)]
    numels = [128, 2560]
    out = torch.zeros(stream_read.out_elements(numels, 2, 64))
    assert out.numel() == 5  # 2560 / 64 = 40 rows in tiles of 8; 2 register programs
    for variant in ("reg", "dot"):
        fns = stream_read.read_fns(srcs, numels, out, variant, 2, 64)
        out.zero_()
        fns[0]()
        assert out.sum().item() == 128
        out.zero_()
        fns[1]()
        assert out.sum().item() == 5120


def test_pipelined_read_needs_whole_rows(stream_read):
    with pytest.raises(ValueError, match="whole rows of 64"):
        stream_read.read_dot_call(torch.ones(256, dtype=torch.float16), 100, torch.zeros(4), 64, 16, 32, 2, 4)


@pytest.mark.parametrize("kwargs, match", [({"numel": -1}, "numel=-1"), ({"numel": 10**6}, "outside"),
                                           ({"src": torch.ones(64)}, "bf16 or fp16"), ({"programs": 9}, ">= 9 fp32")])
def test_bad_arguments_are_named(stream_read, kwargs, match):
    args = dict(src=torch.ones(64, dtype=torch.bfloat16), numel=64, out=torch.zeros(8), programs=2, block=64,
                warps=4, unroll=1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        stream_read.read_call(**args)
