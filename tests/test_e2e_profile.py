"""``benchmarks/e2e.py``'s device occupancy from a profile: the union of device intervals against the window."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from torch.autograd import DeviceType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from e2e import device_occupancy, kernel_gaps  # noqa: E402


def _event(start: float, end: float, device=DeviceType.CUDA, name: str = "k"):
    return SimpleNamespace(device_type=device, time_range=SimpleNamespace(start=start, end=end), name=name)


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


def test_gaps_are_attributed_to_the_kernel_pair_and_long_gaps_left_out():
    events = [_event(0, 100, name="a"), _event(105, 150, name="b"), _event(40, 90, name="c"), _event(160, 170, name="a"),
              _event(1000, 1010, name="b"), _event(1012, 1020, name="##annotation"), _event(1013, 1020, name="a"),
              _event(0, 2000, DeviceType.CPU, name="host")]
    result = kernel_gaps(_Profile(events), steps=2, max_gap_us=200)
    # gaps: a->b 5 us, b->a 10 us, b->a 3 us (1010 -> 1013); 170 -> 1000 is between calls; the annotation is ignored
    assert result["gaps_per_step"] == 1.5
    assert abs(result["in_call_gap_ms_per_step"] - 18 / 1e3 / 2) < 1e-12
    top = {(r["after"], r["before"]): (r["ms_per_step"], r["count"]) for r in result["gaps_top"]}
    assert top == {("b", "a"): (13 / 1e3 / 2, 2), ("a", "b"): (5 / 1e3 / 2, 1)}
    assert kernel_gaps(_Profile([_event(0, 5, DeviceType.CPU)]), steps=1) == {}
