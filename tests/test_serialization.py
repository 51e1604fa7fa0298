"""save/load round trip of routers and config; mismatched checkpoints are refused."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import wide_compile
from wide_compile.testing.tiny_models import tiny_model

IDS = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(0))


def test_round_trip_restores_routers_and_decisions(tmp_path):
    model = wide_compile.apply(tiny_model("llama"), sparsity=0.3, ffn_group_size=32)
    with torch.no_grad():
        ref = model(IDS).logits
    ref_masks = {k: v.clone() for k, v in wide_compile.realized_masks(model).items()}
    wide_compile.save(model, tmp_path)
    loaded = wide_compile.load(tmp_path)
    assert wide_compile.config_of(loaded) == wide_compile.config_of(model)
    with torch.no_grad():
        out = loaded.eval()(IDS).logits
    torch.testing.assert_close(out, ref)
    for key, mask in wide_compile.realized_masks(loaded).items():
        assert torch.equal(mask, ref_masks[key])


def test_saved_folder_still_loads_as_plain_dense_model(tmp_path):
    base = tiny_model("qwen2")
    with torch.no_grad():
        dense = base(IDS).logits
    wide_compile.save(wide_compile.apply(base, ffn_group_size=32), tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert not wide_compile.is_applied(plain)
    with torch.no_grad():
        torch.testing.assert_close(plain(IDS).logits, dense)


def test_checkpoint_with_other_group_layout_is_refused(tmp_path):
    wide_compile.save(wide_compile.apply(tiny_model("llama"), ffn_group_size=32), tmp_path)
    other = wide_compile.apply(tiny_model("llama"), ffn_group_size=64)
    with pytest.raises(ValueError, match="another model or group layout"):
        wide_compile.load_routers(other, tmp_path)


def test_load_of_a_folder_without_wide_config_is_a_clear_error(tmp_path):
    tiny_model("llama").save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="wide_config.json"):
        wide_compile.load(tmp_path)


def test_routers_are_in_state_dict_and_follow_to():
    model = wide_compile.apply(tiny_model("llama"), ffn_group_size=32)
    keys = [k for k in model.state_dict() if "wide_routers" in k]
    assert len(keys) == 2 * 2 * 4  # layers x blocks x (w_in, b_in, w_out, b_out)
    model.to(torch.float64)
    assert all(r.w_in.dtype == torch.float64 for r in wide_compile.routers(model))
