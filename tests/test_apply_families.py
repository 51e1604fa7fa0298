"""apply() on >= 12 transformers families (tiny random configs): exact equivalences and gradients."""

import copy

import pytest
import torch

import wide_compile
from wide_compile.testing.tiny_models import FAMILIES, tiny_model
from reference_masking import masked_reference

FFN_GROUP = 32


def _ids(batch=2, tokens=11, seed=1):
    return torch.randint(3, 128, (batch, tokens), generator=torch.Generator().manual_seed(seed))


def _random_masks(model, ids, seed=2):
    gen = torch.Generator().manual_seed(seed)
    masks = {}
    for block in wide_compile.state.get_state(model).blocks:
        masks[block.key] = (torch.rand(*ids.shape, block.groups, generator=gen) < 0.5).float()
    return masks


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_pair(request):
    base = tiny_model(request.param)
    wide = wide_compile.apply(copy.deepcopy(base), sparsity=0.5, ffn_group_size=FFN_GROUP)
    return request.param, base, wide


def test_at_least_twelve_families():
    assert len(FAMILIES) >= 12


def test_all_execute_matches_untouched_model(family_pair):
    _, base, wide = family_pair
    ids = _ids()
    with torch.no_grad():
        ref = base(ids).logits
        with wide_compile.forced(wide, "execute"):
            out = wide(ids).logits
    rel = (out - ref).abs().max() / ref.abs().max()
    assert rel <= 1e-5


def test_all_execute_generate_matches(family_pair):
    _, base, wide = family_pair
    ids = _ids(tokens=6, seed=3)
    ref = base.generate(ids, max_new_tokens=6, do_sample=False)
    with wide_compile.forced(wide, "execute"):
        out = wide.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(out, ref)


def test_forced_random_masks_match_independent_reference(family_pair):
    family, base, wide = family_pair
    ids = _ids(seed=4)
    masks = _random_masks(wide, ids)
    attn = next(b for b in wide_compile.state.get_state(wide).blocks if b.kind == "attention")
    with torch.no_grad():
        with wide_compile.forced(wide, masks):
            out = wide(ids).logits
        with masked_reference(base, family, masks, attn.group_width, FFN_GROUP):
            ref = base(ids).logits
        dense = base(ids).logits
    assert not torch.allclose(out, dense, atol=1e-4), "masks had no effect"
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_router_decisions_follow_logits_and_are_recorded(family_pair):
    _, _, wide = family_pair
    ids = _ids(seed=5)
    with torch.no_grad():
        wide(ids)
    state = wide_compile.state.get_state(wide)
    masks = wide_compile.realized_masks(wide)
    assert set(masks) == {block.key for block in state.blocks}
    for block in state.blocks:
        assert masks[block.key].shape[-1] == block.groups
        assert set(masks[block.key].unique().tolist()) <= {0.0, 1.0}
    rates = wide_compile.skip_rates(wide)
    assert 0.0 <= rates["mean"] <= 1.0 and set(rates) >= {"attention", "mlp", "blocks"}


def test_stage1_backward_reaches_only_routers(family_pair):
    _, _, wide = family_pair
    model = copy.deepcopy(wide)
    router_ids = {id(p) for p in wide_compile.router_parameters(model)}
    for p in model.parameters():
        p.requires_grad_(id(p) in router_ids)
    model.train()
    wide_compile.set_temperature(model, 5.0)
    ids = _ids(seed=6)
    out = model(ids, labels=ids)
    rates = wide_compile.skip_rate_tensors(model)
    loss = out.loss + 20 * (0.5 - rates["mean"]).abs()
    loss.backward()
    for name, p in model.named_parameters():
        if id(p) in router_ids:
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
        else:
            assert p.grad is None, name
    assert any(p.grad.abs().sum() > 0 for p in wide_compile.router_parameters(model))
