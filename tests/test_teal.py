"""TEAL-style baseline: calibrated magnitude thresholds on every projection input (training-free)."""

from __future__ import annotations

import pytest
import torch

from wide_compile.baselines import apply_teal, remove_teal, teal_state
from wide_compile.baselines.teal import projection_paths
from wide_compile.models.magnitude_threshold import MagnitudeGate, QuantileSketch
from wide_compile.testing.tiny_models import tiny_model

VOCAB = 128


def _batches(n: int = 3, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (2, 16), generator=gen) for _ in range(n)]


def test_quantile_sketch_matches_exact_quantile_on_random_data():
    x = torch.randn(50_000)
    sketch = QuantileSketch(capacity=1 << 20)
    for chunk in x.split(5_000):
        sketch.add(chunk, per_call=1 << 20)  # keeps everything: exact
    for q in (0.25, 0.5, 0.7):
        assert sketch.quantile(q) == pytest.approx(float(x.abs().quantile(q)), rel=1e-3)
    small = QuantileSketch(capacity=4_096, seed=1)  # subsampled: close, not exact
    small.add(x, per_call=8_192)
    assert small.quantile(0.5) == pytest.approx(float(x.abs().median()), rel=0.05)
    with pytest.raises(ValueError, match="quantile must be in"):
        sketch.quantile(1.0)
    with pytest.raises(ValueError, match="no activations"):
        QuantileSketch().quantile(0.5)


def test_magnitude_gate_zeroes_exactly_the_small_entries():
    x = torch.randn(4, 7, 33)
    gate = MagnitudeGate(0.6)
    y = gate.gate(x)
    small = x.abs() < 0.6
    assert torch.equal(y[small], torch.zeros_like(y[small])) and torch.equal(y[~small], x[~small])
    assert gate.realized == pytest.approx(small.float().mean().item())
    with pytest.raises(ValueError, match="threshold must be >= 0"):
        MagnitudeGate(-1.0)


@pytest.mark.parametrize("family", ["llama", "gpt2", "phi3"])
def test_teal_reaches_the_target_sparsity_and_removes_cleanly(family):
    model = tiny_model(family).eval()
    ids = _batches(1, seed=7)[0]
    with torch.no_grad():
        dense = model(ids).logits
    paths = projection_paths(model)
    state = apply_teal(model, 0.5, _batches())
    assert set(state.gates) == set(paths) and len(paths) >= 2 * 4  # every attention and MLP projection
    with torch.no_grad():
        pruned = model(ids).logits
    assert 0.35 < state.realized_sparsity() < 0.65  # unseen data: near the calibrated 0.5
    assert not torch.allclose(pruned, dense)
    assert teal_state(model) is state
    remove_teal(model)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, dense)
    with pytest.raises(ValueError, match="no TEAL gates"):
        teal_state(model)


def test_teal_at_zero_sparsity_changes_nothing_and_bad_input_is_refused():
    model = tiny_model("llama").eval()
    ids = _batches(1, seed=3)[0]
    with torch.no_grad():
        dense = model(ids).logits
    apply_teal(model, 0.0, _batches(1))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, dense)
    with pytest.raises(ValueError, match="already installed"):
        apply_teal(model, 0.5, _batches(1))
    remove_teal(model)
    with pytest.raises(ValueError, match=r"sparsity must be in \[0, 1\)"):
        apply_teal(model, 1.0, _batches(1))
    with pytest.raises(ValueError, match="at least one calibration batch"):
        apply_teal(model, 0.5, [])
