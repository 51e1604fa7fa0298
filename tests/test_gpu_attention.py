"""GPU tests of the head-group attention kernels at Llama-3-8B attention shapes (32 query heads, 8 KV heads, D=128).

Marked ``gpu``; skipped only when no CUDA GPU exists. Every call writes into an output poisoned with NaN and is
compared with the float32 PyTorch reference on random inputs.
"""

from __future__ import annotations

import pytest
import torch

from wide_compile.templates.attention import group_attention
from wide_compile.templates.attention_compact import compact_active_rows, compact_active_rows_reference
from wide_compile.templates.attention_decode import group_attention_decode
from wide_compile.templates.attention_prefill import group_attention_prefill
from wide_compile.templates.attention_reference import group_attention_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

HQ, HKV, D = 32, 8, 128
TOL = {torch.bfloat16: 1.2e-2, torch.float16: 4e-3}


def _inputs(batch, q_len, kv_len, dtype, mask_kind, groups=HKV, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, HQ, q_len, D, device="cuda", generator=gen).to(dtype)
    k = torch.randn(batch, HKV, kv_len, D, device="cuda", generator=gen).to(dtype)
    v = torch.randn(batch, HKV, kv_len, D, device="cuda", generator=gen).to(dtype)
    if mask_kind == "all":
        mask = torch.ones(batch, q_len, groups, dtype=torch.bool, device="cuda")
    elif mask_kind == "none":
        mask = torch.zeros(batch, q_len, groups, dtype=torch.bool, device="cuda")
    else:
        mask = torch.rand(batch, q_len, groups, device="cuda", generator=gen) < 0.5
    return q, k, v, mask


