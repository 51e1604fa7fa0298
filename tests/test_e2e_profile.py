"""``benchmarks/e2e.py``'s device occupancy from a profile: the union of device intervals against the window."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from torch.autograd import DeviceType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from e2e import device_occupancy  # noqa: E402


def _event(start: float, end: float, device=DeviceType.CUDA):
    return SimpleNamespace(device_type=device, time_range=SimpleNamespace(start=start, end=end))


class _Profile:
    def __init__(self, events):
        self._events = events

    def events(self):
        return self._events


def test_overlapping_and_separate_intervals_per_step():
    events = [_event(0, 100), _event(50, 150), _event(300, 400), _event(10, 20, DeviceType.CPU), _event(500, 500)]
    result = device_occupancy(_Profile(events), steps=2)
    assert result == {"device_busy_ms_per_step": (150 + 100) / 1e3 / 2, "device_window_ms_per_step": 400 / 1e3 / 2}


def test_no_device_events_gives_nothing():
    assert device_occupancy(_Profile([_event(0, 5, DeviceType.CPU)]), steps=1) == {}
