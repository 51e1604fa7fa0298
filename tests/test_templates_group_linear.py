"""CPU tests of the group-skipping linear kernels, run by the Triton interpreter (TRITON_INTERPRET=1).

The module fixture sets TRITON_INTERPRET=1 and (re)imports the kernel modules so that their
``@triton.jit`` functions are interpreted; it restores the environment afterwards. Every kernel output
buffer is poisoned with NaN before the call and compared to the fp32 PyTorch reference.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import zlib

import pytest
import torch
from _interpreter import ensure_interpreted_triton

_KERNEL_MODULES = (
    "wide_compile.templates._triton_utils",
    "wide_compile.templates.group_lists_two_pass",
    "wide_compile.templates.group_plan",
    "wide_compile.templates.group_gemm_tiles",
    "wide_compile.templates.gemm_output_groups",
    "wide_compile.templates.gemm_gated_up",
    "wide_compile.templates.gemm_input_groups",
    "wide_compile.templates.gemv_rows",
    "wide_compile.templates.zero_groups",
    "wide_compile.templates.gemv_decode",
    "wide_compile.templates.group_linear",
    "wide_compile.templates.group_linear_with_dense",
)

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed"),
    pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests; tests/test_gpu_group_linear.py runs on GPUs"),
]


def _reload_kernels() -> dict:
    mods = {}
    for name in _KERNEL_MODULES:
        mod = importlib.import_module(name)
        mods[name.rsplit(".", 1)[1]] = importlib.reload(mod)
    return mods


@pytest.fixture(scope="module")
def k():
    """Kernel modules defined under the interpreter; env and modules restored afterwards."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    ensure_interpreted_triton()
    mods = _reload_kernels()
    from wide_compile.templates import group_linear_reference as ref

    mods["ref"] = ref
    yield mods
    if old is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = old
    _reload_kernels()


def _mask(kind: str, m: int, g: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "all":
        return torch.ones(m, g, dtype=torch.bool)
    if kind == "none":
        return torch.zeros(m, g, dtype=torch.bool)
    if kind == "random":
        return torch.rand(m, g, generator=gen) < 0.5
    if kind == "random_bf16":  # router masks arrive as 0.0 / 1.0 floats; the kernels read them as they are
        return (torch.rand(m, g, generator=gen) < 0.5).to(torch.bfloat16)
    # clustered: each token picks one of 3 patterns; given as float (nonzero = active)
    patterns = torch.rand(3, g, generator=gen) < 0.4
    return patterns[torch.randint(0, 3, (m,), generator=gen)].float()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-6)).item()


def _check(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, mask=None, group_size: int = 0) -> None:
    """NaN-free, close to the reference; with ``mask``: outputs of inactive groups exactly 0."""
    assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) outputs remain"
    if mask is not None:
        inactive = (mask == 0).repeat_interleave(group_size, dim=-1)
        assert (out[inactive] == 0).all(), "outputs of inactive groups are not exactly 0"
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    assert _rel(out, ref) < tol, f"relative error {_rel(out, ref):.2e}"
    assert torch.allclose(out.float(), ref.float(), atol=1e-3 if dtype == torch.float32 else 2e-2, rtol=2e-2)


def _seed(*parts) -> int:
    """A seed from a test's parameters, the same in every process (``hash`` of a string is salted per process)."""
    return zlib.crc32(repr(parts).encode())


def _poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype)


