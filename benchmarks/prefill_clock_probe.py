"""Does the order of the timed prefills move the dense / WIDE ratio? Series vs interleaved calls, with the GPU's clock.

``e2e.py`` times each variant in its own stage: eight dense prefills back to back, later eight WIDE ones. In every run
since R the WIDE prefill's warm time to first token exceeds its profiled device window by 1-2 ms and the dense one's
does not (``benchmarks/notes_e2e.md``), and ``host_sync_probe.py`` showed each series slowing call after call (4 layers:
dense 14.4 -> 15.2 ms, WIDE 9.1 -> 9.5 ms). This compiles both variants in one process and times, per phase:

- ``series``: ``--runs`` dense prefills back to back, then as many WIDE ones (``e2e.py``'s order);
- ``interleaved``: dense, WIDE, dense, WIDE, ... back to back, so both see the same clock and temperature;
- ``idle_before_each``: each call after ``--idle-ms`` of host sleep with the GPU idle (a short device sleep ahead of
  the start event hides the call's host work).

Each call lies between two CUDA events. ``nvidia-smi`` samples the SM clock, power and temperature every 20 ms in the
background; each phase reports the samples taken during it. GPU only.

Usage: ``python benchmarks/prefill_clock_probe.py [--tokens 4096] [--runs 12] [--layers N] [--out FILE]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_models import build_models  # noqa: E402
from e2e_timing import configure_dynamo, versions  # noqa: E402

from wide_compile.speed import PrefillRun, compile_variant  # noqa: E402
from wide_compile.speed.clock import HIDE_HOST_CYCLES  # noqa: E402

SMI_FIELDS = ("clocks.sm", "power.draw", "temperature.gpu", "clocks_event_reasons.active")


class ClockSampler:
    """``nvidia-smi`` in the background: (host time, SM MHz, W, deg C, event reasons) every ``period_ms``."""

    def __init__(self, period_ms: int = 20):
        self.samples: list[tuple[float, float, float, float, str]] = []
        self.error = None
        try:
            fields = SMI_FIELDS
            if subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv"],
                              capture_output=True).returncode != 0:
                fields = SMI_FIELDS[:3]  # drivers without the event-reasons field
            self.proc = subprocess.Popen(
                ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                 f"--loop-ms={period_ms}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as exc:
            self.proc, self.error = None, str(exc)
            return
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                self.samples.append((time.perf_counter(), float(parts[0]), float(parts[1]), float(parts[2]),
                                     parts[3] if len(parts) > 3 else ""))
            except (ValueError, IndexError):
                self.error = line.strip()[:200]

    def between(self, t0: float, t1: float) -> dict:
        rows = [s for s in self.samples if t0 <= s[0] <= t1]
        if not rows:
            return {"samples": 0, "error": self.error}
        return {"samples": len(rows), "sm_mhz_median": statistics.median(r[1] for r in rows),
                "sm_mhz_min": min(r[1] for r in rows), "power_w_median": statistics.median(r[2] for r in rows),
                "power_w_max": max(r[2] for r in rows), "temp_c_max": max(r[3] for r in rows),
                "event_reasons": sorted({r[4] for r in rows})}

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()


def _events(n: int) -> list:
    return [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]


def _call(run: PrefillRun) -> None:
    run.rewind()
    torch.compiler.cudagraph_mark_step_begin()  # two compiled models share the CUDA-graph tree manager
    run.call()


def timed(order: list[str], runs: dict, idle_ms: float = 0.0) -> dict[str, list[float]]:
    """Each call of ``order`` (variant names) between two events; back to back unless ``idle_ms``."""
    events = _events(len(order))
    torch.cuda.synchronize()
    for name, (start, end) in zip(order, events):
        if idle_ms:
            torch.cuda.synchronize()
            time.sleep(idle_ms / 1e3)
            torch.cuda._sleep(HIDE_HOST_CYCLES)
        start.record()
        _call(runs[name])
        end.record()
    torch.cuda.synchronize()
    out: dict[str, list[float]] = {name: [] for name in runs}
    for name, (start, end) in zip(order, events):
        out[name].append(round(start.elapsed_time(end), 3))
    return out


def phase(label: str, order: list[str], runs: dict, sampler: ClockSampler, idle_ms: float = 0.0) -> dict:
    t0 = time.perf_counter()
    times = timed(order, runs, idle_ms)
    t1 = time.perf_counter()
    res = {"order": "".join(n[0] for n in order), "calls_ms": times,
           "median_ms": {n: statistics.median(v) for n, v in times.items() if v}, "clock": sampler.between(t0, t1)}
    med = res["median_ms"]
    if "dense" in med and "wide" in med:
        res["dense_over_wide"] = med["dense"] / med["wide"]
    print(f"{label:18s} " + "  ".join(f"{n} {m:8.3f} ms" for n, m in med.items())
          + (f"  ratio {res['dense_over_wide']:.3f}x" if "dense_over_wide" in res else "")
          + f"  SM {res['clock'].get('sm_mhz_median', '?')} MHz (min {res['clock'].get('sm_mhz_min', '?')}),"
          f" {res['clock'].get('power_w_median', '?')} W", flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama3-8b-shape")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--runs", type=int, default=12)
    p.add_argument("--idle-ms", type=float, default=100.0)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("prefill_clock_probe needs a CUDA GPU")
    configure_dynamo()
    models = build_models(args.model, torch.device("cuda"), torch.bfloat16, layers=args.layers)
    record = {"command": " ".join(["python"] + sys.argv), "versions": versions(), "tokens": args.tokens,
              "runs": args.runs, "phases": {}}
    runs = {}
    with torch.no_grad():
        for variant, model in (("dense", models.dense), ("wide", models.wide)):
            fn = compile_variant(model, variant, "reduce-overhead", "inductor", False)
            runs[variant] = PrefillRun(fn, model, args.tokens)
            t = time.perf_counter()
            for _ in range(3):  # compile, record the CUDA graph, one replay
                _call(runs[variant])
            torch.cuda.synchronize()
            print(f"{variant}: compiled and recorded in {time.perf_counter() - t:.1f} s", flush=True)
        for _ in range(2):  # any re-recording from switching between the two graphs happens here
            _call(runs["dense"])
            _call(runs["wide"])
        sampler = ClockSampler()
        time.sleep(0.5)
        n = args.runs
        plan = [("series", ["dense"] * n + ["wide"] * n, 0.0),
                ("interleaved", ["dense", "wide"] * n, 0.0),
                ("series_wide_first", ["wide"] * n + ["dense"] * n, 0.0),
                ("interleaved_again", ["wide", "dense"] * n, 0.0),
                ("idle_before_each", ["dense", "wide"] * max(4, n // 2), args.idle_ms)]
        for label, order, idle in plan:
            time.sleep(0.5)
            record["phases"][label] = phase(label, order, runs, sampler, idle)
        sampler.stop()
        record["clock_error"] = sampler.error
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
