"""PEFT LoRA on top of a WIDE model: adapters see the masked input too; merge keeps it WIDE."""

import copy

import pytest
import torch

import wide_compile
from wide_compile.testing.tiny_models import tiny_model

peft = pytest.importorskip("peft")

IDS = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(0))
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _lora(model):
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, init_lora_weights=False)
    return peft.get_peft_model(model, config)


def _masks(model):
    gen = torch.Generator().manual_seed(3)
    return {b.key: (torch.rand(*IDS.shape, b.groups, generator=gen) < 0.5).float()
            for b in wide_compile.state.get_state(model).blocks}


def test_lora_adapters_receive_masked_inputs_like_a_merged_model():
    wide = wide_compile.apply(tiny_model("llama"), ffn_group_size=32)
    masks = _masks(wide)
    lora = _lora(copy.deepcopy(wide))
    with torch.no_grad(), wide_compile.forced(lora, masks):
        with_adapters = lora(input_ids=IDS).logits
        merged = lora.merge_and_unload()
        assert wide_compile.is_applied(merged)
        with wide_compile.forced(merged, masks):
            after_merge = merged(IDS).logits
    # merged weights W + BA applied to the masked input == base(masked) + lora(masked)
    torch.testing.assert_close(with_adapters, after_merge, rtol=1e-4, atol=1e-4)
    with torch.no_grad(), wide_compile.forced(wide, masks):
        assert not torch.allclose(wide(IDS).logits, after_merge, atol=1e-3), "LoRA had no effect"


def test_stage2_style_training_updates_lora_and_routers():
    wide = wide_compile.apply(tiny_model("llama"), ffn_group_size=32)
    lora = _lora(wide)
    for p in wide_compile.router_parameters(lora):
        p.requires_grad_(True)
    lora.train()
    out = lora(input_ids=IDS, labels=IDS)
    loss = out.loss + 20 * (0.5 - wide_compile.skip_rate_tensors(lora)["mean"]).abs()
    loss.backward()
    lora_grads = [p.grad for n, p in lora.named_parameters() if "lora_" in n]
    assert lora_grads and all(g is not None for g in lora_grads)
    assert all(p.grad is not None for p in wide_compile.router_parameters(lora))
    base_weights = [p for n, p in lora.named_parameters() if n.endswith("q_proj.base_layer.weight")]
    assert base_weights and all(p.grad is None for p in base_weights)
