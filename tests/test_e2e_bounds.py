"""The roofline bounds the end-to-end benchmark prints next to its ratios (benchmarks/e2e_bounds.py)."""

import sys
from pathlib import Path

import pytest
import torch

import wide_compile
from _tiny_lm import tiny_llama
from wide_compile.state import get_state

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from e2e_bounds import decode_byte_bound, prefill_flop_bound  # noqa: E402

TOKENS = 256


@pytest.fixture(scope="module")
def model():
    m = tiny_llama()
    wide_compile.apply(m, sparsity=0.5, ffn_group_size=16)
    return m


def _masks(model, fill) -> dict:
    return {b.key: fill(b, torch.zeros(1, TOKENS, b.groups, dtype=torch.bool)) for b in get_state(model).blocks}


def _all(value: bool):
    def fill(_block, mask):
        mask[:] = value
        return mask
    return fill


def test_all_active_masks_give_no_speedup(model):
    bound = prefill_flop_bound(model, _masks(model, _all(True)))
    assert bound["exact_bound_speedup"] == pytest.approx(1.0)
    assert bound["tile_bound_speedup"] == pytest.approx(1.0)
    assert bound["flops_dense"] > 0


def test_alternating_token_masks_by_hand(model):
    """Even tokens execute every group, odd tokens none: exact halves every skippable matmul; every 128-token tile
    still needs every group, so o / down stay dense in the tile bound."""
    def alternate(_block, mask):
        mask[:, ::2] = True
        return mask

    bound = prefill_flop_bound(model, _masks(model, alternate))
    config = model.config
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    d = h // config.num_attention_heads
    q_w, kv_w = config.num_attention_heads * d, config.num_key_value_heads * d
    t = torch.arange(1, TOKENS + 1, dtype=torch.float64)
    core = 4 * d * config.num_attention_heads * t.sum().item()
    core_even = 4 * d * config.num_attention_heads * t[::2].sum().item()
    kv = 2 * TOKENS * 2 * h * kv_w
    per = dict(q=2 * h * q_w * TOKENS, mlp=2 * h * i * TOKENS)
    dense = layers * (2 * per["q"] + kv + core + 3 * per["mlp"])
    exact = layers * (per["q"] + kv + core_even + 1.5 * per["mlp"])
    tiled = layers * (1.5 * per["q"] + kv + core_even + 2 * per["mlp"])
    assert bound["flops_dense"] == pytest.approx(dense)
    assert bound["exact_bound_speedup"] == pytest.approx(dense / exact)
    assert bound["tile_bound_speedup"] == pytest.approx(dense / tiled)


def test_decode_byte_bound_counts_the_union_of_the_batch(model):
    """Batch of 2 tokens with disjoint halves of every block's groups: the union is everything, no bytes saved (the
    routers' own bytes are extra); the same half for both tokens saves half of q, o, gate, up and down."""
    def halves(block, mask):
        m = torch.zeros(2, 1, block.groups, dtype=torch.bool)
        m[0, 0, : block.groups // 2] = True
        m[1, 0, block.groups // 2:] = True
        return m

    disjoint = {b.key: halves(b, None) for b in get_state(model).blocks}
    same = {k: torch.stack([v[0], v[0]]) for k, v in disjoint.items()}
    union = decode_byte_bound(model, [disjoint], batch=2, kv_slots=64)
    assert union["weight_bytes_wide"] == pytest.approx(union["weight_bytes_dense"] + union["router_bytes"])
    assert union["union_active_mlp"] == union["union_active_attention"] == 1.0
    shared = decode_byte_bound(model, [same], batch=2, kv_slots=64)
    assert shared["union_active_mlp"] == shared["union_active_attention"] == 0.5
    config = model.config
    h, layers = config.hidden_size, config.num_hidden_layers
    skippable = layers * (2 * h * h + 3 * h * config.intermediate_size) * 4  # q, o, gate, up, down in fp32
    assert shared["weight_bytes_wide"] == pytest.approx(union["weight_bytes_wide"] - skippable / 2)
