"""benchmarks/kernels_linear_ops.py: the ``trained`` mask kind (recorded router decisions laid out at a wider
model's group count), on a synthetic recording (no model, no GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from kernels_linear_ops import load_trained_masks, make_mask, mask_family, trained_mask  # noqa: E402

LAYERS, TOKENS, FFN_GROUPS, HEAD_GROUPS = 5, 40, 12, 3


@pytest.fixture
def recording(tmp_path):
    rng = np.random.default_rng(0)
    masks = {"mlp": rng.random((LAYERS, TOKENS, FFN_GROUPS)) < 0.5,
             "attention": rng.random((LAYERS, TOKENS, HEAD_GROUPS)) < 0.5}
    path = tmp_path / "rec.npz"
    np.savez_compressed(path, meta=np.array(json.dumps({"model": "synthetic"})),
                        **{k: np.packbits(v, axis=-1) for k, v in masks.items()},
                        **{f"{k}_groups": np.array(v.shape[-1]) for k, v in masks.items()})
    return str(path), masks


def test_recording_round_trips_through_packed_bits(recording):
    path, masks = recording
    loaded, meta = load_trained_masks(path)
    assert meta["model"] == "synthetic"
    for fam in masks:
        np.testing.assert_array_equal(loaded[fam], masks[fam])


@pytest.mark.parametrize("m", [1, 5, 40, 60])
def test_trained_mask_lays_consecutive_layers_side_by_side(recording, m):
    """Each column block is one recorded layer's decisions for the same tokens; layers follow each other (wrapping)
    and the last block is cut to the requested group count."""
    path, masks = recording
    rec = masks["mlp"]
    g = 30  # three layers of 12, the third cut to 6
    out = trained_mask(m, g, torch.Generator().manual_seed(3), "mlp", path=path, device="cpu").numpy()
    assert out.shape == (m, g) and out.dtype == bool
    # find the tokens and first layer: the first block must equal rec[first][tokens] for one layer
    matches = [layer for layer in range(LAYERS)
               if all(any((rec[layer][t] == row[:12]).all() for t in range(TOKENS)) for row in out)]
    assert matches, "the first 12 columns are not one recorded layer's decisions"
    first = matches[0]
    tokens = [next(t for t in range(TOKENS) if (rec[first][t] == row[:12]).all()
                   and (rec[(first + 1) % LAYERS][t] == row[12:24]).all()) for row in out]
    for row, t in zip(out, tokens):
        np.testing.assert_array_equal(row[12:24], rec[(first + 1) % LAYERS][t])
        np.testing.assert_array_equal(row[24:], rec[(first + 2) % LAYERS][t][:6])


def test_trained_mask_draws_differ_and_follow_the_generator(recording):
    path, _ = recording
    a = trained_mask(8, 24, torch.Generator().manual_seed(1), "mlp", path=path, device="cpu")
    b = trained_mask(8, 24, torch.Generator().manual_seed(1), "mlp", path=path, device="cpu")
    gen = torch.Generator().manual_seed(1)
    c, d = (trained_mask(8, 24, gen, "mlp", path=path, device="cpu") for _ in range(2))
    assert torch.equal(a, b) and torch.equal(a, c)
    assert not torch.equal(c, d)


def test_trained_mask_head_groups_and_errors(recording):
    path, masks = recording
    out = trained_mask(4, 8, torch.Generator().manual_seed(0), "attention", path=path, device="cpu")
    assert out.shape == (4, 8)
    with pytest.raises(ValueError, match="need 9 layers"):
        trained_mask(4, 25, torch.Generator().manual_seed(0), "attention", path=path, device="cpu")
    with pytest.raises(FileNotFoundError, match="trained_masks.py"):
        trained_mask(4, 8, torch.Generator(), "attention", path=path + ".missing", device="cpu")


def test_make_mask_kinds_and_families():
    gen = torch.Generator().manual_seed(0)
    rand = make_mask("rand50", 64, 112, gen, device="cpu")
    assert rand.shape == (64, 112) and 0.35 < rand.float().mean() < 0.65
    pattern = make_mask("pattern50", 64, 112, gen, device="cpu")
    assert len({tuple(r.tolist()) for r in pattern}) <= 8
    assert mask_family("q_proj") == "attention" and mask_family("o_proj_pm") == "attention"
    assert mask_family("gate_up") == "mlp" and mask_family("down") == "mlp"
