"""Per-step schedules: Gumbel temperature (linear) and learning-rate multiplier (warm-up + cosine)."""

from __future__ import annotations

import math


def temperature_at(step: int, total_steps: int, start: float = 5.0, end: float = 0.5) -> float:
    """Temperature of optimizer step ``step`` (0-based): ``start`` at the first step, ``end`` at the last."""
    if total_steps <= 1:
        return float(end)
    frac = min(max(step / (total_steps - 1), 0.0), 1.0)
    return float(start + (end - start) * frac)


def warmup_steps(total_steps: int, warmup_frac: float) -> int:
    return int(round(warmup_frac * total_steps))


def lr_multiplier(step: int, total_steps: int, warmup_frac: float = 0.1) -> float:
    """LR factor of optimizer step ``step`` (0-based): linear warm-up to 1, then cosine decay to 0.

    Warm-up lasts ``round(warmup_frac * total_steps)`` steps, its first step already has a non-zero rate
    (``1 / warmup``); the cosine reaches 0 after the last step.
    """
    warmup = warmup_steps(total_steps, warmup_frac)
    if step < warmup:
        return (step + 1) / warmup
    decay = max(1, total_steps - warmup)
    progress = min((step - warmup) / decay, 1.0)
    return 0.5 * (1.0 + math.cos(math.pi * progress))
