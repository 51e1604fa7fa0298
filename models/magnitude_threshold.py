"""TEAL-style magnitude thresholds: per projection input, the |activation| below which entries are zeroed.

For a target sparsity ``s`` the threshold of one projection is the ``s``-quantile of ``|x|`` over calibration
activations (TEAL's uniform per-tensor allocation). A :class:`MagnitudeGate` applies it:
``x * (|x| >= threshold)``, so on data like the calibration set about ``s`` of the entries become 0 and
the weight columns they would read can be skipped (per token, per channel).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["MagnitudeGate", "QuantileSketch"]


class QuantileSketch:
    """A bounded uniform sample of ``|x|`` values, enough to estimate quantiles (kept on the CPU, fp32)."""

    def __init__(self, capacity: int = 1 << 20, seed: int = 0):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.generator = torch.Generator().manual_seed(seed)
        self.values: list[Tensor] = []
        self.kept = 0
        self.seen = 0

    def add(self, x: Tensor, per_call: int = 1 << 16) -> None:
        flat = x.detach().abs().float().reshape(-1).cpu()
        self.seen += flat.numel()
        if flat.numel() > per_call:
            idx = torch.randint(0, flat.numel(), (per_call,), generator=self.generator)
            flat = flat[idx]
        self.values.append(flat)
        self.kept += flat.numel()
        if self.kept > self.capacity:  # keep a random subset of what was kept
            merged = torch.cat(self.values)
            idx = torch.randperm(merged.numel(), generator=self.generator)[: self.capacity]
            self.values, self.kept = [merged[idx]], self.capacity

    def quantile(self, q: float) -> float:
        if not self.values:
            raise ValueError("no activations were recorded (did the calibration batches reach this projection?)")
        if not 0.0 <= q < 1.0:
            raise ValueError(f"quantile must be in [0, 1), got {q}")
        merged = torch.cat(self.values)
        if q == 0.0:
            return 0.0
        k = max(1, min(merged.numel(), int(round(q * merged.numel()))))
        return float(merged.kthvalue(k).values)


def _tracing() -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and (compiler.is_compiling() or getattr(compiler, "is_exporting", bool)()))


class MagnitudeGate:
    """Forward pre-hook: zero the entries of a projection's input whose magnitude is below ``threshold``.

    Counts the zeroed fraction it produced (``zeroed / total``) for realized-sparsity reports.
    """

    def __init__(self, threshold: float):
        if not threshold >= 0.0:
            raise ValueError(f"threshold must be >= 0, got {threshold}")
        self.threshold = float(threshold)
        self.zeroed = 0
        self.total = 0

    def gate(self, x: Tensor) -> Tensor:
        keep = x.abs() >= self.threshold
        if not _tracing():  # counting reads the data: only in eager runs
            self.zeroed += int(keep.numel() - keep.sum())
            self.total += keep.numel()
        return x * keep.to(x.dtype)

    def __call__(self, module, args, kwargs):
        if args:
            return (self.gate(args[0]), *args[1:]), kwargs
        name = "hidden_states" if "hidden_states" in kwargs else "input"
        return args, {**kwargs, name: self.gate(kwargs[name])}

    @property
    def realized(self) -> float:
        return self.zeroed / self.total if self.total else float("nan")
