"""Baselines: dynamic depth (one group per block) and static width (fixed groups chosen by importance)."""

from __future__ import annotations

import copy

import pytest
import torch

import wide_compile
from wide_compile.baselines import apply_depth_skip, apply_static_width, block_sizes, static_masks
from wide_compile.models.static_width import group_importance, group_weight_norms, kept_group_count
from wide_compile.state import get_state
from wide_compile.testing.tiny_models import tiny_model

VOCAB = 128  # tiny_models vocabulary


def _batches(n: int = 2, batch: int = 2, seq: int = 12, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (batch, seq), generator=generator) for _ in range(n)]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_depth_skip_has_one_group_per_block(family):
    model = tiny_model(family)
    heads, intermediate = block_sizes(model)
    apply_depth_skip(model, sparsity=0.25)
    state = get_state(model)
    blueprint = {layer.index: layer for layer in state.blueprint.layers}
    assert {b.kind for b in state.blocks} == {"attention", "mlp"} and len(state.blocks) == 4
    for block in state.blocks:
        layer = blueprint[block.layer_index]
        assert block.groups == 1
        width = layer.attention.width if block.kind == "attention" else layer.mlp.intermediate
        assert block.group_width == width
    assert (heads, intermediate) == (4, 128 if family == "llama" else 256)
    config = wide_compile.config_of(model)
    assert (config.attn_group_size, config.ffn_group_size, config.sparsity) == (heads, intermediate, 0.25)
    model(_batches(1)[0])
    assert all(mask.shape[-1] == 1 for mask in wide_compile.realized_masks(model).values())


def test_depth_skip_forced_skip_removes_whole_blocks():
    """Skipping the single group of every block leaves only the residual stream: like zeroed output projections."""
    model = tiny_model("llama")
    reference = copy.deepcopy(model)
    for layer in reference.model.layers:
        layer.self_attn.o_proj.weight.data.zero_()
        layer.mlp.down_proj.weight.data.zero_()
    apply_depth_skip(model, sparsity=0.5)
    ids = _batches(1)[0]
    with wide_compile.forced(model, "skip"):
        torch.testing.assert_close(model(ids).logits, reference(ids).logits)


def test_depth_skip_rejects_group_sizes():
    with pytest.raises(ValueError, match="sets ffn_group_size itself"):
        apply_depth_skip(tiny_model("llama"), 0.5, ffn_group_size=32)


def _reference_importance(model, batches, target: str, groups: int, width: int) -> torch.Tensor:
    """Independent calculation: mean over tokens of per-group input norms x per-group weight-column norms."""
    module = model.get_submodule(target)
    seen = []
    handle = module.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().reshape(-1, groups, width)))
    with torch.no_grad():
        for ids in batches:
            model(ids)
    handle.remove()
    acts = torch.cat(seen).norm(dim=-1).mean(dim=0)
    weight = module.weight.detach()
    cols = torch.stack([weight[:, g * width:(g + 1) * width].norm() for g in range(groups)])
    return acts * cols


def _scaled_llama() -> torch.nn.Module:
    """Tiny Llama where one FFN group (32 channels) and one head group (2 heads) have 20x larger weights."""
    model = tiny_model("llama", seed=4)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[:, 32:64] *= 20.0  # layer 0: FFN group 1
        model.model.layers[1].mlp.down_proj.weight[:, 96:128] *= 20.0  # layer 1: FFN group 3
        model.model.layers[1].self_attn.o_proj.weight[:, 0:32] *= 20.0  # layer 1: head group 0 (heads 0, 1)
    return model


def test_static_width_keeps_the_most_important_groups():
    model = _scaled_llama()
    dense = copy.deepcopy(model)
    batches = _batches()
    apply_static_width(model, 0.5, batches, ffn_group_size=32)
    masks = static_masks(model)
    kept = masks.kept_groups()
    # keep round(0.5 * G): 1 of 2 head groups, 2 of 4 FFN groups; the scaled groups always survive
    assert [len(kept[(i, k)]) for i in (0, 1) for k in ("attention", "mlp")] == [1, 2, 1, 2]
    assert 1 in kept[(0, "mlp")] and 3 in kept[(1, "mlp")] and kept[(1, "attention")] == [0]
    for (layer, kind), scores in masks.importance.items():
        target = f"model.layers.{layer}." + ("self_attn.o_proj" if kind == "attention" else "mlp.down_proj")
        groups, width = (2, 32) if kind == "attention" else (4, 32)
        expected = _reference_importance(dense, batches, target, groups, width)
        torch.testing.assert_close(scores, expected, rtol=1e-4, atol=1e-6)
        top = torch.argsort(expected, descending=True)[: kept_group_count(groups, 0.5)]
        assert sorted(top.tolist()) == kept[(layer, kind)]
    assert masks.sparsity() == 0.5


