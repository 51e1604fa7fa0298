"""Timing in milliseconds: each call between two CUDA events on a GPU (one synchronisation after the series),
``time.perf_counter`` elsewhere."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


class Clock:
    """Times calls in ms: CUDA events on CUDA devices, perf_counter otherwise."""

    def __init__(self, device: torch.device | str):
        self.cuda = torch.device(device).type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def wall(self, fn: Callable[[], object]) -> float:
        """Seconds of one call including everything it waits for (compilation, the device)."""
        self.sync()
        start = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - start

    def each(self, fn: Callable[[int], object], n: int, before: Callable[[int], object] | None = None) -> list[float]:
        """Milliseconds of ``fn(i)`` for i in range(n); ``before(i)`` runs outside the timed span."""
        if not self.cuda:
            times = []
            for i in range(n):
                if before is not None:
                    before(i)
                start = time.perf_counter()
                fn(i)
                times.append((time.perf_counter() - start) * 1e3)
            return times
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        self.sync()
        for i, (start, end) in enumerate(events):
            if before is not None:
                before(i)
            start.record()
            fn(i)
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]


def summary(times_ms: list[float]) -> dict:
    """Median, 10th / 90th percentile, minimum and count of a list of times in ms."""
    ordered = sorted(times_ms)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"median_ms": statistics.median(ordered), "p10_ms": pick(0.1), "p90_ms": pick(0.9),
            "min_ms": ordered[0], "n": len(ordered)}
