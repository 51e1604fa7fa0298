"""CPU tests of the head-group attention kernels under the Triton interpreter, against the PyTorch reference.

``TRITON_INTERPRET=1`` must be set before Triton and the kernel modules are imported (Triton reads it when ``@jit``
decorates, and the interpreter only patches the ``triton.language`` it imported itself). A module fixture therefore
re-imports Triton if it was first imported without the interpreter, then reloads the kernel modules against it.
Shapes are tiny and ragged, blocks are 32, every kernel call writes into an output poisoned with NaN, and inputs are
random (never zeros).
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    # Setting the interpreter here would turn the kernels of the GPU tests in this process into interpreted ones.
    pytest.skip(
        "interpreter tests: a GPU is present; run them in their own process with TRITON_INTERPRET=1",
        allow_module_level=True,
    )
os.environ["TRITON_INTERPRET"] = "1"

from wide_compile.templates.attention_reference import group_attention_reference  # noqa: E402

# Kernel modules in dependency order (each later one imports launchers of an earlier one by name).
_KERNEL_MODULES = ("attention_block", "group_lists_two_pass", "attention_compact", "attention_mask_extents", "attention_prefill", "attention_decode",
                   "attention")
group_attention = group_attention_prefill = group_attention_decode = attention_compact = attention_mask_extents = None
attention_prefill = None


def _interpreted_kernel_modules() -> dict:
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(tl.max, InterpretedFunction):  # Triton was imported before TRITON_INTERPRET=1: re-import it
        for name in [n for n in sys.modules if n == "triton" or n.startswith("triton.")]:
            if not name.startswith("triton._C"):
                del sys.modules[name]
        importlib.import_module("triton.language")
    return {
        name: importlib.reload(importlib.import_module(f"wide_compile.templates.{name}")) for name in _KERNEL_MODULES
    }


@pytest.fixture(scope="module", autouse=True)
def interpreted_kernels():
    """Bind the module-level kernel entry points to interpreter-decorated kernels for this module's tests."""
    global group_attention, group_attention_prefill, group_attention_decode, attention_compact, attention_mask_extents
    global attention_prefill
    mods = _interpreted_kernel_modules()
    attention_prefill = mods["attention_prefill"]
    attention_compact = mods["attention_compact"]
    attention_mask_extents = mods["attention_mask_extents"]
    group_attention_prefill = mods["attention_prefill"].group_attention_prefill
    group_attention_decode = mods["attention_decode"].group_attention_decode
    group_attention = mods["attention"].group_attention
    yield


