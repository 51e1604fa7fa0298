"""Timing in milliseconds: each call between two CUDA events on a GPU (one synchronisation after the series),
``time.perf_counter`` elsewhere.

Back to back, a large model's calls keep an H200 at its power limit, where the SM clock drops well below its maximum
(4096-token prefill of the Llama-3-8B shape: about 1620 MHz at 690 W against 1920 MHz with the card idle before each
call, ``benchmarks/prefill_clock_probe.py``). :meth:`Clock.each` times that sustained regime;
:meth:`Clock.each_after_idle` times each call on a rested card (a single request arriving at an idle server).
"""

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

    def each_after_idle(self, fn: Callable[[int], object], n: int, before: Callable[[int], object] | None = None,
                        idle_s: float = 0.1) -> list[float]:
        """Milliseconds of ``fn(i)``, each call on a card left idle for ``idle_s`` first (GPU; elsewhere as
        :meth:`each`: a CPU has no power state worth resting). A short device sleep between the rest and the start
        event keeps the call's own host work (Dynamo, the graph launch) out of the span, as in :meth:`each`."""
        if not self.cuda:
            return self.each(fn, n, before)
        times = []
        for i in range(n):
            if before is not None:
                before(i)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            time.sleep(idle_s)
            torch.cuda._sleep(HIDE_HOST_CYCLES)
            start.record()
            fn(i)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return times


HIDE_HOST_CYCLES = 20_000_000  # about 10 ms of device sleep at the H200's clock: longer than a call's host work


def summary(times_ms: list[float]) -> dict:
    """Median, 10th / 90th percentile, minimum and count of a list of times in ms."""
    ordered = sorted(times_ms)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"median_ms": statistics.median(ordered), "p10_ms": pick(0.1), "p90_ms": pick(0.9),
            "min_ms": ordered[0], "n": len(ordered)}
