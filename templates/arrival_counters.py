"""Arrival counters of the one-launch split-K kernels, kept at zero between launches instead of zeroed per call.

Split-K kernels (``gemv_decode``, ``router_mask``) count the programs of a tile that have stored their partial; the
last to arrive sums the partials and resets the tile's counter to 0. A counter buffer is therefore all zeros
between launches, and one buffer serves every such launch issued on a stream in order: no memset kernel per call
(three per layer in a batch-1 decode step, each a node of the CUDA graph).

Where the buffer comes from matters under ``torch.compile(mode="reduce-overhead")``: CUDA-graph trees route every
allocation of the thread that warms up or records a graph into the graph's private pool, and a cached tensor from
that pool outliving the graph is refused ("tensors in the cudagraph pool not tracked as outputs"). So the buffer is
allocated and zeroed on a short-lived helper thread, outside any pool, and kept for the life of the process (one
per device and stream; a larger one replaces it, the old one is kept alive because a captured graph may point at
it). During a capture that finds no large-enough buffer (an allocation there is not allowed) the counters are
zeroed per call as before: a memset node in the graph.

Contract for kernels that take these counters: every program of a tile that increments the tile's counter is one
of ``SPLIT`` that all increment it, and the last one resets it (or none of them touches it). Two launches that use
one buffer must not run concurrently: they are ordered on one stream (programmatic dependent launch waits with
``gdc_wait`` before any counter access, so it keeps that order).
"""
from __future__ import annotations

import threading

import torch

_MIN_COUNTERS = 4096
_buffers: dict[tuple, torch.Tensor] = {}
_retired: list[torch.Tensor] = []  # replaced by larger buffers; captured graphs may still use them
_lock = threading.Lock()


def _stream_key(device: torch.device) -> tuple:
    if device.type != "cuda":
        return (str(device), 0)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return (f"cuda:{index}", torch.cuda.current_stream(index).cuda_stream)


def _zeros_outside_graph_pools(size: int, device: torch.device) -> torch.Tensor:
    """``torch.zeros(size, int32)`` allocated and filled on a helper thread (not routed to a CUDA-graph pool)."""
    if device.type != "cuda":
        return torch.zeros(size, dtype=torch.int32, device=device)
    result: list = []

    def allocate() -> None:
        try:
            with torch.cuda.device(device):
                buf = torch.zeros(size, dtype=torch.int32, device=device)
                torch.cuda.current_stream(device).synchronize()  # zeroed before any stream can use it
            result.append(buf)
        except BaseException as exc:  # re-raised on the caller's thread
            result.append(exc)

    worker = threading.Thread(target=allocate, name="wide-arrival-counters")
    worker.start()
    worker.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def arrival_counters(count: int, device: torch.device) -> torch.Tensor:
    """At least ``count`` int32 counters, all zero, on ``device``, for one split-K launch on the current stream."""
    key = _stream_key(device)
    with _lock:
        buf = _buffers.get(key)
        if buf is not None and buf.numel() >= count:
            return buf
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return torch.zeros(count, dtype=torch.int32, device=device)  # no allocation outside the capture here
        size = max(_MIN_COUNTERS, 1 << (max(1, count) - 1).bit_length())
        new = _zeros_outside_graph_pools(size, device)
        if buf is not None:
            _retired.append(buf)
        _buffers[key] = new
        return new


__all__ = ["arrival_counters"]