DEVICE = "cpu"
TOL = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def make_mask(kind: str, batch: int, q_len: int, groups: int, gen: torch.Generator) -> torch.Tensor:
    """Masks used everywhere: all active, all inactive, random (50%), clustered (runs of active tokens)."""
    if kind == "all":
        return torch.ones(batch, q_len, groups, dtype=torch.bool)
    if kind == "none":
        return torch.zeros(batch, q_len, groups, dtype=torch.bool)
    if kind == "random":
        return torch.rand(batch, q_len, groups, generator=gen) < 0.5
    if kind == "clustered":  # group g active on token runs of length 8 with a per-group phase; group 0 never
        t = torch.arange(q_len)[None, :, None]
        g = torch.arange(groups)[None, None, :]
        b = torch.arange(batch)[:, None, None]
        return (((t // 8) + g + b) % 2 == 0) & (g != 0)
    raise ValueError(kind)


def make_inputs(batch, hq, hkv, q_len, kv_len, head_dim, dtype, gen):
    q = torch.randn(batch, hq, q_len, head_dim, generator=gen).to(dtype)
    k = torch.randn(batch, hkv, kv_len, head_dim, generator=gen).to(dtype)
    v = torch.randn(batch, hkv, kv_len, head_dim, generator=gen).to(dtype)
    return q, k, v


def poisoned(batch, hq, q_len, head_dim, dtype, merge_heads=False):
    shape = (batch, q_len, hq * head_dim) if merge_heads else (batch, hq, q_len, head_dim)
    return torch.full(shape, float("nan"), dtype=dtype)


def assert_matches(out: torch.Tensor, ref: torch.Tensor, head_mask: torch.Tensor, dtype: torch.dtype) -> None:
    assert not torch.isnan(out).any(), "kernel left unwritten (NaN) or produced NaN outputs"
    out32, ref32 = out.float(), ref.float()
    hq = out.shape[1]
    inactive = ~(head_mask != 0).repeat_interleave(hq // head_mask.shape[-1], dim=2).permute(0, 2, 1)
    assert torch.all(out32[inactive] == 0), "inactive (token, group) pairs must be exactly zero"
    denom = ref32.norm().item()
    if denom == 0:
        assert torch.all(out32 == 0)
        return
    rel = (out32 - ref32).norm().item() / denom
    assert rel < TOL[dtype], f"relative error {rel:.2e} >= {TOL[dtype]:.0e}"


@pytest.mark.parametrize("q_len,kind", [(1, "random"), (70, "random"), (2500, "random"), (70, "all"), (37, "none")])
def test_compaction_matches_reference(q_len, kind):
    gen = torch.Generator().manual_seed(q_len)
    head_mask = make_mask(kind, 2, q_len, 3, gen).to(torch.float16)  # non-bool masks are compared with zero
    order, count = attention_compact.compact_active_rows(head_mask)
    ref_order, ref_count = attention_compact.compact_active_rows_reference(head_mask)
    assert torch.equal(count, ref_count)
    assert torch.equal(order, ref_order)


@pytest.mark.parametrize("scan", [{"max_block": 32}, {"max_block": 4096, "num_warps": 8}])
def test_compaction_is_the_same_for_any_scan_step(scan):
    """The scan's step size (``templates/list_scan.py``) changes how many steps a row takes, not the order."""
    gen = torch.Generator().manual_seed(5)
    head_mask = make_mask("random", 1, 300, 8, gen).to(torch.float32)
    order, count = attention_compact.compact_active_rows(head_mask, scan)
    ref_order, ref_count = attention_compact.compact_active_rows_reference(head_mask)
    assert torch.equal(count, ref_count) and torch.equal(order, ref_order)


@pytest.mark.parametrize("q_len,groups", [(2049, 8), (2500, 3), (300, 5)])
@pytest.mark.parametrize("kind", ["random", "all", "none", "clustered"])
@pytest.mark.parametrize("layout", ["bool", "float16", "packed slice"])
def test_two_pass_compaction_of_one_sequence_matches_reference(q_len, groups, kind, layout):
    """One sequence's order from the chunked two-pass build (``group_lists_two_pass``; forced, the default from 4096
    tokens) is the reference's entry for entry, for bool and float masks and for a mask that is a strided
    slice of a wider packed tensor (as the routers' packed masks are)."""
    gen = torch.Generator().manual_seed(q_len + groups + len(kind))
    head_mask = make_mask(kind, 1, q_len, groups, gen)
    if layout == "float16":
        head_mask = head_mask.to(torch.float16)
    elif layout == "packed slice":
        packed = torch.rand(1, q_len, 2 * groups + 1, generator=gen)
        packed[..., 1:2 * groups + 1:2] = head_mask.float()
        head_mask = packed[..., 1:2 * groups + 1:2]
        assert not head_mask.is_contiguous()
    order, count = attention_compact.compact_active_rows(head_mask, {"two_pass": True})
    ref_order, ref_count = attention_compact.compact_active_rows_reference(head_mask)
    assert torch.equal(count, ref_count) and torch.equal(order, ref_order)


def test_two_pass_compaction_is_the_default_for_one_long_sequence(monkeypatch):
    """One sequence from 4096 tokens (and 64 per group) takes the two-pass build; two sequences, or fewer tokens, the
    one-program-per-(batch, group) scan (H200: results/kernels_group_lists_two_pass_compact.json). Forcing the
    two-pass build on a batch is an error."""
    calls = []
    real = attention_compact.group_token_lists_two_pass
    monkeypatch.setattr(attention_compact, "group_token_lists_two_pass",
                        lambda m, *a: calls.append(tuple(m.shape)) or real(m, *a))
    gen = torch.Generator().manual_seed(3)
    assert attention_compact.TWO_PASS_MIN_TOKENS == 4096
    for batch, q_len in ((1, 4096), (1, 4095), (2, 4096)):
        head_mask = make_mask("random", batch, q_len, 8, gen)
        order, count = attention_compact.compact_active_rows(head_mask)
        assert torch.equal(order, attention_compact.compact_active_rows_reference(head_mask)[0])
    assert calls == [(4096, 8)]
    with pytest.raises(ValueError, match="one sequence, got a batch of 2"):
        attention_compact.compact_active_rows(make_mask("random", 2, 40, 2, gen), {"two_pass": True})


PREFILL_CASES = [
    # batch, Hq, Hkv, G, T, S, D, causal, dtype, mask
    (1, 4, 1, 1, 37, 37, 16, True, torch.float32, "random"),
    (2, 4, 2, 2, 70, 70, 32, True, torch.float32, "random"),
    (2, 4, 4, 4, 70, 70, 32, False, torch.float32, "clustered"),
    (1, 4, 2, 2, 37, 70, 32, True, torch.float16, "random"),  # chunked prefill: T < S
    (2, 4, 2, 4, 37, 5, 16, False, torch.float16, "all"),  # non-causal, T > S
    (1, 4, 1, 2, 70, 70, 16, True, torch.float16, "clustered"),
    (2, 4, 2, 2, 37, 37, 32, True, torch.float32, "none"),
    (1, 4, 2, 1, 5, 5, 32, True, torch.float32, "all"),
    (1, 4, 2, 2, 70, 70, 24, True, torch.float32, "random"),  # head dim not a power of two
]


@pytest.mark.parametrize("batch,hq,hkv,groups,q_len,kv_len,head_dim,causal,dtype,mask_kind", PREFILL_CASES)
def test_prefill_matches_reference(batch, hq, hkv, groups, q_len, kv_len, head_dim, causal, dtype, mask_kind):
    gen = torch.Generator().manual_seed(q_len * 131 + kv_len + head_dim)
    q, k, v = make_inputs(batch, hq, hkv, q_len, kv_len, head_dim, dtype, gen)
    head_mask = make_mask(mask_kind, batch, q_len, groups, gen)
    out = poisoned(batch, hq, q_len, head_dim, dtype)
    res = group_attention_prefill(q, k, v, head_mask, causal=causal, out=out)
    assert res is out
    assert_matches(out, group_attention_reference(q, k, v, head_mask, causal=causal), head_mask, dtype)


DECODE_CASES = [
    # batch, Hq, Hkv, G, T, S, D, causal, dtype, mask, num_splits
    (2, 4, 2, 2, 1, 70, 32, True, torch.float32, "random", None),
    (2, 4, 2, 2, 3, 70, 32, True, torch.float32, "random", 3),  # split-KV + reduction
    (1, 4, 1, 4, 3, 37, 16, True, torch.float16, "clustered", 2),
    (2, 4, 4, 4, 1, 130, 16, False, torch.float16, "all", 4),
    (2, 4, 2, 2, 3, 70, 32, True, torch.float32, "none", 3),
    (1, 4, 2, 1, 3, 5, 32, True, torch.float32, "all", None),
    (2, 4, 1, 2, 3, 130, 32, False, torch.float32, "random", 5),  # chunks of 32 keys, last one ragged
    (1, 4, 2, 2, 2, 600, 16, True, torch.float16, "random", 19),  # many chunks for the reduction kernel
]


@pytest.mark.parametrize("batch,hq,hkv,groups,q_len,kv_len,head_dim,causal,dtype,mask_kind,splits", DECODE_CASES)
def test_decode_matches_reference(batch, hq, hkv, groups, q_len, kv_len, head_dim, causal, dtype, mask_kind, splits):
    gen = torch.Generator().manual_seed(q_len * 7 + kv_len + head_dim)
    q, k, v = make_inputs(batch, hq, hkv, q_len, kv_len, head_dim, dtype, gen)
    head_mask = make_mask(mask_kind, batch, q_len, groups, gen)
    out = poisoned(batch, hq, q_len, head_dim, dtype)
    res = group_attention_decode(q, k, v, head_mask, causal=causal, out=out, num_splits=splits)
    assert res is out
    assert_matches(out, group_attention_reference(q, k, v, head_mask, causal=causal), head_mask, dtype)


@pytest.mark.parametrize("q_len,kv_len", [(3, 70), (37, 37)])  # decode and prefill dispatch
def test_entry_point_merge_heads_strided_inputs_and_float_mask(q_len, kv_len):
    gen = torch.Generator().manual_seed(5)
    batch, hq, hkv, head_dim = 2, 4, 2, 32
    # q/k/v as HF makes them: [B, len, heads, D] transposed to [B, heads, len, D] (non-contiguous)
    q = torch.randn(batch, q_len, hq, head_dim, generator=gen).transpose(1, 2)
    k = torch.randn(batch, kv_len, hkv, head_dim, generator=gen).transpose(1, 2)
    v = torch.randn(batch, kv_len, hkv, head_dim, generator=gen).transpose(1, 2)
    head_mask = (torch.rand(batch, q_len, hkv, generator=gen) < 0.5).float() * 0.7  # nonzero float = active
    out = poisoned(batch, hq, q_len, head_dim, torch.float32, merge_heads=True)
    res = group_attention(q, k, v, head_mask, scale=0.3, merge_heads=True, out=out)
    assert res is out
    ref = group_attention_reference(q, k, v, head_mask, scale=0.3)
    merged = out.unflatten(2, (hq, head_dim)).transpose(1, 2)
    assert_matches(merged, ref, head_mask, torch.float32)


def test_bfloat16_runs_through_fp32_under_interpreter():
    gen = torch.Generator().manual_seed(11)
    q, k, v = make_inputs(1, 4, 2, 37, 37, 32, torch.bfloat16, gen)
    head_mask = make_mask("random", 1, 37, 2, gen)
    out = poisoned(1, 4, 37, 32, torch.bfloat16)
    group_attention(q, k, v, head_mask, out=out)
    assert_matches(out, group_attention_reference(q, k, v, head_mask), head_mask, torch.bfloat16)


def test_cpu_without_interpreter_falls_back_to_reference(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    gen = torch.Generator().manual_seed(3)
    q, k, v = make_inputs(2, 4, 2, 5, 9, 16, torch.float32, gen)
    head_mask = make_mask("random", 2, 5, 2, gen)
    out = group_attention(q, k, v, head_mask, merge_heads=True)
    ref = group_attention_reference(q, k, v, head_mask)
    torch.testing.assert_close(out, ref.transpose(1, 2).reshape(2, 5, 64))


def test_reference_matches_sdpa_when_all_active():
    gen = torch.Generator().manual_seed(1)
    q, k, v = make_inputs(2, 4, 2, 6, 6, 16, torch.float32, gen)
    head_mask = torch.ones(2, 6, 2)
    ref = group_attention_reference(q, k, v, head_mask, causal=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True
    )
    torch.testing.assert_close(ref, sdpa, atol=1e-5, rtol=1e-5)


def _good_inputs():
    gen = torch.Generator().manual_seed(0)
    q, k, v = make_inputs(1, 4, 2, 3, 8, 16, torch.float32, gen)
    return q, k, v, torch.ones(1, 3, 2, dtype=torch.bool)


@pytest.mark.parametrize(
    "mutate,error,match",
    [
        (lambda q, k, v, m: (q.to(torch.int32), k, v, m), TypeError, "q dtype"),
        (lambda q, k, v, m: (q, k.half(), v, m), TypeError, "k dtype"),
        (lambda q, k, v, m: (q[0], k, v, m), ValueError, "q must be 4-D"),
        (lambda q, k, v, m: (q, k, v[:, :, :4], m), ValueError, "differs from v shape"),
        (lambda q, k, v, m: (q, k[..., :8], v[..., :8], m), ValueError, "batch or head dim"),
        (lambda q, k, v, m: (q, torch.cat([k, k[:, :1]], 1), torch.cat([v, v[:, :1]], 1), m), ValueError,
         "must divide query heads"),
        (lambda q, k, v, m: (q, k, v, m[:, :2]), ValueError, "head_mask must have shape"),
        (lambda q, k, v, m: (q, k, v, torch.ones(1, 3, 3)), ValueError, "G=3"),
        (lambda q, k, v, m: (q, k[:, :, :2], v[:, :, :2], m), ValueError, "T <= S"),
        (lambda q, k, v, m: (q, k, v, m.numpy()), TypeError, "head_mask must be a torch.Tensor"),
    ],
)
def test_bad_inputs_raise_clear_errors(mutate, error, match):
    q, k, v, m = mutate(*_good_inputs())
    with pytest.raises(error, match=match):
        group_attention(q, k, v, m)


def test_bad_out_and_decode_row_limit_raise():
    q, k, v, m = _good_inputs()
    with pytest.raises(ValueError, match="out must be"):
        group_attention(q, k, v, m, out=torch.empty(1, 4, 3, 8))
    gen = torch.Generator().manual_seed(0)
    q, k, v = make_inputs(1, 64, 1, 3, 8, 16, torch.float32, gen)
    with pytest.raises(ValueError, match="exceeds 128"):
        group_attention_decode(q, k, v, torch.ones(1, 3, 1))


# ------------------------------------------------------------------------------------ explicit boolean masks
def static_cache_mask(batch: int, q_len: int, kv_len: int, start: int) -> torch.Tensor:
    """What HF builds for a static cache of ``kv_len`` slots with ``start`` filled: query t at position start + t sees
    keys 0 .. start + t; the unfilled slots after it are hidden. ``[B, 1, T, S]``."""
    pos = torch.arange(q_len)[:, None] + start
    return (torch.arange(kv_len)[None, :] <= pos).expand(batch, 1, q_len, kv_len)


def attn_mask_of(kind: str, batch: int, hq: int, q_len: int, kv_len: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "static_cache":  # prefill or decode into a half-empty static cache: whole key blocks are hidden
        return static_cache_mask(batch, q_len, kv_len, start=max(0, kv_len // 2 - q_len))
    if kind == "random_per_head":  # [B, Hq, T, S] with every row seeing key 0
        m = torch.rand(batch, hq, q_len, kv_len, generator=gen) < 0.4
        m[..., 0] = True
        return m
    if kind == "left_padded_cache":  # per-sequence left padding inside a static cache: contiguous rows, first > 0
        pad = torch.tensor([0, 45, 7])[:batch]
        keys = torch.arange(kv_len)
        return static_cache_mask(batch, q_len, kv_len, start=kv_len - q_len) & (keys >= pad[:, None, None, None])
    if kind == "holes_in_later_rows":  # rows of the first half contiguous, of the second half not: both passes run
        m = static_cache_mask(batch, q_len, kv_len, start=kv_len - q_len).clone()
        m[:, :, q_len // 2:, 3::5] = False
        return m
    if kind == "padding_2d":  # [T, S] broadcast; row 0 sees nothing (its output must be 0, as SDPA's math path)
        m = torch.rand(q_len, kv_len, generator=gen) < 0.6
        m[0] = False
        return m
    raise ValueError(kind)


MASKED_CASES = [
    # batch, Hq, Hkv, G, T, S, D, dtype, head-mask kind, attention-mask kind, decode splits (None: prefill kernel)
    (2, 4, 2, 2, 37, 130, 32, torch.float32, "random", "static_cache", None),
    (1, 4, 1, 2, 40, 70, 16, torch.float16, "clustered", "random_per_head", None),
    (2, 4, 2, 4, 33, 64, 32, torch.float32, "all", "padding_2d", None),
    # the extents pass's unmasked interior (key blocks every row of a tile sees), before / after it the range predicate
    (1, 4, 2, 2, 20, 200, 32, torch.float32, "random", "static_cache", None),
    (3, 4, 2, 2, 70, 110, 16, torch.float16, "clustered", "left_padded_cache", None),
    (2, 4, 2, 4, 70, 100, 32, torch.float32, "random", "holes_in_later_rows", None),
    (2, 4, 2, 2, 1, 130, 32, torch.float32, "random", "static_cache", 1),
    (2, 4, 2, 2, 3, 130, 32, torch.float32, "random", "static_cache", 4),  # split-KV: some chunks fully hidden
    (1, 4, 2, 4, 3, 70, 16, torch.float16, "all", "random_per_head", 3),
    (2, 4, 4, 2, 2, 64, 32, torch.float32, "random", "padding_2d", 2),
    (1, 4, 2, 2, 2, 600, 16, torch.float16, "random", "static_cache", 19),  # many chunks, some fully hidden
]


@pytest.mark.parametrize("batch,hq,hkv,groups,q_len,kv_len,head_dim,dtype,mask_kind,amask_kind,splits", MASKED_CASES)
def test_explicit_boolean_mask_matches_reference(batch, hq, hkv, groups, q_len, kv_len, head_dim, dtype, mask_kind,
                                                 amask_kind, splits):
    gen = torch.Generator().manual_seed(q_len * 17 + kv_len)
    q, k, v = make_inputs(batch, hq, hkv, q_len, kv_len, head_dim, dtype, gen)
    head_mask = make_mask(mask_kind, batch, q_len, groups, gen)
    amask = attn_mask_of(amask_kind, batch, hq, q_len, kv_len, gen)
    out = poisoned(batch, hq, q_len, head_dim, dtype)
    if splits is None:
        group_attention_prefill(q, k, v, head_mask, causal=False, out=out, attn_mask=amask)
    else:
        group_attention_decode(q, k, v, head_mask, causal=False, out=out, num_splits=splits, attn_mask=amask)
    ref = group_attention_reference(q, k, v, head_mask, causal=False, attn_mask=amask)
    assert_matches(out, ref, head_mask, dtype)


def test_reference_with_a_mask_matches_sdpa():
    """The reference's explicit-mask semantics are SDPA's (boolean mask, True = attend), GQA expanded by hand."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = make_inputs(2, 4, 2, 5, 12, 16, torch.float32, gen)
    amask = static_cache_mask(2, 5, 12, start=4)
    ref = group_attention_reference(q, k, v, torch.ones(2, 5, 2), causal=False, attn_mask=amask)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=amask)
    torch.testing.assert_close(ref, sdpa, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("amask, causal, error, match", [
    (lambda: torch.ones(1, 1, 3, 8), False, TypeError, "attn_mask must be boolean"),
    (lambda: torch.ones(1, 1, 3, 8, dtype=torch.bool), True, ValueError, "either causal=True or an attn_mask"),
    (lambda: torch.ones(1, 3, 3, 8, dtype=torch.bool), False, ValueError, "does not broadcast"),
    (lambda: torch.ones(8, dtype=torch.bool), False, ValueError, "does not broadcast"),
])
def test_bad_attention_masks_raise_clear_errors(amask, causal, error, match):
    q, k, v, m = _good_inputs()
    with pytest.raises(error, match=match):
        group_attention(q, k, v, m, causal=causal, attn_mask=amask())


@pytest.mark.parametrize("shape, kind", [((2, 1, 37, 70), "static_cache"), ((1, 3, 5, 40), "random"),
                                         ((2, 1, 1, 33), "padding"), ((1, 1, 4, 9), "none")])
def test_mask_extents_match_reference(shape, kind):
    """First / last visible key per mask row (S, -1 for rows that see nothing), also through a broadcast view."""
    gen = torch.Generator().manual_seed(sum(shape))
    b, h, t, s = shape
    if kind == "static_cache":
        mask = static_cache_mask(b, t, s, start=20)
    elif kind == "random":
        mask = torch.rand(shape, generator=gen) < 0.2
        mask[0, 0, 0] = False  # a row that sees nothing
    elif kind == "padding":
        mask = (torch.rand(b, 1, 1, s, generator=gen) < 0.7).expand(shape)
    else:
        mask = torch.zeros(shape, dtype=torch.bool)
    ext = attention_mask_extents.mask_extents(mask)
    assert torch.equal(ext, attention_mask_extents.mask_extents_reference(mask))
    if kind == "random":
        assert ext[0, 0, 0].tolist() == [s, -1, 1]  # sees nothing: an empty range counts as contiguous
        assert (ext[..., 2] == 0).any()  # random rows have holes
    if kind == "static_cache":
        assert bool((ext[..., 2] == 1).all())  # causal rows: one range each


@pytest.mark.parametrize("amask_kind", ["static_cache", "holes_in_later_rows", "padding_2d"])
def test_prefill_with_shared_mask_extents(amask_kind):
    """Extents computed once (``attn_mask_extents``) and passed to two attentions over the same mask (two layers)
    give what each attention computes with its own; through the entry point a decode-sized call ignores them."""
    gen = torch.Generator().manual_seed(len(amask_kind))
    batch, hq, hkv, groups, q_len, kv_len, d = 2, 4, 2, 2, 37, 100, 16
    amask = attn_mask_of(amask_kind, batch, hq, q_len, kv_len, gen)
    extents = attention_mask_extents.attn_mask_extents(amask, kv_len)
    assert extents.dtype == torch.int32 and extents.shape[-1] == 3
    for layer in range(2):
        q, k, v = make_inputs(batch, hq, hkv, q_len, kv_len, d, torch.float32, gen)
        head_mask = make_mask("random", batch, q_len, groups, gen)
        out = poisoned(batch, hq, q_len, d, torch.float32)
        group_attention(q, k, v, head_mask, causal=False, out=out, attn_mask=amask, attn_mask_extents=extents)
        assert_matches(out, group_attention_reference(q, k, v, head_mask, causal=False, attn_mask=amask), head_mask,
                       torch.float32)
    one = static_cache_mask(batch, 1, kv_len, start=50)
    q, k, v = make_inputs(batch, hq, hkv, 1, kv_len, d, torch.float32, gen)
    head_mask = make_mask("random", batch, 1, groups, gen)
    got = group_attention(q, k, v, head_mask, causal=False, attn_mask=one,
                          attn_mask_extents=attention_mask_extents.attn_mask_extents(one, kv_len))
    assert_matches(got, group_attention_reference(q, k, v, head_mask, causal=False, attn_mask=one), head_mask,
                   torch.float32)


def test_bad_mask_extents_raise_clear_errors():
    q, k, v, m = _good_inputs()
    amask = torch.ones(1, 1, q.shape[2], k.shape[2], dtype=torch.bool)
    good = attention_mask_extents.attn_mask_extents(amask, k.shape[2])
    with pytest.raises(ValueError, match="attn_mask_extents given without the attn_mask"):
        group_attention(q, k, v, m, causal=False, attn_mask_extents=good)
    for bad in (good[:, :, :-1], good.long(), good[..., :2]):
        with pytest.raises(ValueError, match="attn_mask_extents must be int32"):
            group_attention(q, k, v, m, causal=False, attn_mask=amask, attn_mask_extents=bad)


def test_prefill_mask_broadcast_over_keys_and_queries():
    """Masks broadcast over keys ([T, 1]) or queries ([B, 1, 1, S]) still reach every key they allow."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = make_inputs(2, 4, 2, 33, 70, 16, torch.float32, gen)
    head_mask = make_mask("random", 2, 33, 2, gen)
    for amask in (torch.rand(33, 1, generator=gen) < 0.7, torch.rand(2, 1, 1, 70, generator=gen) < 0.5):
        out = poisoned(2, 4, 33, 16, torch.float32)
        group_attention_prefill(q, k, v, head_mask, causal=False, out=out, attn_mask=amask)
        assert_matches(out, group_attention_reference(q, k, v, head_mask, causal=False, attn_mask=amask), head_mask,
                       torch.float32)


def test_prefill_launch_config_follows_the_prompt_with_an_explicit_mask(monkeypatch):
    """The GPU launch rule: tiles by max(T, S) without a mask, by T with one (a static cache's unfilled slots are
    never visited): a 4096-token prompt in 4160 slots takes the tiles measured faster there (2 packed heads x 32
    rows, K / V as TMA boxes); longer prompts 4 heads x 32 rows with 8 warps and pointer loads; wide fp32 heads no
    packing."""
    prefill = sys.modules["wide_compile.templates.attention_prefill"]
    monkeypatch.setattr(prefill, "interpreting", lambda: False)
    small = {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "H_PACK": 2, "TMA": True,
             "HEADS_FIRST": True, "ACTIVE_FIRST": True}
    assert prefill.prefill_config(4096, 4160, 128, 2, masked=True) == small
    assert prefill.prefill_config(4096, 4160, 128, 2)["num_warps"] == 8
    assert prefill.prefill_config(16384, 16448, 128, 2, masked=True)["H_PACK"] == 4
    assert not prefill.prefill_config(16384, 16448, 128, 2, masked=True)["TMA"]  # 8 warps: pointer loads
    assert prefill.prefill_config(1024, 1024, 128, 2) == small
    assert prefill.prefill_config(1024, 1024, 128, 4)["H_PACK"] == 1


def test_default_packing_falls_back_to_taller_tiles(monkeypatch):
    """SmolLM2's 3 query heads per KV head allow no packing: the default's 2 x 32 rows become one head x 64 rows
    (what the kernel ran before packing); the output still matches the reference."""
    prefill = sys.modules["wide_compile.templates.attention_prefill"]
    launched = []
    real = prefill._prefill_kernel

    class Spy:
        def __getitem__(self, grid):
            def run(*args, **meta):
                launched.append((grid, meta["BLOCK_M"], meta["H_PACK"]))
                return real[grid](*args, **meta)
            return run

    monkeypatch.setattr(prefill, "_prefill_kernel", Spy())
    monkeypatch.setattr(prefill, "prefill_config",
                        lambda *a, **k: {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "H_PACK": 2})
    gen = torch.Generator().manual_seed(5)
    q, k, v = make_inputs(1, 6, 2, 20, 20, 16, torch.float32, gen)  # 3 query heads per KV head and per group
    head_mask = make_mask("random", 1, 20, 2, gen)
    out = poisoned(1, 6, 20, 16, torch.float32)
    group_attention_prefill(q, k, v, head_mask, causal=True, out=out)
    assert launched == [((1, 6), 32, 1)]
    assert_matches(out, group_attention_reference(q, k, v, head_mask, causal=True), head_mask, torch.float32)


PACKED_CASES = [
    # batch, Hq, Hkv, G, T, S, D, dtype, head-mask kind, attention-mask kind (None: causal), H_PACK
    (2, 8, 2, 2, 70, 70, 32, torch.float32, "random", None, 4),
    (1, 8, 2, 4, 37, 37, 16, torch.float16, "clustered", None, 2),
    (2, 8, 2, 2, 37, 130, 32, torch.float32, "random", "static_cache", 2),
    (1, 8, 2, 2, 40, 70, 16, torch.float16, "random", "random_per_head", 4),
    (2, 8, 4, 4, 70, 100, 32, torch.float32, "none", "holes_in_later_rows", 2),
    (2, 8, 4, 4, 70, 100, 32, torch.float32, "random", "holes_in_later_rows", 2),
]


@pytest.mark.parametrize("batch,hq,hkv,groups,q_len,kv_len,head_dim,dtype,mask_kind,amask_kind,pack", PACKED_CASES)
def test_prefill_with_packed_query_heads(batch, hq, hkv, groups, q_len, kv_len, head_dim, dtype, mask_kind,
                                         amask_kind, pack):
    """``H_PACK`` query heads of one group (and one KV head) in one tile: they share the active rows and each K/V
    block; causal and explicit masks (per-head masks too), both passes of the explicit-mask kernel; both grid orders
    (``HEADS_FIRST``) and zero-only tiles last (``ACTIVE_FIRST``)."""
    from wide_compile.templates.attention_checks import check_attention_inputs

    gen = torch.Generator().manual_seed(q_len * 7 + pack)
    q, k, v = make_inputs(batch, hq, hkv, q_len, kv_len, head_dim, dtype, gen)
    head_mask = make_mask(mask_kind, batch, q_len, groups, gen)
    amask = None if amask_kind is None else attn_mask_of(amask_kind, batch, hq, q_len, kv_len, gen)
    causal = amask is None
    dims = check_attention_inputs(q, k, v, head_mask, causal, None, amask, None)
    ref = group_attention_reference(q, k, v, head_mask, causal=causal, attn_mask=amask)
    for heads_first, active_first in ((False, False), (True, False), (True, True), (False, True)):
        # grid (tiles, heads) or (heads, tiles), zero-only tiles first or last: the same tiles in another order
        out = poisoned(batch, hq, q_len, head_dim, dtype)
        cfg = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "H_PACK": pack,
               "HEADS_FIRST": heads_first, "ACTIVE_FIRST": active_first}
        attention_prefill.launch_prefill(q, k, v, head_mask, out, dims, causal, cfg, attn_mask=amask)
        assert_matches(out, ref, head_mask, dtype)


def test_head_packing_checks_the_shape():
    from wide_compile.templates.attention_checks import check_attention_inputs

    gen = torch.Generator().manual_seed(3)
    q, k, v = make_inputs(1, 8, 4, 9, 9, 16, torch.float32, gen)  # 2 query heads per KV head, 4 per group
    dims = check_attention_inputs(q, k, v, make_mask("random", 1, 9, 2, gen), True, None, None, None)
    assert attention_prefill.head_pack({"H_PACK": 4}, dims, explicit=False) == 2
    assert attention_prefill.head_pack({}, dims, explicit=False) == 1
    with pytest.raises(ValueError, match="H_PACK=4 must divide"):
        attention_prefill.head_pack({"H_PACK": 4}, dims, explicit=True)
    with pytest.raises(ValueError, match="power of two"):
        attention_prefill.head_pack({"H_PACK": 3}, dims, explicit=True)
