"""perplexity(): compared with a hand-written loop over windows on tiny random models."""

from __future__ import annotations

import math

import pytest
import torch

from _tiny_lm import SAMPLE_TEXT, VOCAB_SIZE, byte_tokenizer, tiny_gpt2, tiny_llama
from wide_compile.evaluation import PerplexityResult, perplexity


def reference_nll(model: torch.nn.Module, ids: torch.Tensor, window: int, include_partial: bool = False):
    """Hand-written: per window, -log p(token t | tokens < t) for t = 1..len-1, float64, summed."""
    total, count, n_windows = 0.0, 0, 0
    starts = range(0, ids.numel(), window)
    for start in starts:
        chunk = ids[start : start + window]
        if chunk.numel() < window and not (include_partial and chunk.numel() >= 2):
            break
        with torch.no_grad():
            logits = model(chunk[None]).logits[0].double()
        logprobs = torch.log_softmax(logits, dim=-1)
        for t in range(1, chunk.numel()):
            total -= logprobs[t - 1, chunk[t]].item()
            count += 1
        n_windows += 1
    return total / count, count, n_windows


@pytest.fixture(scope="module")
def llama() -> torch.nn.Module:
    return tiny_llama(seed=1)


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    torch.manual_seed(123)
    return torch.randint(0, VOCAB_SIZE, (3 * 16 + 5,))  # 3 full windows of 16 + a ragged tail of 5


def test_matches_hand_written_reference(llama, ids):
    result = perplexity(llama, None, ids, window=16, progress=False)
    nll, count, n_windows = reference_nll(llama, ids, 16)
    assert isinstance(result, PerplexityResult)
    assert (result.tokens, result.windows) == (count, n_windows) == (3 * 15, 3)
    assert result.nll == pytest.approx(nll, rel=1e-5)
    assert result.ppl == pytest.approx(math.exp(nll), rel=1e-5)
    # A random model is near-uniform over the vocabulary: a sanity bound that catches gross errors.
    assert 0.5 * VOCAB_SIZE < result.ppl < 2 * VOCAB_SIZE


def test_partial_last_window_when_not_dropped(llama, ids):
    result = perplexity(llama, None, ids, window=16, drop_last=False, progress=False)
    nll, count, n_windows = reference_nll(llama, ids, 16, include_partial=True)
    assert (result.tokens, result.windows) == (count, n_windows) == (3 * 15 + 4, 4)
    assert result.nll == pytest.approx(nll, rel=1e-5)


@pytest.mark.parametrize("batch_size", [2, 3, 8])
def test_batching_does_not_change_result(llama, ids, batch_size):
    one = perplexity(llama, None, ids, window=16, drop_last=False, progress=False)
    batched = perplexity(llama, None, ids, window=16, drop_last=False, batch_size=batch_size, progress=False)
    assert (batched.tokens, batched.windows) == (one.tokens, one.windows)
    assert batched.nll == pytest.approx(one.nll, rel=1e-5)


def test_max_windows_uses_only_the_first_windows(llama, ids):
    result = perplexity(llama, None, ids, window=16, max_windows=2, progress=False)
    nll, count, _ = reference_nll(llama, ids[:32], 16)
    assert (result.tokens, result.windows) == (30, 2)
    assert result.nll == pytest.approx(nll, rel=1e-5)


def test_text_is_tokenized_once_like_the_tokenizer(llama):
    tokenizer = byte_tokenizer()
    text = SAMPLE_TEXT * 2
    from_text = perplexity(llama, tokenizer, text, window=32, progress=True)
    token_ids = torch.tensor(tokenizer(text)["input_ids"])
    nll, count, n_windows = reference_nll(llama, token_ids, 32)
    assert (from_text.tokens, from_text.windows) == (count, n_windows)
    assert from_text.nll == pytest.approx(nll, rel=1e-5)


def test_other_architecture_matches_hf_label_loss():
    """GPT-2: with equal windows, the mean NLL equals the mean of HF's own per-window label loss."""
    model = tiny_gpt2(seed=2)
    torch.manual_seed(7)
    token_ids = torch.randint(0, VOCAB_SIZE, (4 * 12,))
    windows = token_ids.view(4, 12)
    with torch.no_grad():
        hf_loss = torch.stack([model(w[None], labels=w[None]).loss for w in windows]).mean().item()
    result = perplexity(model, None, token_ids, window=12, batch_size=3, device="cpu", progress=False)
    assert result.nll == pytest.approx(hf_loss, rel=1e-5)


def test_restores_training_mode_and_runs_in_eval(llama, ids):
    model = tiny_llama(seed=1, attention_dropout=0.5)  # same weights as `llama`, dropout active in train()
    model.train()
    with torch.no_grad():  # guard: dropout really is active in training mode, so the test can fail
        assert not torch.equal(model(ids[None, :16]).logits, model(ids[None, :16]).logits)
    first = perplexity(model, None, ids, window=16, progress=False)
    second = perplexity(model, None, ids, window=16, progress=False)
    assert model.training
    assert first.nll == second.nll == pytest.approx(perplexity(llama, None, ids, window=16, progress=False).nll)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 1}, "window must be an int >= 2"),
        ({"window": 16, "batch_size": 0}, "batch_size must be an int >= 1"),
        ({"window": 16, "max_windows": 0}, "max_windows must be None or an int >= 1"),
        ({"window": 100}, "fewer than one window of 100 tokens"),
    ],
)
def test_bad_arguments_raise_clear_errors(llama, ids, kwargs, message):
    with pytest.raises(ValueError, match=message):
        perplexity(llama, None, ids, progress=False, **kwargs)


def test_bad_text_raises_clear_errors(llama):
    with pytest.raises(ValueError, match="text is empty"):
        perplexity(llama, byte_tokenizer(), "", window=4, progress=False)
    with pytest.raises(ValueError, match="1-D integer tensor"):
        perplexity(llama, None, torch.zeros(2, 8, dtype=torch.long), window=4, progress=False)
    with pytest.raises(ValueError, match="a tokenizer is needed"):
        perplexity(llama, None, "some text", window=4, progress=False)
