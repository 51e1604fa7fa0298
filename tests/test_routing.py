"""Router semantics on a real (tiny) model: argmax in eval, exact top-k budget, Gumbel in training."""

import copy

import pytest
import torch

import wide_compile
from wide_compile.testing.tiny_models import tiny_model

IDS = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(0))


def _residuals(model):
    """Capture every router input with plain hooks on the source modules."""
    seen, handles = {}, []
    for block in wide_compile.state.get_state(model).blocks:
        module = model.get_submodule(block.source_path)
        handles.append(module.register_forward_pre_hook(
            lambda m, args, key=block.key: seen.__setitem__(key, args[0].detach().clone())))
    return seen, handles


def test_eval_mask_is_argmax_of_router_logits_on_the_residual():
    model = wide_compile.apply(tiny_model("llama"), ffn_group_size=32)
    seen, handles = _residuals(model)
    with torch.no_grad():
        model(IDS)
    for h in handles:
        h.remove()
    masks = wide_compile.realized_masks(model)
    for block in wide_compile.state.get_state(model).blocks:
        r = block.router
        x = seen[block.key].float()
        logits = ((x @ r.w_in.T + r.b_in) @ r.w_out.T + r.b_out).view(*x.shape[:-1], block.groups, 2)
        assert torch.equal(masks[block.key], (logits[..., 1] >= logits[..., 0]).float()), block.key


def test_eval_is_deterministic_and_training_is_stochastic():
    model = wide_compile.apply(tiny_model("mistral"), ffn_group_size=32)
    with torch.no_grad():
        a, b = model(IDS).logits, model(IDS).logits
        assert torch.equal(a, b)
        model.train()
        wide_compile.set_temperature(model, 5.0)
        masks = []
        for _ in range(3):
            model(IDS)
            masks.append(torch.cat([m.flatten() for m in wide_compile.realized_masks(model).values()]))
    assert not all(torch.equal(masks[0], m) for m in masks[1:])


@pytest.mark.parametrize("sparsity", [0.0, 0.25, 0.5, 0.75])
def test_topk_budget_keeps_exactly_k_groups_per_token(sparsity):
    model = wide_compile.apply(tiny_model("qwen2"), sparsity=sparsity, budget="topk", ffn_group_size=16)
    with torch.no_grad():
        model(IDS)
    masks = wide_compile.realized_masks(model)
    for block in wide_compile.state.get_state(model).blocks:
        kept = masks[block.key].sum(-1)
        assert torch.all(kept == round((1 - sparsity) * block.groups)), (block.key, kept.unique())


def test_track_skip_rates_accumulates_over_forwards():
    model = wide_compile.apply(tiny_model("llama"), ffn_group_size=32)
    with torch.no_grad(), wide_compile.track_skip_rates(model) as meter:
        model(IDS)
        first = dict(meter.total)
        model(IDS[:1])
    assert all(meter.total[k] > first[k] for k in first)
    assert all(0.0 <= r <= 1.0 for r in meter.rates().values())


def test_forced_skip_zeroes_every_block_and_bad_forced_masks_fail():
    model = wide_compile.apply(tiny_model("llama"), ffn_group_size=32)
    with torch.no_grad(), wide_compile.forced(model, "skip"):
        model(IDS)
    assert wide_compile.skip_rates(model)["mean"] == 1.0
    with pytest.raises(ValueError, match="expected"), wide_compile.forced(model, {(0, "attention"): torch.ones(3)}):
        model(IDS)
    with pytest.raises(ValueError, match="forced decisions"):
        wide_compile.set_forced(model, "sometimes")


def test_deepcopy_gives_an_independent_wide_model():
    model = wide_compile.apply(tiny_model("llama"), ffn_group_size=32)
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for r in wide_compile.routers(clone):
            r.b_out.copy_(torch.tensor([10.0, -10.0]).repeat(r.groups))  # clone: always skip
        clone(IDS)
        model(IDS)
    assert wide_compile.skip_rates(clone)["mean"] == 1.0
    assert wide_compile.skip_rates(model)["mean"] < 1.0


def test_apply_on_a_meta_llama3_8b_shape_adds_under_half_a_percent_of_parameters():
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256)
    with torch.device("meta"):  # no memory: discovery traces with fake tensors
        model = AutoModelForCausalLM.from_config(config)
    wide_compile.apply(model)
    rows = wide_compile.describe(model, print_table=False)
    assert {r["groups"] for r in rows if r["block"] == "attention"} == {8}
    assert {r["groups"] for r in rows if r["block"] == "mlp"} == {14336 // 128}
    assert wide_compile.router_parameter_fraction(model) < 0.005


@pytest.mark.parametrize("family", ["llama", "gpt2", "phi3"])
def test_padded_batches_with_attention_mask_and_generate(family):
    base = tiny_model(family)
    wide = wide_compile.apply(copy.deepcopy(base), ffn_group_size=32)
    ids = IDS.clone()
    attention_mask = torch.ones_like(ids)
    attention_mask[0, :3] = 0  # left padding on the first row
    ids[0, :3] = 0
    with torch.no_grad():
        ref = base(ids, attention_mask=attention_mask).logits
        with wide_compile.forced(wide, "execute"):
            out = wide(ids, attention_mask=attention_mask).logits
        torch.testing.assert_close(out[attention_mask.bool()], ref[attention_mask.bool()], rtol=1e-5, atol=1e-5)
        routed = wide.generate(ids, attention_mask=attention_mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert routed.shape == (2, ids.shape[1] + 4)
    masks = wide_compile.realized_masks(wide)
    assert all(masks[b.key].shape[-1] == b.groups for b in wide_compile.state.get_state(wide).blocks)


def test_seed_makes_router_initialisation_reproducible():
    a = wide_compile.apply(tiny_model("llama"), ffn_group_size=32, seed=3)
    b = wide_compile.apply(tiny_model("llama"), ffn_group_size=32, seed=3)
    c = wide_compile.apply(tiny_model("llama"), ffn_group_size=32, seed=4)
    pa, pb, pc = (torch.cat([p.flatten() for p in wide_compile.router_parameters(m)]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
