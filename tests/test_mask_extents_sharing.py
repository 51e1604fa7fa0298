"""``wide::attn_mask_extents`` and the pass that shares it (``passes/mask_extents_sharing.py``).

A WIDE tiny Llama generating on a static cache: its prefill graph (20 tokens) computes the mask's row extents once
for both layers' attention cores; its decode graph (1 token) computes none; the generation equals eager's.
"""
from __future__ import annotations

import copy

import pytest
import torch
from test_static_cache_generate import (
    LAYERS, assert_same_generation, greedy, pattern_masks, reset_compilation, tiny_llama,
)

import wide_compile
import wide_compile.group_attention_op  # noqa: F401  (registers wide::group_attention)
import wide_compile.mask_extents_op  # noqa: F401  (registers wide::attn_mask_extents)
from wide_compile.passes.torch_patterns import example_value
from wide_compile.templates.attention_mask_extents import mask_extents_reference

EXTENTS, CORE = torch.ops.wide.attn_mask_extents.default, torch.ops.wide.group_attention.default


def test_prefill_graph_shares_one_extents_node_and_generation_matches_eager(one_thread):
    reset_compilation()
    eager = tiny_llama(wide=True)
    wide_compile.set_forced(eager, pattern_masks)
    compiled = copy.deepcopy(eager)
    compiled.compile(backend="wide", options={"wide.inner": "aot_eager"})
    ids = torch.randint(3, 120, (2, 20))
    assert_same_generation(greedy(compiled, ids), greedy(eager, ids))
    report = wide_compile.compile_report(compiled)
    assert len(report.graphs) == 2, str(report)
    for record in report.graphs:
        nodes = list(record.graph_module.graph.nodes)
        extents = [n for n in nodes if n.target == EXTENTS]
        cores = [n for n in nodes if n.target == CORE]
        queries = {example_value(core.args[0]).shape[2] for core in cores}
        want = 1 if queries == {20} else 0  # the prefill graph; the decode graph (1 token) has none
        assert len(cores) == LAYERS and queries in ({20}, {1}), str(report)
        assert len(extents) == want and record.lowered.get("attn_mask_extents", 0) == want, str(report)
        if want:  # every core reads the one extents node, computed from the mask it attends with
            assert all(core.args[7] is extents[0] and core.args[6] is extents[0].args[0] for core in cores)


@pytest.mark.parametrize("shape", [(2, 1, 5, 9), (5, 9), (1, 3, 4, 9)])
def test_op_equals_the_reference_and_its_fake(shape):
    gen = torch.Generator().manual_seed(len(shape))
    mask = torch.rand(shape, generator=gen) < 0.5
    got = torch.ops.wide.attn_mask_extents(mask, 9)
    mask4 = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    assert torch.equal(got, mask_extents_reference(mask4))
    with torch._subclasses.FakeTensorMode() as mode:
        fake = torch.ops.wide.attn_mask_extents(mode.from_tensor(mask), 9)
    assert fake.shape == got.shape and fake.dtype == torch.int32


def test_op_rejects_a_non_boolean_mask():
    with pytest.raises(ValueError, match="attn_mask must be a 2-4-D boolean mask"):
        torch.ops.wide.attn_mask_extents(torch.ones(3, 4), 4)
