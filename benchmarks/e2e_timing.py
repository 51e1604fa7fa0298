"""Timing, time budget, stage time limits, memory and compile helpers for the end-to-end benchmark (``e2e.py``).

- (the clock and the timed runs are ``wide_compile.speed``'s)
- :class:`Budget` + :func:`time_limit`: the run's wall-clock budget and a SIGALRM limit per stage, so that one slow
  compile is cut off and recorded instead of eating the whole run.
- :func:`fresh_compile_state`: forget every compiled graph and CUDA-graph pool between stages (fair peak memory).
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import torch

T0 = time.perf_counter()


def log(message: str) -> None:
    print(f"[e2e {time.perf_counter() - T0:7.1f}s] {message}", flush=True)


class StageTimeout(BaseException):
    """A stage ran past its time limit (a BaseException, so that ``except Exception`` inside Dynamo / Inductor does
    not swallow it and carry on compiling)."""


@contextlib.contextmanager
def time_limit(seconds: float | None, what: str) -> Iterator[None]:
    """Raise :class:`StageTimeout` in the main thread after ``seconds`` (no limit when None, <= 0 or not the main
    thread). Python code (Dynamo / Inductor) is interrupted between bytecodes; a running kernel finishes first."""
    if not seconds or seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise StageTimeout(f"{what}: time limit of {seconds:.0f} s reached")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Budget:
    """Wall-clock budget of the whole run (``None``: unlimited)."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds

    def left(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - (time.perf_counter() - T0)


# ----------------------------------------------------------------------------------------------- memory
def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def memory_gb(device: torch.device) -> dict:
    if device.type != "cuda":
        return {}
    return {"peak_allocated_gb": torch.cuda.max_memory_allocated(device) / 2**30,
            "allocated_gb": torch.cuda.memory_allocated(device) / 2**30}


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


# ----------------------------------------------------------------------------------------------- compilation
def configure_dynamo() -> None:
    """Room for the dense and WIDE frames plus their shape variants (the limit is per code object)."""
    import torch._dynamo.config as dynamo_config

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, 64)


def fresh_compile_state(device: torch.device) -> None:
    """Drop compiled code, CUDA-graph trees and cached blocks (callers drop their outputs first)."""
    torch._dynamo.reset()
    if device.type == "cuda":
        with contextlib.suppress(Exception):
            from torch._inductor.cudagraph_trees import reset_cudagraph_trees

            reset_cudagraph_trees()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def dynamo_counts() -> dict:
    """Process-wide Dynamo counters (graphs compiled, graph breaks, CUDA-graph skips) to diff around a stage."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "cudagraph_skips": int(counters["inductor"].get("cudagraph_skips", 0))}


def diff_counts(before: dict, after: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after}


def versions() -> dict:
    import platform

    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "cuda": torch.version.cuda,
           "WIDE_PDL": os.environ.get("WIDE_PDL", "0")}  # programmatic dependent launch (templates/dependent_launch.py)
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    out["argv"] = list(sys.argv)
    return out