def _check(out, ref, mask, dtype):
    assert not torch.isnan(out).any(), "unwritten (NaN) outputs"
    inactive = ~mask.repeat_interleave(HQ // mask.shape[-1], dim=2).permute(0, 2, 1)
    assert torch.all(out[inactive] == 0), "inactive pairs must be exactly zero"
    ref32, out32 = ref.float(), out.float()
    if ref32.norm() == 0:
        assert torch.all(out32 == 0)
        return
    rel = ((out32 - ref32).norm() / ref32.norm()).item()
    assert rel < TOL[dtype], f"relative error {rel:.2e}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("q_len", [1000, 4096])
@pytest.mark.parametrize("mask_kind", ["random", "all", "none"])
def test_prefill_llama3_8b(dtype, q_len, mask_kind):
    q, k, v, mask = _inputs(1, q_len, q_len, dtype, mask_kind, seed=q_len)
    out = torch.full_like(q, float("nan"))
    group_attention_prefill(q, k, v, mask, causal=True, out=out)
    _check(out, group_attention_reference(q, k, v, mask, causal=True), mask, dtype)


@pytest.mark.parametrize("causal", [True, False])
def test_prefill_chunked_per_head_groups_merged_output(causal):
    """T < S (chunked prefill), G = Hq (one head per group), output written as [B, T, Hq*D]."""
    q, k, v, mask = _inputs(2, 1000, 3000, torch.bfloat16, "random", groups=HQ, seed=7)
    out = torch.full((2, 1000, HQ * D), float("nan"), dtype=torch.bfloat16, device="cuda")
    group_attention(q, k, v, mask, causal=causal, merge_heads=True, out=out)
    merged = out.unflatten(2, (HQ, D)).transpose(1, 2)
    _check(merged, group_attention_reference(q, k, v, mask, causal=causal), mask, torch.bfloat16)


@pytest.mark.parametrize("batch", [1, 4, 16])
@pytest.mark.parametrize("kv_len", [1024, 8191])
@pytest.mark.parametrize("mask_kind", ["random", "all", "none"])
def test_decode_llama3_8b(batch, kv_len, mask_kind):
    dtype = torch.bfloat16
    q, k, v, mask = _inputs(batch, 1, kv_len, dtype, mask_kind, seed=batch + kv_len)
    out = torch.full_like(q, float("nan"))
    group_attention(q, k, v, mask, out=out)
    _check(out, group_attention_reference(q, k, v, mask), mask, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("q_len,splits", [(4, None), (16, 7), (3, 1), (16, 3)])
def test_decode_multi_token(dtype, q_len, splits):
    q, k, v, mask = _inputs(4, q_len, 8191, dtype, "random", seed=q_len)
    out = torch.full_like(q, float("nan"))
    group_attention_decode(q, k, v, mask, out=out, num_splits=splits)
    _check(out, group_attention_reference(q, k, v, mask), mask, dtype)


def test_decode_replays_in_cuda_graph():
    q, k, v, mask = _inputs(4, 1, 4096, torch.bfloat16, "random", seed=3)
    out = torch.full_like(q, float("nan"))
    group_attention(q, k, v, mask, out=out)  # compile + autotune outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        group_attention(q, k, v, mask, out=out)
    for seed in range(2):  # new inputs in the same buffers, replay, compare
        fresh = _inputs(4, 1, 4096, torch.bfloat16, "random", seed=100 + seed)
        for dst, src in zip((q, k, v, mask), fresh):
            dst.copy_(src)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, group_attention_reference(q, k, v, mask), mask, torch.bfloat16)


@pytest.mark.parametrize("q_len", [1, 1000, 5000])
def test_compaction_matches_reference(q_len):
    *_, mask = _inputs(3, q_len, q_len, torch.bfloat16, "random", seed=q_len)
    order, count = compact_active_rows(mask)
    ref_order, ref_count = compact_active_rows_reference(mask)
    assert torch.equal(count, ref_count) and torch.equal(order, ref_order)


@pytest.mark.parametrize("q_len", [2048, 5000, 16384, 20011])
@pytest.mark.parametrize("kind", ["random", "random_bf16", "all", "none", "packed_slice"])
def test_two_pass_compaction_of_one_sequence_on_gpu(q_len, kind):
    """One long sequence's row order from the two-pass build (forced; the default from 4096 tokens) equals the
    one-program-per-group scan's and the reference's, entry for entry (bool, bf16 0 / 1 and strided masks)."""
    gen = torch.Generator(device="cuda").manual_seed(q_len + len(kind))
    if kind in ("all", "none"):
        mask = _inputs(1, q_len, 1, torch.bfloat16, kind)[3]
    else:
        mask = torch.rand(1, q_len, HKV, device="cuda", generator=gen) < 0.5
    if kind == "random_bf16":
        mask = mask.to(torch.bfloat16)
    elif kind == "packed_slice":
        packed = torch.zeros(1, q_len, 3 * HKV, dtype=torch.bfloat16, device="cuda")
        packed[..., HKV:2 * HKV] = mask.to(torch.bfloat16)
        mask = packed[..., HKV:2 * HKV]
    order, count = compact_active_rows(mask, {"two_pass": True})
    one_order, one_count = compact_active_rows(mask, {"two_pass": False})
    ref_order, ref_count = compact_active_rows_reference(mask)
    assert torch.equal(count, one_count) and torch.equal(order, one_order)
    assert torch.equal(count, ref_count) and torch.equal(order, ref_order)


@pytest.mark.parametrize("q_len", [1, 300])
def test_float32_inputs(q_len):
    """fp32 runs its dots in IEEE fp32 with smaller tiles (shared-memory budget)."""
    q, k, v, mask = _inputs(2, q_len, 700, torch.float32, "random", groups=4, seed=q_len)
    out = torch.full_like(q, float("nan"))
    group_attention(q, k, v, mask, out=out)
    ref = group_attention_reference(q, k, v, mask)
    assert not torch.isnan(out).any()
    assert ((out - ref).norm() / ref.norm()).item() < 1e-4


def _static_cache_mask(batch, q_len, slots, start):
    """HF's static-cache mask: query t at position start + t sees keys 0 .. start + t of ``slots``."""
    pos = torch.arange(q_len, device="cuda")[:, None] + start
    return (torch.arange(slots, device="cuda")[None, :] <= pos).expand(batch, 1, q_len, slots)


@pytest.mark.parametrize("batch, q_len, slots, start", [(1, 1, 2048, 1100), (8, 1, 2048, 1024), (4, 3, 4096, 3000),
                                                        (1, 1000, 1088, 0), (1, 4096, 4160, 0)])
@pytest.mark.parametrize("mask_kind", ["random", "all"])
def test_static_cache_boolean_mask(batch, q_len, slots, start, mask_kind):
    """Decode and prefill into a static KV cache, as the wide backend runs them (SDPA's boolean mask passed on)."""
    q, k, v, mask = _inputs(batch, q_len, slots, torch.bfloat16, mask_kind, seed=q_len + start)
    amask = _static_cache_mask(batch, q_len, slots, start)
    out = torch.full_like(q, float("nan"))
    group_attention(q, k, v, mask, causal=False, out=out, attn_mask=amask)
    _check(out, group_attention_reference(q, k, v, mask, causal=False, attn_mask=amask), mask, torch.bfloat16)


@pytest.mark.parametrize("q_len, slots, holes", [(1000, 1088, "some_rows"), (2048, 2112, "every_row")])
def test_mask_tile_pass_takes_the_listed_tiles(q_len, slots, holes):
    """A mask whose rows are not one contiguous key range (keys hidden inside the causal band): the extents pass lists
    those tiles and the mask-tile pass's small grid takes them. Three calls in a row, the last with a plain static-cache
    mask: the list's counters must be back at zero after each call."""
    q, k, v, mask = _inputs(1, q_len, slots, torch.bfloat16, "random", seed=q_len + 11)
    plain = _static_cache_mask(1, q_len, slots, 0)
    gen = torch.Generator(device="cuda").manual_seed(q_len)
    hidden = torch.rand(1, 1, q_len, slots, device="cuda", generator=gen) < 0.2
    if holes == "some_rows":
        hidden &= (torch.arange(q_len, device="cuda") % 7 == 3)[None, None, :, None]
    hidden[..., 0] = False  # every row keeps key 0
    holey = plain & ~hidden
    for amask in (holey, holey, plain):
        out = torch.full_like(q, float("nan"))
        group_attention(q, k, v, mask, causal=False, out=out, attn_mask=amask)
        _check(out, group_attention_reference(q, k, v, mask, causal=False, attn_mask=amask), mask, torch.bfloat16)


@pytest.mark.parametrize("cfg", [(64, 64, 8, 3, 2), (32, 64, 8, 3, 4), (32, 64, 4, 3, 2), (64, 128, 8, 2, 2),
                                 (128, 64, 8, 3, 2)])
@pytest.mark.parametrize("q_len, slots, mask_kind", [(4096, 4160, "random"), (1000, 1088, "all"), (999, 999, "none")])
def test_prefill_with_packed_query_heads(cfg, q_len, slots, mask_kind):
    """Query heads of one group packed into one tile (``H_PACK``), on the static cache's explicit mask and causal."""
    from wide_compile.templates.attention_checks import check_attention_inputs
    from wide_compile.templates.attention_prefill import launch_prefill

    config = dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "H_PACK"), cfg))
    q, k, v, mask = _inputs(1, q_len, slots, torch.bfloat16, mask_kind, seed=q_len + cfg[-1])
    amask = _static_cache_mask(1, q_len, slots, 0) if slots != q_len else None
    dims = check_attention_inputs(q, k, v, mask, amask is None, None, amask, None)
    out = torch.full_like(q, float("nan"))
    launch_prefill(q, k, v, mask, out, dims, amask is None, config, attn_mask=amask)
    ref = group_attention_reference(q, k, v, mask, causal=amask is None, attn_mask=amask)
    _check(out, ref, mask, torch.bfloat16)


