"""Held-out metrics of a WIDE model with deterministic (argmax) routers: CE, perplexity, skip rates."""

from __future__ import annotations

import math

import torch
from torch import nn

from .loss import realized_skip_rates
from .sequences import SequenceSet


def validation_metrics(model: nn.Module, data: SequenceSet, batch_size: int, max_batches: int,
                       device: torch.device, autocast: bool = False) -> dict | None:
    """Token-weighted CE / perplexity and skip rates over the first ``max_batches`` batches (None if no data)."""
    if len(data) == 0 or max_batches <= 0:
        return None
    was_training = model.training
    model.eval()
    nll, scored, weight = 0.0, 0, 0.0
    rate_sums: dict[str, float] = {}
    try:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            for start in range(0, min(len(data), batch_size * max_batches), batch_size):
                idx = torch.arange(start, min(start + batch_size, len(data)))
                batch = {k: v.to(device) for k, v in data.batch(idx).items()}
                logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                               use_cache=False).logits.float()
                labels = batch["labels"][:, 1:]
                loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                   labels.reshape(-1), ignore_index=-100, reduction="sum")
                n = int((labels != -100).sum())
                nll, scored = nll + float(loss), scored + n
                mask = batch.get("attention_mask")
                tokens = float(mask.sum()) if mask is not None else float(batch["input_ids"].numel())
                for kind, rate in realized_skip_rates(model, mask).items():
                    rate_sums[kind] = rate_sums.get(kind, 0.0) + float(rate) * tokens
                weight += tokens
    finally:
        model.train(was_training)
    ce = nll / max(scored, 1)
    metrics = {"ce": ce, "ppl": math.exp(min(ce, 700.0)), "tokens": scored}
    metrics.update({f"skip_{kind}": total / weight for kind, total in rate_sums.items()})
    return metrics
