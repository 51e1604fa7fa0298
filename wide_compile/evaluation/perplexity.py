"""Token-level perplexity of a causal LM over non-overlapping windows (the pruning-paper convention).

The text is tokenized once (with the tokenizer's default special tokens) and cut into consecutive,
non-overlapping windows of ``window`` tokens; a trailing partial window is dropped by default, as in
GPTQ / SparseGPT / Wanda.  Each window is an independent forward pass; its loss covers every token but
the first (which has no context inside the window).  The result is the token-weighted mean negative
log-likelihood over all scored tokens and its exponential.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["PerplexityResult", "perplexity"]


@dataclass(frozen=True)
class PerplexityResult:
    """Perplexity and what it was computed from."""

    ppl: float  #: exp(nll)
    nll: float  #: mean negative log-likelihood per scored token, in nats
    tokens: int  #: number of scored (predicted) tokens
    windows: int  #: number of windows evaluated


def _token_ids(tokenizer: Any, text: str | torch.Tensor) -> torch.Tensor:
    if isinstance(text, torch.Tensor):
        if text.dim() != 1 or text.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"token ids must be a 1-D integer tensor, got shape {tuple(text.shape)} {text.dtype}")
        return text.long().cpu()
    if not isinstance(text, str):
        raise TypeError(f"text must be a str or a 1-D tensor of token ids, got {type(text).__name__}")
    if not text:
        raise ValueError("text is empty")
    if tokenizer is None:
        raise ValueError("a tokenizer is needed to tokenize text (pass token ids to skip tokenization)")
    # verbose=False: silence the "longer than model_max_length" warning; we window the ids ourselves.
    return tokenizer(text, return_tensors="pt", verbose=False)["input_ids"][0]


def _windows(n_tokens: int, window: int, max_windows: int | None, drop_last: bool) -> list[tuple[int, int]]:
    spans = [(s, s + window) for s in range(0, n_tokens - window + 1, window)]
    rest = n_tokens - len(spans) * window
    if not drop_last and rest >= 2:
        spans.append((n_tokens - rest, n_tokens))
    if max_windows is not None:
        spans = spans[:max_windows]
    if not spans:
        raise ValueError(
            f"the text has {n_tokens} tokens, fewer than one window of {window} tokens; "
            "use a smaller window or more text"
        )
    return spans


def _batches(spans: list[tuple[int, int]], batch_size: int) -> list[list[tuple[int, int]]]:
    """Group consecutive spans of equal length into batches of at most ``batch_size``."""
    batches: list[list[tuple[int, int]]] = []
    for span in spans:
        last = batches[-1] if batches else None
        if last and len(last) < batch_size and last[0][1] - last[0][0] == span[1] - span[0]:
            last.append(span)
        else:
            batches.append([span])
    return batches


def _safe_exp(x: float) -> float:
    return math.exp(x) if x < 709.0 else math.inf  # exp overflows a double above ~709.78


def _model_device(model: torch.nn.Module) -> torch.device:
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def perplexity(
    model: torch.nn.Module,
    tokenizer: Any,
    text: str | torch.Tensor,
    window: int = 1024,
    max_windows: int | None = None,
    batch_size: int = 1,
    device: str | torch.device | None = None,
    progress: bool = True,
    drop_last: bool = True,
) -> PerplexityResult:
    """Perplexity of ``model`` on ``text`` over non-overlapping windows of ``window`` tokens.

    Args:
        model: any HuggingFace causal LM (called as ``model(input_ids=..., use_cache=False).logits``).
        tokenizer: its tokenizer; may be None when ``text`` is already a 1-D tensor of token ids.
        text: the text, or its token ids.
        window: tokens per window (the model's context for this evaluation); at least 2.
        max_windows: evaluate only the first ``max_windows`` windows (None: all).
        batch_size: windows per forward pass.
        device: device for the inputs; defaults to the device of the model's parameters.  The model is not moved.
        progress: show a tqdm progress bar (on stderr).
        drop_last: drop the trailing partial window (standard); if False it is scored too.

    Returns:
        :class:`PerplexityResult` with the token-weighted mean NLL over all windows and its exponential.
    """
    if not isinstance(window, int) or window < 2:
        raise ValueError(f"window must be an int >= 2, got {window!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if max_windows is not None and (not isinstance(max_windows, int) or max_windows < 1):
        raise ValueError(f"max_windows must be None or an int >= 1, got {max_windows!r}")
    from tqdm.auto import tqdm

    ids = _token_ids(tokenizer, text)
    spans = _windows(ids.numel(), window, max_windows, drop_last)
    target_device = torch.device(device) if device is not None else _model_device(model)
    was_training = model.training
    model.eval()
    nll_sum, n_scored = 0.0, 0
    bar = tqdm(total=len(spans), desc="perplexity", unit="window", disable=not progress)
    try:
        with torch.inference_mode():
            for batch in _batches(spans, batch_size):
                input_ids = torch.stack([ids[s:e] for s, e in batch]).to(target_device)
                logits = model(input_ids=input_ids, use_cache=False).logits
                for row in range(input_ids.shape[0]):  # one row at a time keeps the fp32 copy small
                    nll_sum += F.cross_entropy(
                        logits[row, :-1].float(), input_ids[row, 1:], reduction="sum"
                    ).item()
                    n_scored += input_ids.shape[1] - 1
                bar.update(len(batch))
                bar.set_postfix(ppl=f"{_safe_exp(nll_sum / n_scored):.3f}")
    finally:
        bar.close()
        model.train(was_training)
    nll = nll_sum / n_scored
    return PerplexityResult(ppl=_safe_exp(nll), nll=nll, tokens=n_scored, windows=len(spans))