@pytest.mark.parametrize("q_len, slots, mask_kind, cfg", [(4096, 4160, "random", None), (1000, 1000, "all", None),
                                                          (999, 1088, "none", None), (4096, 4160, "random", (64, 64, 8, 3, 2)),
                                                          (2000, 2064, "random", (32, 64, 8, 3, 4))])
def test_prefill_kv_blocks_through_tma(q_len, slots, mask_kind, cfg):
    """K / V blocks as TMA boxes (``TMA=True``) on the static cache's layout (boxes past the filled keys read other
    rows, whose scores are hidden) and causal: against the reference, and within rounding of the pointer loads."""
    from wide_compile.templates.attention_checks import check_attention_inputs
    from wide_compile.templates.attention_prefill import launch_prefill, prefill_config

    q, k, v, mask = _inputs(1, q_len, slots, torch.bfloat16, mask_kind, seed=q_len + 3)
    amask = _static_cache_mask(1, q_len, slots, 0) if slots != q_len else None
    dims = check_attention_inputs(q, k, v, mask, amask is None, None, amask, None)
    keys = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "H_PACK")
    config = dict(zip(keys, cfg)) if cfg else prefill_config(q_len, slots, D, masked=amask is not None)
    outs = []
    for tma, heads_first in ((False, False), (True, False), (True, True)):
        out = torch.full_like(q, float("nan"))
        launch_prefill(q, k, v, mask, out, dims, amask is None, {**config, "TMA": tma, "HEADS_FIRST": heads_first},
                       attn_mask=amask)
        outs.append(out)
    ref = group_attention_reference(q, k, v, mask, causal=amask is None, attn_mask=amask)
    _check(outs[1], ref, mask, torch.bfloat16)
    denom = outs[0].float().norm().clamp_min(1e-30)
    assert ((outs[1].float() - outs[0].float()).norm() / denom).item() < 1e-3
    assert torch.equal(outs[2], outs[1])  # HEADS_FIRST: the same programs launched in another order
