"""Bad input gives a clear error and leaves the model unchanged."""

import pytest
import torch
from torch import nn

import wide_compile
from wide_compile.passes.errors import DiscoveryError
from wide_compile.testing.tiny_models import tiny_model


def _snapshot(model):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {name: (dict(m._forward_pre_hooks), dict(m._forward_hooks)) for name, m in model.named_modules()})


def _assert_unchanged(model, snapshot):
    state, hooks = snapshot
    assert set(model.state_dict()) == set(state)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert {name: (dict(m._forward_pre_hooks), dict(m._forward_hooks)) for name, m in model.named_modules()} == hooks
    assert not wide_compile.is_applied(model)


@pytest.mark.parametrize("sparsity", [-0.1, 1.0, 1.5, float("nan"), "half", True])
def test_bad_sparsity(sparsity):
    model = tiny_model("llama")
    snap = _snapshot(model)
    with pytest.raises((ValueError, TypeError), match="sparsity"):
        wide_compile.apply(model, sparsity=sparsity)
    _assert_unchanged(model, snap)


def test_ffn_group_size_that_does_not_divide():
    model = tiny_model("llama")  # intermediate 128
    snap = _snapshot(model)
    with pytest.raises(ValueError, match="ffn_group_size=48 does not divide the intermediate size 128"):
        wide_compile.apply(model, ffn_group_size=48)
    _assert_unchanged(model, snap)


def test_attn_group_size_that_does_not_divide():
    model = tiny_model("llama")  # 4 query heads
    snap = _snapshot(model)
    with pytest.raises(ValueError, match="attn_group_size=3 does not divide the 4 query heads"):
        wide_compile.apply(model, attn_group_size=3, ffn_group_size=32)
    _assert_unchanged(model, snap)


def test_non_causal_lm_is_refused():
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64))
    with pytest.raises(wide_compile.WideError, match="causal LM"):
        wide_compile.apply(model)
    with pytest.raises(wide_compile.WideError, match="causal LM"):
        wide_compile.apply(nn.Linear(3, 3))


def test_apply_twice_is_refused():
    model = wide_compile.apply(tiny_model("llama"), ffn_group_size=32)
    before = len(model.state_dict())
    with pytest.raises(wide_compile.WideError, match="already applied"):
        wide_compile.apply(model, ffn_group_size=32)
    assert len(model.state_dict()) == before


def test_remove_restores_the_untouched_model():
    model = tiny_model("llama")
    snap = _snapshot(model)
    wide_compile.remove(wide_compile.apply(model, ffn_group_size=32))
    _assert_unchanged(model, snap)


class _OddMlp(nn.Module):
    """An MLP whose down projection reads a normalised product: still plain dataflow, but add an extra
    projection that feeds nothing recognisable."""

    def __init__(self, mlp):
        super().__init__()
        self.inner = mlp
        self.side = nn.Linear(mlp.down_proj.in_features, mlp.down_proj.out_features, bias=False)

    def forward(self, x):
        return self.inner(x) + self.side(torch.tanh(self.inner.up_proj(x)))


def test_unrecognised_block_names_the_layer():
    model = tiny_model("llama")
    model.model.layers[1].mlp = _OddMlp(model.model.layers[1].mlp)
    snap = _snapshot(model)
    with pytest.raises(DiscoveryError, match=r"layer model\.layers\.1"):
        wide_compile.apply(model, ffn_group_size=32)
    _assert_unchanged(model, snap)


def test_untouched_model_calls_fail_clearly():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="apply"):
        wide_compile.skip_rates(model)
    with pytest.raises(ValueError, match="temperature"):
        wide_compile.set_temperature(wide_compile.apply(model, ffn_group_size=32), 0.0)