def test_static_width_output_equals_model_with_pruned_columns():
    """The static model computes what the dense model does with the dropped groups' weight columns zeroed."""
    model = _scaled_llama()
    pruned = copy.deepcopy(model)
    apply_static_width(model, 0.75, _batches(), ffn_group_size=32)
    kept = static_masks(model).kept_groups()
    with torch.no_grad():
        for (layer, kind), groups in kept.items():
            block = pruned.model.layers[layer]
            weight = (block.self_attn.o_proj if kind == "attention" else block.mlp.down_proj).weight
            keep = torch.zeros(weight.shape[1], dtype=torch.bool)
            for g in groups:
                keep[g * 32:(g + 1) * 32] = True
            weight[:, ~keep] = 0.0
    ids = _batches(1, seed=7)[0]
    torch.testing.assert_close(model(ids).logits, pruned(ids).logits, rtol=1e-5, atol=1e-5)
    for key, mask in wide_compile.realized_masks(model).items():  # the same mask for every token
        assert torch.equal(mask, static_masks(model).masks[key].expand_as(mask))
    rates = wide_compile.skip_rates(model)
    assert rates["mlp"] == 0.75 and rates["attention"] == 1.0  # round(0.25 * 2) = 0 head groups kept


def test_static_width_ignores_padded_calibration_tokens():
    model = tiny_model("llama", seed=5)
    blocks_model = wide_compile.apply(copy.deepcopy(model), 0.5, ffn_group_size=32)
    blocks = get_state(blocks_model).blocks
    ids = _batches(1, seq=10)[0]
    attention_mask = torch.ones_like(ids)
    attention_mask[1, 6:] = 0  # right padding of the second row
    with wide_compile.forced(blocks_model, "execute"):
        padded = group_importance(blocks_model, blocks, [{"input_ids": ids, "attention_mask": attention_mask}])
        separate = group_importance(blocks_model, blocks, [ids[:1], ids[1:, :6]])
    for key in padded:
        torch.testing.assert_close(padded[key], separate[key], rtol=1e-5, atol=1e-6)


def test_conv1d_weight_norms_match_linear_layout():
    model = tiny_model("gpt2")
    conv = model.transformer.h[0].mlp.c_proj  # Conv1D: weight [in=256, out=64]
    expected = torch.stack([conv.weight[g * 64:(g + 1) * 64, :].norm() for g in range(4)])
    torch.testing.assert_close(group_weight_norms(conv, 4, 64), expected.detach())
    apply_static_width(model, 0.5, _batches(1), ffn_group_size=64)
    assert all(len(v) == 2 for v in static_masks(model).kept_groups().values())  # 4 head, 4 FFN groups


@pytest.mark.parametrize(
    ("sparsity", "batches", "error", "message"),
    [
        (1.0, _batches(1), ValueError, r"sparsity must be in \[0, 1\)"),
        (0.5, [], ValueError, "calibration_batches is empty"),
        (0.5, [torch.randn(2, 8)], ValueError, "input ids"),
        (0.5, ["text"], ValueError, "input-id tensor"),
    ],
)
def test_static_width_bad_input_leaves_model_untouched(sparsity, batches, error, message):
    model = tiny_model("llama")
    with pytest.raises(error, match=message):
        apply_static_width(model, sparsity, batches, ffn_group_size=32)
    assert not wide_compile.is_applied(model)


def test_static_masks_requires_static_model():
    model = wide_compile.apply(tiny_model("llama"), 0.5, ffn_group_size=32)
    with pytest.raises(ValueError, match="no static width masks"):
        static_masks(model)