DTYPES = [torch.float32, torch.float16]
MASKS = ["all", "none", "random", "random_bf16", "clustered"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 37, 70])
@pytest.mark.parametrize("kind", MASKS)
def test_three_ops_match_reference(k, dtype, m, kind):
    """gate/up -> down with one shared plan, plus an output-group projection with bias (K=192, I=256, gs=64)."""
    gen = torch.Generator().manual_seed(_seed(m, kind, dtype))
    d, inter, gs = 192, 256, 64
    x = torch.randn(m, d, generator=gen).to(dtype)
    wg = (torch.randn(inter, d, generator=gen) / d**0.5).to(dtype)
    wu = (torch.randn(inter, d, generator=gen) / d**0.5).to(dtype)
    wd = (torch.randn(d, inter, generator=gen) / inter**0.5).to(dtype)
    bias = torch.randn(inter, generator=gen).to(dtype)
    mask = _mask(kind, m, inter // gs, gen)
    plan = k["group_plan"].build_group_plan(mask, parts=("output", "input", "union"))
    lin = k["group_linear"]
    path = "gemv" if m <= 16 else "gemm"  # the kernels (the "auto" prefill input-group path is cuBLAS)

    h = lin.gated_up_groups(x, wg, wu, mask, gs, "silu", plan, out=_poisoned((m, inter), dtype))
    _check(h, k["ref"].gated_up_groups_reference(x, wg, wu, mask, gs, "silu"), dtype, mask, gs)
    y = lin.input_group_linear(h, wd, mask, gs, plan=plan, out=_poisoned((m, d), dtype), x_is_masked=True,
                               path=path)
    _check(y, k["ref"].input_group_linear_reference(h, wd, mask, gs), dtype)
    for q_path in ("auto", path):  # "auto" takes the GEMV up to 128 tokens
        q = lin.output_group_linear(x, wg, mask, gs, bias, plan, out=_poisoned((m, inter), dtype), path=q_path)
        _check(q, k["ref"].output_group_linear_reference(x, wg, mask, gs, bias), dtype, mask, gs)
    xd = torch.randn(m, inter, generator=gen).to(dtype)  # not pre-masked: the kernel masks per token
    ref_d = k["ref"].input_group_linear_reference(xd, wd, mask, gs, bias[:d])
    yd = lin.input_group_linear(xd, wd, mask, gs, bias[:d], plan, out=_poisoned((m, d), dtype), path=path)
    _check(yd, ref_d, dtype)
    _check(lin.input_group_linear(xd, wd, mask, gs, bias[:d], plan), ref_d, dtype)  # "auto" path


@pytest.mark.parametrize("path", ["gemm", "gemv"])
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_ragged_shapes_and_forced_paths(k, path, activation):
    """K not a multiple of the K tile, group size 48 (N tile masked), 32, both paths at ragged M."""
    gen = torch.Generator().manual_seed(7)
    dtype = torch.float16
    lin, ref = k["group_linear"], k["ref"]
    m, d = (21, 80) if path == "gemm" else (5, 80)
    for gs, n in ((48, 144), (32, 128)):
        x = torch.randn(m, d, generator=gen).to(dtype)
        w = (torch.randn(n, d, generator=gen) / 9).to(dtype)
        w2 = (torch.randn(n, d, generator=gen) / 9).to(dtype)
        b = torch.randn(n, generator=gen).to(dtype)
        mask = torch.rand(m, n // gs, generator=gen) < 0.6
        # split-K: fp32 atomics (GEMM) / one-launch split with arrival counters (GEMV)
        split_cfg = {"SPLIT": 2} if path == "gemm" else {"SPLIT": 3}
        y = lin.output_group_linear(x, w, mask, gs, b, path=path, out=_poisoned((m, n), dtype),
                                    config=split_cfg if path == "gemv" else None)
        _check(y, ref.output_group_linear_reference(x, w, mask, gs, b), dtype, mask, gs)
        y = lin.output_group_linear(x, w, mask, gs, b, path="dense", out=_poisoned((m, n), dtype))
        _check(y, ref.output_group_linear_reference(x, w, mask, gs, b), dtype, mask, gs)
        h = lin.gated_up_groups(x, w, w2, mask, gs, activation, path=path, out=_poisoned((m, n), dtype),
                                config=split_cfg if path == "gemv" else None)
        _check(h, ref.gated_up_groups_reference(x, w, w2, mask, gs, activation), dtype, mask, gs)
        wd = (torch.randn(d, n, generator=gen) / 12).to(dtype)
        bd = torch.randn(d, generator=gen).to(dtype)
        xd = torch.randn(m, n, generator=gen).to(dtype)
        yd = lin.input_group_linear(xd, wd, mask, gs, bd, path=path, config=split_cfg, out=_poisoned((m, d), dtype))
        _check(yd, ref.input_group_linear_reference(xd, wd, mask, gs, bd), dtype)
        yd = lin.input_group_linear(xd, wd, mask, gs, bd, path="dense", out=_poisoned((m, d), dtype))
        _check(yd, ref.input_group_linear_reference(xd, wd, mask, gs, bd), dtype)


@pytest.mark.parametrize("kind", ["all", "none", "random", "clustered"])
def test_group_gemms_with_tma_weight_tiles(k, kind):
    """gate/up and output-group GEMMs with ``config={"TMA": True}``: weight tiles through tensor descriptors, at ragged M, K not a multiple of the K tile
    (the descriptor's zero fill) and a group size the N tile overhangs (48 in a 64 tile; the box reads the next
    group's rows, which the store masks off)."""
    gen = torch.Generator().manual_seed(11)
    dtype, lin, ref = torch.float16, k["group_linear"], k["ref"]
    for m, d, gs, n in ((37, 80, 48, 144), (70, 128, 64, 256)):
        x = torch.randn(m, d, generator=gen).to(dtype)
        wg = (torch.randn(n, d, generator=gen) / 9).to(dtype)
        wu = (torch.randn(n, d, generator=gen) / 9).to(dtype)
        mask = _mask(kind, m, n // gs, gen)
        h = lin.gated_up_groups(x, wg, wu, mask, gs, "silu", path="gemm", config={"TMA": True},
                                out=_poisoned((m, n), dtype))
        _check(h, ref.gated_up_groups_reference(x, wg, wu, mask, gs, "silu"), dtype, mask, gs)
        bias = torch.randn(n, generator=gen).to(dtype)
        y = lin.output_group_linear(x, wg, mask, gs, bias, path="gemm", config={"TMA": True},
                                    out=_poisoned((m, n), dtype))
        _check(y, ref.output_group_linear_reference(x, wg, mask, gs, bias), dtype, mask, gs)
    w32, x32, on = torch.randn(128, 64), torch.randn(20, 64), torch.ones(20, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="gated_up_gemm: config TMA=True needs contiguous bf16 / fp16 weights"):
        lin.gated_up_groups(x32, w32, w32, on, 64, "silu", path="gemm", config={"TMA": True})
    with pytest.raises(ValueError, match="output_groups_gemm: config TMA=True needs contiguous bf16 / fp16"):
        lin.output_group_linear(x32[:, :60].half(), w32[:, :60].half(), on, 64, path="gemm",
                                config={"TMA": True})  # 120-byte rows


@pytest.mark.parametrize("layout", ["gate_first", "up_first", "separate", "same"])
def test_gated_up_gemm_reads_gate_and_up_through_one_descriptor(k, layout):
    """With TMA the gate and up tiles of a group come as one ``[2, BLOCK_N, BLOCK_K]`` box of a descriptor whose first
    stride is the distance between the two weights (``tma_weights.pair_descriptor``), in either address order and
    across separate allocations; the same tensor twice falls back to one descriptor each. Against the reference, with
    half-height tails, and against ``PAIRED=False``."""
    gen = torch.Generator().manual_seed(13)
    dtype, lin, ref = torch.float16, k["group_linear"], k["ref"]
    m, d, gs, n = 70, 80, 48, 144
    both = (torch.randn(2, n, d, generator=gen) / 9).to(dtype)
    wg, wu = {"gate_first": (both[0], both[1]), "up_first": (both[1], both[0]),
              "separate": (both[0].clone(), both[1].clone()), "same": (both[0], both[0])}[layout]
    from wide_compile.templates.tma_weights import pair_descriptor

    pair = pair_descriptor(wg, wu, 64, 64)
    assert (pair is None) == (layout == "same")
    if layout in ("gate_first", "up_first"):
        assert pair[1] == (layout == "up_first")
        assert pair[0].shape == [2, n, d] and pair[0].strides == [n * d, d, 1] and pair[0].block_shape == [2, 64, 64]
    x = torch.randn(m, d, generator=gen).to(dtype)
    for kind in ("all", "none", "random", "clustered"):
        mask = _mask(kind, m, n // gs, gen)
        outs = []
        for cfg in ({"TMA": True}, {"TMA": True, "TAIL_SPLIT": 2, "BLOCK_M": 32}, {"TMA": True, "PAIRED": False}):
            h = lin.gated_up_groups(x, wg, wu, mask, gs, "silu", path="gemm", config=cfg, out=_poisoned((m, n), dtype))
            _check(h, ref.gated_up_groups_reference(x, wg, wu, mask, gs, "silu"), dtype, mask, gs)
            outs.append(h)
        # (bit-equal on the H200; the interpreter's fp32 matmuls of 2 x 64 and 64 columns may round differently)
        torch.testing.assert_close(outs[0], outs[2], rtol=2e-3, atol=2e-3)
    assert pair_descriptor(wg, wu[:, :64].contiguous(), 64, 64) is None  # shapes differ
    assert pair_descriptor(wg.float(), wu.float(), 64, 64) is None  # TMA takes 16-bit weights only


def test_gated_up_gemm_falls_back_to_two_boxes_past_the_stride_limit(k, monkeypatch):
    """Weights farther apart than TMA's largest stride (2^40 bytes; here the limit lowered) get no pair descriptor,
    and the GEMM runs its two boxes with the same results."""
    from wide_compile.templates import tma_weights

    gen = torch.Generator().manual_seed(14)
    dtype, lin, ref = torch.float16, k["group_linear"], k["ref"]
    m, d, gs, n = 37, 64, 32, 96
    both = (torch.randn(2, n, d, generator=gen) / 9).to(dtype)
    x = torch.randn(m, d, generator=gen).to(dtype)
    mask = _mask("random", m, n // gs, gen)
    assert tma_weights.pair_descriptor(both[0], both[1], 32, 64) is not None
    monkeypatch.setattr(tma_weights, "_MAX_STRIDE_BYTES", n * d * 2)
    assert tma_weights.pair_descriptor(both[0], both[1], 32, 64) is None
    h = lin.gated_up_groups(x, both[0], both[1], mask, gs, "silu", path="gemm", config={"TMA": True},
                            out=_poisoned((m, n), dtype))
    _check(h, ref.gated_up_groups_reference(x, both[0], both[1], mask, gs, "silu"), dtype, mask, gs)


def test_group_gemms_with_warp_specialized_k_loop(k):
    """``config={"WARP_SPECIALIZE": True}`` (the K loop through ``tl.range(..., warp_specialize=True)``, a sweep
    option): same results as the reference, ragged M and K."""
    gen = torch.Generator().manual_seed(12)
    dtype, lin, ref = torch.float16, k["group_linear"], k["ref"]
    m, d, gs, n = 37, 80, 48, 144
    x = torch.randn(m, d, generator=gen).to(dtype)
    wg, wu = ((torch.randn(n, d, generator=gen) / 9).to(dtype) for _ in range(2))
    mask = _mask("random", m, n // gs, gen)
    cfg = {"TMA": True, "WARP_SPECIALIZE": True}
    h = lin.gated_up_groups(x, wg, wu, mask, gs, "silu", path="gemm", config=cfg, out=_poisoned((m, n), dtype))
    _check(h, ref.gated_up_groups_reference(x, wg, wu, mask, gs, "silu"), dtype, mask, gs)
    y = lin.output_group_linear(x, wg, mask, gs, None, path="gemm", config=cfg, out=_poisoned((m, n), dtype))
    _check(y, ref.output_group_linear_reference(x, wg, mask, gs, None), dtype, mask, gs)


@pytest.mark.parametrize("m", [37, 70])
@pytest.mark.parametrize("kind", ["all", "none", "random", "counts"])
def test_output_group_gemms_tail_split(k, m, kind):
    """``TAIL_SPLIT`` (gate/up and the output-group GEMM): a group's last tile with at most half / a quarter of its
    rows active runs the products on that many rows and stores zeros for the rest. With 64-row tiles "counts" gives
    the groups 1, 16, 17, 32, 33, 63, 64 and 65 active tokens: tails at, below and above a quarter and a half.
    16-row tiles keep whole tiles (a half would be below ``tl.dot``'s 16 rows). ``ACTIVE_FIRST`` (tiles below the
    largest count first, zero-only tiles last) must cover every tile once, whatever the counts."""
    gen = torch.Generator().manual_seed(m + len(kind))
    dtype, lin, ref = torch.float16, k["group_linear"], k["ref"]
    d, gs, counts = 80, 16, (1, 16, 17, 32, 33, 63, 64, 65)
    n = gs * len(counts)
    x = torch.randn(m, d, generator=gen).to(dtype)
    wg, wu = ((torch.randn(n, d, generator=gen) / 9).to(dtype) for _ in range(2))
    if kind == "counts":
        mask = torch.zeros(m, len(counts), dtype=torch.bool)
        for g, c in enumerate(counts):
            mask[torch.randperm(m, generator=gen)[: min(c, m)], g] = True
    else:
        mask = _mask(kind, m, len(counts), gen)
    bias = torch.randn(n, generator=gen).to(dtype)
    for cfg in ({"TAIL_SPLIT": 2}, {"TAIL_SPLIT": 2, "TMA": True}, {"TAIL_SPLIT": 4, "BLOCK_M": 64},
                {"TAIL_SPLIT": 4, "BLOCK_M": 64, "TMA": True}, {"TAIL_SPLIT": 2, "BLOCK_M": 16},
                {"TAIL_SPLIT": 2, "BLOCK_M": 16, "ACTIVE_FIRST": True}, {"ACTIVE_FIRST": True, "GROUP_N": 3}):
        h = lin.gated_up_groups(x, wg, wu, mask, gs, "silu", path="gemm", config=cfg, out=_poisoned((m, n), dtype))
        _check(h, ref.gated_up_groups_reference(x, wg, wu, mask, gs, "silu"), dtype, mask, gs)
        y = lin.output_group_linear(x, wg, mask, gs, bias, path="gemm", config=cfg, out=_poisoned((m, n), dtype))
        _check(y, ref.output_group_linear_reference(x, wg, mask, gs, bias), dtype, mask, gs)
    with pytest.raises(ValueError, match="TAIL_SPLIT must be one of"):
        lin.gated_up_groups(x, wg, wu, mask, gs, "silu", path="gemm", config={"TAIL_SPLIT": 3})


def test_gated_up_gemm_default_asks_for_tma_and_falls_back(k, monkeypatch):
    """On the GPU the prefill defaults from 512 tokens load weight tiles through TMA (4 stages up to 8191 tokens, 3
    from 8192) and run half-height last tiles; weights TMA cannot take (fp32) then run the pointer loads instead of
    failing."""
    gemm = k["gemm_gated_up"]
    monkeypatch.setattr(gemm, "interpreting", lambda: False)
    assert gemm.default_config(4096, 128) == dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4,
                                                  TMA=True, TAIL_SPLIT=2, ACTIVE_FIRST=True)
    assert gemm.default_config(8192, 128) == dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3,
                                                  TMA=True, TAIL_SPLIT=2)
    assert gemm.default_config(256, 128) == dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_warps=8, num_stages=4,
                                                 TMA=True, TAIL_SPLIT=2)
    assert "TMA" not in gemm.default_config(64, 128)
    monkeypatch.undo()
    small = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=1, TMA=True)
    monkeypatch.setattr(gemm, "default_config", lambda m, gs: dict(small))
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(20, 64, generator=gen), torch.randn(128, 64, generator=gen) / 8
    mask = torch.rand(20, 2, generator=gen) < 0.5
    h = k["group_linear"].gated_up_groups(x, w, w, mask, 64, "silu", path="gemm", out=_poisoned((20, 128),
                                                                                                   torch.float32))
    _check(h, k["ref"].gated_up_groups_reference(x, w, w, mask, 64, "silu"), torch.float32, mask, 64)


def test_output_group_gemm_default_fills_the_gpu_below_512_tokens(k, monkeypatch):
    """GPU defaults of the query projection's GEMM (8 groups of 512): below 512 tokens the output tile narrows until
    every SM gets a program; from 512 tokens TMA weight tiles (256 columns from 2048 tokens)."""
    gemm = k["gemm_output_groups"]
    monkeypatch.setattr(gemm, "interpreting", lambda: False)
    assert gemm.default_config(64, 512, num_groups=8, sms=132)["BLOCK_N"] == 32  # 1 x 8 x 16 = 128 programs
    assert gemm.default_config(256, 512, num_groups=8, sms=132)["BLOCK_N"] == 64  # 4 x 8 x 8 = 256 programs
    assert gemm.default_config(256, 128, num_groups=112, sms=132)["BLOCK_N"] == 128
    assert gemm.default_config(1024, 512, num_groups=8)["TMA"] and gemm.default_config(1024, 512, 8)["BLOCK_N"] == 128
    assert gemm.default_config(4096, 512, num_groups=8)["BLOCK_N"] == 256
    assert gemm.default_config(4096, 512, num_groups=8)["num_stages"] == 4  # 135.6 -> 118.6 µs on the H200
    assert gemm.default_config(16384, 512, num_groups=8)["num_stages"] == 3


def test_batch_dims_noncontiguous_and_int_mask(k):
    """x[B, T, K] given as a transposed (non-contiguous) view, integer mask with leading dims."""
    gen = torch.Generator().manual_seed(3)
    lin, ref = k["group_linear"], k["ref"]
    xt = torch.randn(2, 128, 20, generator=gen)  # -> x[2, 20, 128] non-contiguous
    x = xt.transpose(1, 2)
    assert not x.is_contiguous()
    w = torch.randn(128, 128, generator=gen) / 11
    mask = torch.randint(0, 3, (2, 20, 4), generator=gen)  # nonzero = active
    y = lin.output_group_linear(x, w.t(), mask, 32)  # non-contiguous weight too
    assert y.shape == (2, 20, 128)
    _check(y, ref.output_group_linear_reference(x, w.t(), mask, 32), torch.float32, mask, 32)
    y = lin.input_group_linear(x, w, mask, 32, path="gemm")
    _check(y, ref.input_group_linear_reference(x, w, mask, 32), torch.float32)


@pytest.mark.parametrize("scan", [{"max_block": 32}, {"max_block": 2048, "num_warps": 8}])
def test_group_token_lists_are_the_same_for_any_scan_step(k, scan):
    """Active tokens ascending then inactive descending, whatever the scan's step (``templates/list_scan.py``)."""
    gp = k["group_plan"]
    gen = torch.Generator().manual_seed(3)
    m = (torch.rand(300, 12, generator=gen) < 0.5).float()
    tokens, counts = gp._group_token_lists(m, scan)
    ref_tokens, ref_counts = gp._group_token_lists(m, {"max_block": 1024})
    assert torch.equal(counts, ref_counts) and torch.equal(tokens, ref_tokens)
    torch_tokens, torch_counts = gp.group_token_lists_torch(gp.mask_to_u8(m))
    assert torch.equal(counts, torch_counts)
    for g in range(12):
        c = int(counts[g])
        assert torch.equal(tokens[g, :c], torch_tokens[g, :c])
        assert torch.equal(tokens[g, c:], torch_tokens[g, c:].flip(0))  # inactive: descending from the back


@pytest.mark.parametrize("m", [5, 37, 130])
def test_plan_tables_match_torch_versions(k, m):
    gp = k["group_plan"]
    gen = torch.Generator().manual_seed(m)
    patterns = torch.rand(4, 70, generator=gen) < 0.5  # 70 groups: two sort words
    mask = patterns[torch.randint(0, 4, (m,), generator=gen)]
    mask[0] = torch.rand(70, generator=gen) < 0.5
    plan = gp.build_group_plan(mask, parts=("output", "input", "union"), block_m=32)
    m_u8 = gp.mask_to_u8(mask)

    tokens, counts = gp.group_token_lists_torch(m_u8)
    assert torch.equal(plan.group_counts, counts)
    for g in range(70):
        c = int(counts[g])
        assert torch.equal(plan.group_tokens[g, :c], tokens[g, :c])
        assert torch.equal(plan.group_tokens[g].sort().values, torch.arange(m, dtype=torch.int32))

    order = plan.token_order.long()
    assert torch.equal(order.sort().values, torch.arange(m))
    rows = mask[order].to(torch.int64)
    keys = [tuple(r.tolist()) for r in rows]
    if m > 32:  # a single tile keeps token order
        assert keys == sorted(keys), "tokens are not sorted lexicographically by mask pattern"
    else:
        assert torch.equal(order, torch.arange(m))
    lists, tcounts = gp.tile_group_lists_torch(m_u8, plan.token_order, 32)
    assert torch.equal(plan.tile_group_counts, tcounts)
    for t in range(len(tcounts)):
        assert torch.equal(plan.tile_groups[t, : int(tcounts[t])], lists[t, : int(tcounts[t])])

    union = mask.any(0).nonzero().flatten().to(torch.int32)
    assert int(plan.union_count[0]) == union.numel()
    assert torch.equal(plan.union_groups[: union.numel()], union)


@pytest.mark.parametrize(("m", "g"), [(5, 3), (37, 112), (300, 8), (1000, 5), (130, 130), (2049, 16)])
@pytest.mark.parametrize("kind", ["all", "none", "random", "random_bf16"])
@pytest.mark.parametrize("offsets_pass", [False, True])
def test_two_pass_group_token_lists_equal_the_one_kernel_build(k, m, g, kind, offsets_pass):
    """The chunked two-pass build of the per-group token lists (``group_lists_two_pass``) gives the one-kernel build's
    tables entry for entry (active tokens ascending, inactive ones from the back), for ragged token counts, group
    counts past a power of two and several chunks (2049 tokens of 16 groups: 65 chunks of 32, the last of one token),
    with the chunks' offsets summed in the lists pass or from a pass of their own (``offsets_pass``); every list is a
    permutation of the tokens."""
    gp = k["group_plan"]
    gen = torch.Generator().manual_seed(m * 7 + g + len(kind))
    rows = gp.mask_rows(_mask(kind, m, g, gen))
    one_tokens, one_counts = gp._group_token_lists(rows, {"two_pass": False})
    tokens, counts = gp._group_token_lists(rows, {"two_pass": True, "offsets_pass": offsets_pass})
    assert torch.equal(counts, one_counts)
    assert torch.equal(tokens, one_tokens)
    assert torch.equal(tokens.sort(dim=1).values, torch.arange(m, dtype=torch.int32).expand(g, m))
    torch_tokens, torch_counts = gp.group_token_lists_torch(gp.mask_to_u8(rows))
    assert torch.equal(counts, torch_counts)
    for grp in range(g):
        assert torch.equal(tokens[grp, : int(counts[grp])], torch_tokens[grp, : int(counts[grp])])


def test_two_pass_build_is_the_default_for_long_lists(k, monkeypatch):
    """From 2048 tokens and 64 tokens per group the plan's token lists come from the two-pass build (H200:
    results/kernels_group_lists_two_pass.json), below from the one-kernel build (the test above compares the
    tables the two builds give)."""
    gp = k["group_plan"]
    from wide_compile.templates.group_lists_two_pass import use_two_pass

    assert [use_two_pass(m, 8) for m in (1024, 2047, 2048, 16384)] == [False, False, True, True]
    assert [use_two_pass(m, 112) for m in (4096, 7167, 7168, 16384)] == [False, False, True, True]
    calls = []
    monkeypatch.setattr(gp, "group_token_lists_two_pass", lambda m, *a: calls.append(m.shape) or ("two", "pass"))
    gen = torch.Generator().manual_seed(1)
    assert gp._group_token_lists(gp.mask_rows(_mask("random", 2048, 8, gen))) == ("two", "pass")
    tokens, counts = gp._group_token_lists(gp.mask_rows(_mask("random", 2048, 112, gen)))
    assert calls == [(2048, 8)] and tokens.shape == (112, 2048)


def test_offsets_pass_where_the_summed_counts_grow():
    """The offsets pass runs where the lists pass would sum at least OFFSETS_MIN_SUMMED earlier counts (H200:
    results/kernels_group_lists_offsets_pass.json): for 112 groups (32-token chunks) from 182 chunks, 5793 tokens
    (the H200 measured 128 chunks slower with it, 256 faster); for 8 groups (512-token chunks) only from 725 chunks."""
    from wide_compile.templates.group_lists_two_pass import chunk_size, use_offsets_pass

    def chunks(m, g):
        return -(-m // chunk_size(m, g))

    assert [use_offsets_pass(chunks(m, 112), 112) for m in (4096, 5792, 5793, 131072)] == [False, False, True, True]
    assert [use_offsets_pass(chunks(m, 8), 8) for m in (16384, 131072, 724 * 512, 725 * 512)] == [
        False, False, False, True]


def test_offsets_pass_in_several_steps_keeps_the_lists(k, monkeypatch):
    """The offsets pass walks a group's chunk counts in steps of ``OFFSETS_BLOCK``: with steps of 16 over 65 chunks
    (five steps, the last partial) the lists are the one-kernel build's."""
    gp = k["group_plan"]
    monkeypatch.setattr(k["group_lists_two_pass"], "OFFSETS_BLOCK", 16)
    rows = gp.mask_rows(_mask("random", 2049, 16, torch.Generator().manual_seed(11)))
    want = gp._group_token_lists(rows, {"two_pass": False})
    got = gp._group_token_lists(rows, {"two_pass": True, "offsets_pass": True})
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_two_pass_chunks_keep_their_tile_small():
    """About 128 chunks where a chunk's [CHUNK, next_pow2(G)] tile stays within TILE_ELEMENTS; never below
    MIN_CHUNK."""
    from wide_compile.templates._triton_utils import next_pow2
    from wide_compile.templates.group_lists_two_pass import MIN_CHUNK, TILE_ELEMENTS, chunk_size

    assert [chunk_size(m, 112) for m in (100, 4096, 16384, 65536)] == [16, 32, 32, 32]
    assert [chunk_size(m, 8) for m in (100, 4096, 16384, 65536)] == [16, 32, 128, 512]
    for m in (1, 4096, 1 << 20):
        for g in (1, 8, 112, 1000):
            assert chunk_size(m, g) == MIN_CHUNK or chunk_size(m, g) * next_pow2(g) <= TILE_ELEMENTS


def test_cpu_without_interpreter_uses_reference(k, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    lin, ref = k["group_linear"], k["ref"]
    x, w = torch.randn(4, 64), torch.randn(128, 64)
    mask = torch.rand(4, 2) < 0.5
    assert torch.equal(lin.output_group_linear(x, w, mask, 64), ref.output_group_linear_reference(x, w, mask, 64))


def test_plan_is_completed_when_tables_are_missing(k):
    """A plan built for the output-group op lacks the input-group tables: they are built on demand."""
    lin, gp, ref = k["group_linear"], k["group_plan"], k["ref"]
    gen = torch.Generator().manual_seed(11)
    x, w = torch.randn(40, 128, generator=gen), torch.randn(64, 128, generator=gen)
    mask = torch.rand(40, 2, generator=gen) < 0.5
    plan = gp.build_group_plan(mask)
    assert plan.has("output") and not plan.has("input")
    y = lin.input_group_linear(x, w, mask, 64, plan=plan, path="gemm")
    _check(y, ref.input_group_linear_reference(x, w, mask, 64), torch.float32)


def test_auto_prefill_input_path_choice(k, monkeypatch):
    """"auto" picks the skipping GEMM only for many tokens, pre-masked input and sparse token tiles."""
    lin, ref = k["group_linear"], k["ref"]
    monkeypatch.setattr(lin, "GEMM_MIN_TOKENS", 64)
    gen = torch.Generator().manual_seed(5)
    m, gs, g = 96, 32, 4
    w = torch.randn(48, g * gs, generator=gen)
    clustered = torch.tensor([[1, 0, 0, 0], [0, 0, 1, 0]], dtype=torch.bool)[torch.randint(0, 2, (m,), generator=gen)]
    dense_mask = torch.ones(m, g, dtype=torch.bool)
    for mask, expected in ((clustered, "gemm"), (dense_mask, "dense")):
        x = torch.randn(m, g * gs, generator=gen) * mask.repeat_interleave(gs, dim=-1)
        path, plan = lin._choose_prefill_input_path(None, mask, m, True)
        assert path == expected
        y = lin.input_group_linear(x, w, mask, gs, x_is_masked=True, out=_poisoned((m, 48), torch.float32))
        _check(y, ref.input_group_linear_reference(x, w, mask, gs), torch.float32)
    assert lin._choose_prefill_input_path(None, clustered, m, False)[0] == "dense"  # needs a pre-masked x


def test_bad_inputs_raise_clear_errors(k):
    lin, gp = k["group_linear"], k["group_plan"]
    x, w = torch.randn(4, 64), torch.randn(128, 64)
    mask = torch.ones(4, 2, dtype=torch.bool)
    with pytest.raises(TypeError, match="dtype"):
        lin.output_group_linear(x.to(torch.int32), w, mask, 64)
    with pytest.raises(TypeError, match="weight dtype"):
        lin.output_group_linear(x, w.half(), mask, 64)
    with pytest.raises(ValueError, match="mask shape"):
        lin.output_group_linear(x, w, torch.ones(4, 3, dtype=torch.bool), 64)
    with pytest.raises(ValueError, match="does not divide"):
        lin.output_group_linear(x, w, mask, 48)
    with pytest.raises(ValueError, match="does not divide"):
        lin.input_group_linear(torch.randn(4, 100), torch.randn(8, 100), mask, 64)
    with pytest.raises(ValueError, match="K="):
        lin.input_group_linear(x, torch.randn(8, 32), mask, 32)
    with pytest.raises(ValueError, match="bias"):
        lin.output_group_linear(x, w, mask, 64, bias=torch.randn(3))
    with pytest.raises(ValueError, match="activation"):
        lin.gated_up_groups(x, w, w, mask, 64, "relu6")
    with pytest.raises(ValueError, match="plan was built"):
        lin.output_group_linear(x, w, mask, 64, plan=gp.build_group_plan(torch.ones(5, 2, dtype=torch.bool)))
    with pytest.raises(ValueError, match="path must be one of"):
        lin.input_group_linear(x, w.t()[:, :64].t().contiguous()[:, :64], mask, 32, path="fast")
    with pytest.raises(ValueError, match="unknown parts"):
        gp.build_group_plan(mask, parts=("inputs",))
    with pytest.raises(ValueError, match="out must have shape"):
        lin.output_group_linear(x, w, mask, 64, out=torch.empty(4, 5))
    with pytest.raises(ValueError, match="group_size must be a positive int"):
        lin.output_group_linear(x, w, mask, 0)


def _wide_input_case(k, m: int, kind: str, seed: int, groups: int = 150):
    """An input-group GEMV case over ``groups`` groups of 16 (150: two chunks of the union scan; ragged split ranges),
    fp16, 40 output rows: ``(x, w, b, mask, group_size, reference output)``."""
    gen = torch.Generator().manual_seed(seed)
    gs, n = 16, 40
    x = torch.randn(m, gs * groups, generator=gen).to(torch.float16)
    w = (torch.randn(n, gs * groups, generator=gen) / 40).to(torch.float16)
    b = torch.randn(n, generator=gen).to(torch.float16)
    mask = _mask(kind, m, groups, gen)
    return x, w, b, mask, gs, k["ref"].input_group_linear_reference(x, w, mask, gs, b)


@pytest.mark.parametrize("m", [1, 5, 16])
@pytest.mark.parametrize("kind", MASKS)
def test_decode_input_gemv_builds_its_union_list(k, m, kind):
    """Without a plan the input-group GEMV builds the union list in every program (150 groups: two chunks of the
    group loop, ragged N); the result equals the reference and the shared-plan path, split or not."""
    lin, gp = k["group_linear"], k["group_plan"]
    x, w, b, mask, gs, expected = _wide_input_case(k, m, kind, _seed(m, kind))
    n = w.shape[0]
    plan = gp.build_group_plan(mask, parts=("union",))
    for split in (1, 3):
        cfg = {"SPLIT": split, "ALL_GROUPS": False}  # the list (the default walks all groups from two tokens)
        own = lin.input_group_linear(x, w, mask, gs, b, path="gemv", config=cfg, out=_poisoned((m, n), x.dtype))
        _check(own, expected, x.dtype)
        shared = lin.input_group_linear(x, w, mask, gs, b, plan, path="gemv", config=cfg)
        assert torch.equal(own, shared)  # same list, same order of the sums


@pytest.mark.parametrize("m", [1, 6])
@pytest.mark.parametrize("kind", MASKS)
def test_decode_input_gemv_over_all_groups_predicates_unused_ones(k, m, kind):
    """``ALL_GROUPS``: no union list; every program walks every group (37: ragged split ranges) and predicates off
    the weight loads of groups no token uses. Input masked in its loads or pre-masked; equals the reference."""
    lin = k["group_linear"]
    x, w, b, mask, gs, expected = _wide_input_case(k, m, kind, _seed("all", m, kind), groups=37)
    n = w.shape[0]
    xm = x * (mask != 0).repeat_interleave(gs, dim=-1).to(x.dtype)
    for split in (1, 3):
        cfg = {"SPLIT": split, "ALL_GROUPS": True}
        y = lin.input_group_linear(x, w, mask, gs, b, path="gemv", config=cfg, out=_poisoned((m, n), x.dtype))
        _check(y, expected, x.dtype)
        y = lin.input_group_linear(xm, w, mask, gs, b, path="gemv", x_is_masked=True, config=cfg,
                                   out=_poisoned((m, n), x.dtype))
        _check(y, expected, x.dtype)


@pytest.mark.parametrize("groups, gs, block_k, kind", [*((100, 16, 16, kind) for kind in MASKS),
                                                        (37, 16, 16, "random"), (128, 16, 16, "random"),
                                                        (20, 32, 16, "random"), (130, 16, 16, "random")])
@pytest.mark.parametrize("m", [1, 6])
def test_decode_input_gemv_walks_union_bits(k, groups, gs, block_k, kind, m):
    """``BITS`` (``group_bits.py``): each program holds its split's share of the union as bits of two words and pops
    one group per step (100 groups: both words, every mask kind; 37 / 128 groups: one word, both full; groups of two
    K steps; 130 groups: more than the words hold, the list is used). Input masked in its loads or pre-masked, 1 or 3
    splits (shares of ragged size); equals the reference, every output written."""
    lin = k["group_linear"]
    gen = torch.Generator().manual_seed(_seed("bits", groups, gs, m, kind))
    n = 40
    x = torch.randn(m, gs * groups, generator=gen).to(torch.float16)
    w = (torch.randn(n, gs * groups, generator=gen) / 40).to(torch.float16)
    b = torch.randn(n, generator=gen).to(torch.float16)
    mask = _mask(kind, m, groups, gen)
    expected = k["ref"].input_group_linear_reference(x, w, mask, gs, b)
    xm = x * (mask != 0).repeat_interleave(gs, dim=-1).to(x.dtype)
    for split in (1, 3):
        cfg = {"SPLIT": split, "BITS": True, "BLOCK_K": block_k}
        y = lin.input_group_linear(x, w, mask, gs, b, path="gemv", config=cfg, out=_poisoned((m, n), x.dtype))
        _check(y, expected, x.dtype)
        y = lin.input_group_linear(xm, w, mask, gs, b, path="gemv", x_is_masked=True, config=cfg,
                                   out=_poisoned((m, n), x.dtype))
        _check(y, expected, x.dtype)


@pytest.mark.parametrize("groups", [4, 100])
def test_one_token_input_gemv_needs_no_masking_of_x(k, monkeypatch, groups):
    """One token: its union is its own groups, so the input-group GEMV reads x only inside them and takes the
    pre-masked kernels (no per-token predicate; the configuration asked for with ``x_is_masked=True``) also for an
    input that is not masked; x is large outside the groups, so a leak would show; equal to the reference and
    bit-equal to the call on the pre-masked input."""
    lin, gemv = k["group_linear"], k["gemv_decode"]
    asked = []
    real = gemv.input_config
    monkeypatch.setattr(gemv, "input_config", lambda *a, **kw: asked.append(
        a[5] if len(a) > 5 else kw.get("x_is_masked")) or real(*a, **kw))
    gen = torch.Generator().manual_seed(groups)
    gs, n = 16, 48
    x = torch.randn(1, gs * groups, generator=gen).to(torch.float16)
    w = (torch.randn(n, gs * groups, generator=gen) / 20).to(torch.float16)
    mask = torch.rand(1, groups, generator=gen) < 0.5
    mask[0, 1], mask[0, 2] = False, True
    on = mask.repeat_interleave(gs, dim=-1)
    x = torch.where(on, x, x * 1000)  # outside the token's groups: large
    expected = k["ref"].input_group_linear_reference(x, w, mask, gs)
    y = lin.input_group_linear(x, w, mask, gs, path="gemv", out=_poisoned((1, n), x.dtype))
    _check(y, expected, x.dtype)
    y_pre = lin.input_group_linear(x * on.to(x.dtype), w, mask, gs, path="gemv", x_is_masked=True,
                                   out=_poisoned((1, n), x.dtype))
    assert torch.equal(y, y_pre)
    assert asked == [True, True]


def test_split_kernels_leave_the_shared_arrival_counters_at_zero(k):
    """Split-K GEMVs take their counters from ``arrival_counters`` (no memset per call): one zeroed buffer reused by
    every launch, left at zero by each, grown (never shrunk) on demand; repeated calls stay correct."""
    from wide_compile.templates.arrival_counters import arrival_counters

    lin, ref = k["group_linear"], k["ref"]
    gen = torch.Generator().manual_seed(5)
    counters = arrival_counters(8, torch.device("cpu"))
    assert counters.dtype == torch.int32 and not counters.any()
    assert arrival_counters(3, torch.device("cpu")) is counters
    x = torch.randn(4, 96, generator=gen).to(torch.float16)
    w = (torch.randn(64, 96, generator=gen) / 10).to(torch.float16)
    mask = torch.rand(4, 2, generator=gen) < 0.7
    for _ in range(3):
        y = lin.output_group_linear(x, w, mask, 32, path="gemv", config={"SPLIT": 3})
        _check(y, ref.output_group_linear_reference(x, w, mask, 32), x.dtype, mask, 32)
        assert not arrival_counters(8, torch.device("cpu")).any()
    bigger = arrival_counters(counters.numel() + 1, torch.device("cpu"))
    assert bigger.numel() > counters.numel() and not bigger.any()
    assert arrival_counters(1, torch.device("cpu")) is bigger


@pytest.mark.parametrize("m", [1, 6, 16, 20])
@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_output_groups_with_dense_linears(k, m, kind, with_bias):
    """A grouped linear plus two dense linears of the same x (ragged ND = 40) in one GEMV launch (<= 16 tokens; above:
    each from its own op), split-K or not: each result equals its reference, inactive groups exactly 0."""
    gen = torch.Generator().manual_seed(_seed(m, kind, with_bias))
    fused, ref = k["group_linear_with_dense"], k["ref"]
    dtype, d, n, nd, gs = torch.float16, 96, 128, 40, 32
    x = torch.randn(m, d, generator=gen).to(dtype)
    w, wk, wv = ((torch.randn(rows, d, generator=gen) / 10).to(dtype) for rows in (n, nd, nd))
    b, bk, bv = ((torch.randn(rows, generator=gen).to(dtype) if with_bias else None) for rows in (n, nd, nd))
    mask = _mask(kind, m, n // gs, gen)
    for cfg in (None, {"SPLIT": 2}, {"SPLIT": 4, "BLOCK_K": 16, "num_stages": 3}):
        y, yk, yv = fused.output_group_linear_with_dense(x, w, mask, gs, b, [wk, wv], [bk, bv], config=cfg)
        _check(y, ref.output_group_linear_reference(x, w, mask, gs, b), dtype, mask, gs)
        for got, wd, bd in ((yk, wk, bk), (yv, wv, bv)):
            _check(got, torch.nn.functional.linear(x.float(), wd.float(), None if bd is None else bd.float()), dtype)


def test_decode_output_config_splits_k_less_with_dense_siblings(k, monkeypatch):
    """The GPU launch rule (H200 sweep, benchmarks/results/kernels_qkv_sweep.json): a query projection launched with
    its key and value projections splits K in 4 with 3 stages; alone at 2-16 tokens in 2 with 6
    (kernels_linear_sweep_small_k_decode_m2_16.json), in 8 with 4 on small K; the gated form does not split."""
    gemv = k["gemv_decode"]
    monkeypatch.setattr(gemv, "interpreting", lambda: False)
    assert gemv.output_config(512, 4096, False, dense=2) == dict(BLOCK_N=64, BLOCK_K=128, SPLIT=4, num_warps=4,
                                                                 num_stages=3)
    assert gemv.output_config(512, 4096, False, num_tokens=4) == dict(BLOCK_N=64, BLOCK_K=128, SPLIT=2, num_warps=4,
                                                                      num_stages=6)
    assert gemv.output_config(64, 576, False, num_tokens=4)["SPLIT"] == 8  # small K: not measured, as before
    assert gemv.output_config(128, 4096, True)["SPLIT"] == 1
    assert gemv.output_config(512, 4096, False, num_tokens=64)["SPLIT"] == 2  # over 16 tokens
    gated_stages = {m: gemv.output_config(128, 4096, True, num_tokens=m)["num_stages"] for m in (1, 2, 16, 32, 64, 128)}
    assert gated_stages == {1: 4, 2: 3, 16: 3, 32: 4, 64: 4, 128: 3}  # 4 stages of 128-token tiles would not fit
    assert gemv.output_config(128, 4096, True)["BLOCK_N"] == 64  # 32-row tiles were slower in the model at one token


def test_decode_configs_at_one_token(k, monkeypatch):
    """One token (H200, kernels_linear_sweep_small_k_decode.json, gemv_fixed_cost.json): the query projection alone
    splits K in 4 with 6 stages; the output projection (8 groups of 512, 4096 rows) and the down projection (112
    groups of 128) run unsplit 32-row tiles with 12 stages; wider inputs, small weights and more tokens keep the
    defaults."""
    gemv = k["gemv_decode"]
    monkeypatch.setattr(gemv, "interpreting", lambda: False)
    assert gemv.output_config(512, 4096, False, num_tokens=1) == dict(BLOCK_N=64, BLOCK_K=128, SPLIT=4, num_warps=4,
                                                                      num_stages=6)
    assert gemv.output_config(512, 4096, False, num_tokens=2)["SPLIT"] == 2
    assert gemv.output_config(64, 576, False, num_tokens=1)["SPLIT"] == 8  # small K: as before
    short = dict(BLOCK_N=32, BLOCK_K=128, SPLIT=1, num_warps=4, num_stages=12)
    default = dict(BLOCK_N=64, BLOCK_K=128, SPLIT=4, num_warps=4, num_stages=5, ALL_GROUPS=False)
    assert gemv.input_config(512, num_tokens=1, num_groups=8, n_dim=4096) == short  # o_proj
    assert gemv.input_config(128, num_tokens=1, num_groups=32, n_dim=4096) == short
    assert gemv.input_config(128, num_tokens=1, num_groups=112, n_dim=4096) == short  # down
    assert gemv.input_config(128, num_tokens=1, num_groups=113, n_dim=4096) == default  # wider than measured
    assert gemv.input_config(128, num_tokens=2, num_groups=32, n_dim=4096) == dict(default, ALL_GROUPS=True)
    assert gemv.input_config(128, num_tokens=1, num_groups=12, n_dim=576) == default  # few rows: as before


@pytest.mark.parametrize(("tokens", "expected"), [
    (2, dict(BLOCK_N=64, num_warps=4, num_stages=5, ALL_GROUPS=True)),
    (4, dict(BLOCK_N=128, num_warps=8, num_stages=4, ALL_GROUPS=True)),
    (32, dict(BLOCK_N=128, num_warps=8, num_stages=4, ALL_GROUPS=True)),
    (64, dict(BLOCK_N=128, num_warps=8, num_stages=4, ALL_GROUPS=True)),
    (65, dict(BLOCK_N=64, num_warps=4, num_stages=4, ALL_GROUPS=False)),
])
def test_input_gemv_walks_all_groups_from_two_tokens(k, monkeypatch, tokens, expected):
    """2-64 tokens (H200, kernels_linear_sweep_input_all_groups.json, _input_wide_moderate.json): no union list,
    weight loads of unused groups predicated off; 128-row tiles with 8 warps from 4 tokens; a forced GEMV above 64
    tokens keeps the earlier defaults."""
    gemv = k["gemv_decode"]
    monkeypatch.setattr(gemv, "interpreting", lambda: False)
    cfg = gemv.input_config(128, num_tokens=tokens, num_groups=112, n_dim=4096)
    assert {key: cfg[key] for key in expected} == expected and cfg["SPLIT"] == 4


def test_input_gemv_walks_union_bits_for_premasked_inputs(k, monkeypatch):
    """A pre-masked input at 1-16 tokens with at most 128 groups of one K step and >= 2048 rows (the model's down
    projection; H200, kernels_linear_sweep_input_bits_premasked.json) takes BITS with unsplit 32-row tiles and 8
    stages; an input masked in the kernel, groups of 512 (the output projection), more tokens or groups, few rows keep
    the earlier configurations; the interpreter decides BITS the same way."""
    gemv = k["gemv_decode"]
    bits = dict(BLOCK_N=32, BLOCK_K=128, SPLIT=1, num_warps=4, num_stages=8, BITS=True)
    with monkeypatch.context() as mp:
        mp.setattr(gemv, "interpreting", lambda: False)
        for tokens in (1, 2, 16):
            assert gemv.input_config(128, tokens, 112, 4096, x_is_masked=True) == bits
        for args in ((128, 1, 112, 4096), (128, 8, 112, 4096)):  # masked in the kernel
            assert "BITS" not in gemv.input_config(*args)
        for args in ((512, 2, 8, 4096), (128, 17, 112, 4096), (128, 2, 129, 4096), (128, 2, 112, 1024)):
            assert "BITS" not in gemv.input_config(*args, x_is_masked=True), args
    assert gemv.input_config(128, 2, 112, 4096, x_is_masked=True)["BITS"]
    assert not gemv.input_config(128, 2, 112, 4096)["BITS"]


@pytest.mark.parametrize(("op", "tokens", "gemv"), [
    ("output_group_linear", 128, True), ("output_group_linear", 129, False), ("gated_up_groups", 64, True),
    ("gated_up_groups", 65, False), ("input_group_linear", 64, True), ("input_group_linear", 65, False)])
def test_auto_path_takes_the_gemv_up_to_its_token_limit(k, monkeypatch, op, tokens, gemv):
    """"auto" runs the GEMV kernel (one tile of all tokens) up to GEMV_MAX_TOKENS[op], the GEMM above; results match
    the reference either way."""
    lin, ref, decode = k["group_linear"], k["ref"], k["gemv_decode"]
    calls = []
    for name in ("output_groups_gemv", "input_groups_gemv"):
        real = getattr(decode, name)
        monkeypatch.setattr(decode, name, lambda *a, real=real, **kw: calls.append(1) or real(*a, **kw))
    gen = torch.Generator().manual_seed(tokens)
    x, w = torch.randn(tokens, 64, generator=gen), torch.randn(64, 64, generator=gen) / 8
    mask = torch.rand(tokens, 2, generator=gen) < 0.5
    if op == "gated_up_groups":
        got, want = lin.gated_up_groups(x, w, w, mask, 32), ref.gated_up_groups_reference(x, w, w, mask, 32, "silu")
    else:
        got, want = getattr(lin, op)(x, w, mask, 32), getattr(ref, f"{op}_reference")(x, w, mask, 32)
    assert lin.GEMV_MAX_TOKENS[op] == tokens - (not gemv)
    assert bool(calls) == gemv
    _check(got, want, torch.float32)


def test_output_groups_with_dense_falls_back_and_checks(k):
    """Dense linears of different sizes, or a bias only on some, run as separate ops (same values); bad dense
    arguments raise clear errors."""
    fused, ref = k["group_linear_with_dense"], k["ref"]
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 64, generator=gen).to(torch.float16)
    w = (torch.randn(64, 64, generator=gen) / 8).to(torch.float16)
    wa, wb = (torch.randn(32, 64, generator=gen) / 8).to(torch.float16), (torch.randn(48, 64, generator=gen) / 8).to(
        torch.float16)
    mask = torch.rand(3, 2, generator=gen) < 0.5
    y, ya, yb = fused.output_group_linear_with_dense(x, w, mask, 32, None, [wa, wb], [None, torch.ones(48).half()])
    _check(y, ref.output_group_linear_reference(x, w, mask, 32), torch.float16, mask, 32)
    _check(ya, x.float() @ wa.float().T, torch.float16)
    _check(yb, x.float() @ wb.float().T + 1, torch.float16)
    with pytest.raises(ValueError, match=r"dense_weights\[0\] must be a 2-D tensor \[N, K=64\]"):
        fused.output_group_linear_with_dense(x, w, mask, 32, None, [wa[:, :60]], [None])
    with pytest.raises(TypeError, match=r"dense_weights\[0\] must be torch.float16"):
        fused.output_group_linear_with_dense(x, w, mask, 32, None, [wa.float()], [None])
    with pytest.raises(ValueError, match="2 dense weights but 1 dense biases"):
        fused.output_group_linear_with_dense(x, w, mask, 32, None, [wa, wa], [None])


@pytest.mark.parametrize("tokens, path", [(40, "dense"), (3, "gemv"), (40, "gemm"), (3, "auto"), (40, "auto")])
@pytest.mark.parametrize("bias", [False, True])
def test_input_group_linear_adds_into_a_residual(k, tokens, path, bias):
    """``residual=``: the product added into it in place on every path (cuBLAS's ``addmm_`` for "dense", the union
    GEMV, the skipping GEMM), equal to ``residual + y``; with 0 tokens it is returned unchanged; ``out`` and
    ``residual`` together, or a residual of the wrong shape / dtype, are refused."""
    lin = k["group_linear"]
    gen = torch.Generator().manual_seed(tokens)
    gs, kd, n = 16, 64, 48
    mask = _mask("random", tokens, kd // gs, gen).float()
    x = torch.randn(tokens, kd, generator=gen) * mask.repeat_interleave(gs, dim=-1)
    w = torch.randn(n, kd, generator=gen) / kd**0.5
    b = torch.randn(n, generator=gen) if bias else None
    residual = torch.randn(tokens, n, generator=gen)
    expected = residual + lin.input_group_linear(x, w, mask, gs, b, path=path, x_is_masked=True)
    buffer = residual.clone()
    assert lin.input_group_linear(x, w, mask, gs, b, path=path, x_is_masked=True, residual=buffer) is buffer
    torch.testing.assert_close(buffer, expected, rtol=1e-5, atol=1e-5)
    empty = torch.zeros(0, n)
    assert lin.input_group_linear(torch.zeros(0, kd), w, torch.zeros(0, kd // gs), gs, residual=empty) is empty
    with pytest.raises(ValueError, match="pass out or residual, not both"):
        lin.input_group_linear(x, w, mask, gs, out=buffer.clone(), residual=buffer)
    for bad in (buffer[:, :10], buffer.double()):
        with pytest.raises((ValueError, TypeError), match="residual"):
            lin.input_group_linear(x, w, mask, gs, residual=bad)


@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("rows", "k_dim"), [(2, 96), (4, 200), (8, 256)])
def test_one_token_row_gemvs(k, kind, dtype, rows, k_dim):
    """templates/gemv_rows.py forced with ``ROWS`` (the default only on a GPU): output groups (with a bias, and with two
    dense siblings) and input groups (rows not a multiple of ``ROWS``, ragged K, input not pre-masked) match the
    references; every output poisoned first."""
    lin, ref, decode = k["group_linear"], k["ref"], k["gemv_decode"]
    gen = torch.Generator().manual_seed(rows * 7 + k_dim)
    cfg = dict(ROWS=rows, num_warps=2)
    gs_out, n_out = 16, 64
    x = torch.randn(1, k_dim, generator=gen).to(dtype)
    w, b = torch.randn(n_out, k_dim, generator=gen).to(dtype), torch.randn(n_out, generator=gen).to(dtype)
    mask = _mask(kind, 1, n_out // gs_out, gen)
    y = torch.full((1, n_out), float("nan"), dtype=dtype)
    lin.output_group_linear(x, w, mask, gs_out, b, path="gemv", config=cfg, out=y)
    _check(y, ref.output_group_linear_reference(x, w, mask, gs_out, b), dtype, mask, gs_out)
    dense = []
    for _ in range(2):
        wd, yd = torch.randn(23, k_dim, generator=gen).to(dtype), torch.full((1, 23), float("nan"), dtype=dtype)
        dense.append((wd, None, yd))
    yq = decode.output_groups_gemv(x, w, None, mask, gs_out, config=cfg, dense=tuple(dense))
    _check(yq, ref.output_group_linear_reference(x, w, mask, gs_out), dtype, mask, gs_out)
    for wd, _, yd in dense:
        _check(yd, x.float() @ wd.float().T, dtype)
    gs_in = 8 if k_dim % 16 else 16
    wi, bi = torch.randn(37, k_dim, generator=gen).to(dtype), torch.randn(37, generator=gen).to(dtype)
    mi = _mask(kind, 1, k_dim // gs_in, gen)
    yi = torch.full((1, 37), float("nan"), dtype=dtype)
    if gs_in % 16:  # the kernels need group sizes that are multiples of 16: call the row kernel directly
        k["gemv_rows"].input_rows_gemv(x, wi, bi, k["group_plan"].mask_rows(mi), gs_in, cfg, yi)
    else:
        lin.input_group_linear(x, wi, mi, gs_in, bi, path="gemv", config=cfg, out=yi)
    _check(yi, ref.input_group_linear_reference(x, wi, mi, gs_in, bi), dtype)


@pytest.mark.parametrize("mask_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_input_row_gemv_reads_float_masks_through_their_bits(k, mask_dtype):
    """Float masks (the routers' rows) reach the input-group row kernel as an integer view of their bits, the sign
    cleared: -0.0 is inactive, any other nonzero value (0.7, 1.0) active, as a float comparison with zero says."""
    gen = torch.Generator().manual_seed(19)
    gs, groups = 16, 6
    x = torch.randn(1, gs * groups, generator=gen)
    w, b = torch.randn(21, gs * groups, generator=gen), torch.randn(21, generator=gen)
    values = torch.tensor([[1.0, -0.0, 0.7, 0.0, -1.0, 0.0]], dtype=mask_dtype)
    view, bits = k["gemv_rows"].integer_mask(values)
    assert view.dtype == (torch.int32 if mask_dtype == torch.float32 else torch.int16) and bits in (15, 31)
    assert view.data_ptr() == values.data_ptr()  # a view: no copy, no kernel
    y = torch.full((1, 21), float("nan"))
    k["gemv_rows"].input_rows_gemv(x, w, b, values, gs, dict(ROWS=4, num_warps=2), y)
    active = torch.tensor([[True, False, True, False, True, False]])
    _check(y, k["ref"].input_group_linear_reference(x, w, active, gs, b), torch.float32)


def test_row_gemvs_apply_to_one_token_on_small_weights(k, monkeypatch):
    """The default takes the row kernels for one token on weights of at most 48 MiB (the 8B query projection with its
    key and value siblings, and the output projection); a ``ROWS`` config forces them or (0) not, any other config
    keeps the MMA GEMVs."""
    rows = k["gemv_rows"]
    assert not rows.applies(1, 32 << 20, 512, None)  # interpreter: not by default
    monkeypatch.setattr(rows, "interpreting", lambda: False)
    assert rows.applies(1, 32 << 20, 512, None) and rows.applies(1, 48 << 20, 512, None)
    assert not rows.applies(1, 117 << 20, 128, None)  # the down projection: the split-K GEMV is faster
    assert not rows.applies(2, 32 << 20, 512, None)
    assert not rows.applies(1, 32 << 20, 512, dict(BLOCK_N=32))
    assert not rows.applies(1, 32 << 20, 512, dict(ROWS=0))
    assert rows.applies(1, 117 << 20, 128, dict(ROWS=2))
    assert rows.applies(1, 32 << 20, 512, None, output=False)  # input groups (the output projection) too
    assert not rows.applies(1, 117 << 20, 128, None, output=False)  # not the down projection
    assert not rows.applies(2, 32 << 20, 512, None, output=False)
    assert rows.applies(1, 32 << 20, 512, dict(ROWS=2), output=False)
    assert not rows.applies(1, 32 << 20, 12, dict(ROWS=8))  # output rows must not straddle groups
    assert rows.applies(1, 32 << 20, 12, dict(ROWS=8), output=False)  # input-group rows are output rows


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize(("m", "d", "gs"), [(1, 64, 32), (7, 4160, 64), (33, 96, 48)])
def test_zero_groups_kernel_matches_the_torch_form(k, dtype, kind, m, d, gs):
    """``zero_groups.zero_inactive_groups`` (one launch; ragged rows past its 2048-column block, groups that straddle a
    block) equals the two-kernel PyTorch form bit for bit, on every mask dtype the kernels read (bool as uint8,
    bf16 / fp32 0 / 1 floats, -0.0 inactive)."""
    mi = k["zero_groups"]
    gen = torch.Generator().manual_seed(m * 1000 + d)
    x = torch.randn(m, d, generator=gen).to(dtype)
    mask = _mask(kind, m, d // gs, gen)
    if kind == "clustered":
        mask = torch.where(mask == 0, torch.tensor(-0.0), mask)  # negative zero must read as inactive
    rows = k["group_plan"].mask_rows(mask)
    got = mi.zero_inactive_groups(x, rows, gs)
    want = mi.zero_inactive_groups_reference(x, rows, gs)
    assert got.dtype == x.dtype and torch.equal(got, want)
    inplace = x.clone()
    assert mi.zero_inactive_groups(inplace, rows, gs, in_place=True).data_ptr() == inplace.data_ptr()
    assert torch.equal(inplace, want)
    assert torch.equal(got.view(m, -1, gs)[(mask == 0)], torch.zeros_like(got.view(m, -1, gs)[(mask == 0)]))
    assert torch.equal(got.view(m, -1, gs)[(mask != 0)], x.view(m, -1, gs)[(mask != 0)])


def test_zero_groups_kernel_rejects_a_mask_of_the_wrong_shape(k):
    mi = k["zero_groups"]
    with pytest.raises(ValueError, match="do not cover x"):
        mi.zero_inactive_groups(torch.randn(3, 64), torch.ones(3, 3, dtype=torch.uint8), 32)


@pytest.mark.parametrize("kind", ["all", "none", "random", "random_bf16", "clustered"])
@pytest.mark.parametrize("m", [17, 40])
def test_input_gemv_above_sixteen_tokens(k, kind, m):
    """The input-group GEMV forced at more tokens than a decode step (one token tile of 32 / 64), input masked in
    its loads or pre-masked, against the reference."""
    gen = torch.Generator().manual_seed(m)
    dtype, lin, ref = torch.float16, k["group_linear"], k["ref"]
    d, n, gs = 192, 80, 64
    x = torch.randn(m, d, generator=gen).to(dtype)
    w = (torch.randn(n, d, generator=gen) / 12).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    mask = _mask(kind, m, d // gs, gen)
    want = ref.input_group_linear_reference(x, w, mask, gs, b)
    y = lin.input_group_linear(x, w, mask, gs, b, path="gemv", out=_poisoned((m, n), dtype))
    _check(y, want, dtype)
    xm = x * (mask != 0).repeat_interleave(gs, dim=-1).to(dtype)
    y = lin.input_group_linear(xm, w, mask, gs, b, path="gemv", x_is_masked=True, out=_poisoned((m, n), dtype))
    _check(y, want, dtype)


def test_input_gemv_stages_fit_the_token_tile(k, monkeypatch):
    """The input-group GEMV's default pipeline is cut to what fits in shared memory: 5 stages of a 64-row weight tile
    and a 16-token tile at 2 tokens, 4 of a 128-row tile at 16-64 tokens, and above 64 tokens (64-row tiles again) 4
    with a 128-token tile, 2 at 256; fp32 halves what fits."""
    gemv = k["gemv_decode"]
    monkeypatch.setattr(gemv, "interpreting", lambda: False)
    stages = {m: gemv.input_config(128, num_tokens=m, num_groups=112, n_dim=4096)["num_stages"]
              for m in (2, 16, 32, 64, 128, 256)}
    assert stages == {2: 5, 16: 4, 32: 4, 64: 4, 128: 4, 256: 2}
    assert gemv.input_config(128, num_tokens=128, num_groups=112, n_dim=4096, elem_bytes=4)["num_stages"] == 2


@pytest.mark.parametrize("kind", ["all", "none", "random", "random_bf16"])
def test_output_op_takes_cublas_between_the_gemv_and_the_gemm(k, monkeypatch, kind):
    """"auto" on the output-group op: the GEMV up to GEMV_MAX_TOKENS, cuBLAS with the inactive outputs zeroed up to
    DENSE_OUTPUT_MAX_TOKENS (set here to 40), the GEMM above; each matches the reference, inactive outputs exactly 0."""
    lin, ref, gemm = k["group_linear"], k["ref"], k["gemm_output_groups"]
    monkeypatch.setattr(lin, "GEMV_MAX_TOKENS", dict(lin.GEMV_MAX_TOKENS, output_group_linear=8))
    monkeypatch.setattr(lin, "DENSE_OUTPUT_MAX_TOKENS", 40)
    calls = []
    real = gemm.output_groups_gemm
    monkeypatch.setattr(gemm, "output_groups_gemm", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    gen = torch.Generator().manual_seed(5)
    w, b = torch.randn(96, 64, generator=gen) / 8, torch.randn(96, generator=gen)
    for tokens, gemm_runs in ((20, False), (40, False), (41, True)):
        calls.clear()
        x = torch.randn(tokens, 64, generator=gen)
        mask = _mask(kind, tokens, 3, gen)
        got = lin.output_group_linear(x, w, mask, 32, b, out=_poisoned((tokens, 96), torch.float32))
        _check(got, ref.output_group_linear_reference(x, w, mask, 32, b), torch.float32, mask, 32)
        assert bool(calls) == gemm_runs


@pytest.mark.parametrize(("tokens", "gemv"), [(16, True), (17, False)])
def test_premasked_input_keeps_the_gemv_to_a_decode_step(k, monkeypatch, tokens, gemv):
    """With ``x_is_masked`` (no masking pass before cuBLAS) "auto" takes the input-group GEMV only up to
    MASKED_INPUT_GEMV_MAX_TOKENS (16), below GEMV_MAX_TOKENS (64) for inputs it must mask itself."""
    lin, ref, decode = k["group_linear"], k["ref"], k["gemv_decode"]
    calls = []
    real = decode.input_groups_gemv
    monkeypatch.setattr(decode, "input_groups_gemv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    gen = torch.Generator().manual_seed(tokens)
    w = torch.randn(64, 64, generator=gen) / 8
    mask = torch.rand(tokens, 2, generator=gen) < 0.5
    x = torch.randn(tokens, 64, generator=gen) * mask.repeat_interleave(32, dim=-1)
    got = lin.input_group_linear(x, w, mask, 32, x_is_masked=True)
    assert lin.MASKED_INPUT_GEMV_MAX_TOKENS == 16 < lin.GEMV_MAX_TOKENS["input_group_linear"]
    assert bool(calls) == gemv
    _check(got, ref.input_group_linear_reference(x, w, mask, 32), torch.float32)
