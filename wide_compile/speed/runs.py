"""One timed workload on a compiled model: a prefill into an empty static cache, or decode steps from the middle of
a full one. Each run owns its cache and inputs (made before the first compiled call: static CUDA-graph addresses) and
exposes the call and the rewind that puts the cache back, so that callers can time it, read the WIDE masks of a
step, or profile it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext

import torch
from torch import nn

from .clock import Clock, summary
from .static_cache import cache_bytes, fill_cache_random, forward_kwargs, new_static_cache, set_cache_length


def random_ids(model: nn.Module, shape: tuple, seed: int) -> torch.Tensor:
    """Random token ids of ``shape`` on the model's device (the same for every variant with the same seed)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, shape, generator=generator)
    return ids.to(next(model.parameters()).device)


class PrefillRun:
    """One prompt of ``length`` random tokens into a static cache sized to it (``logits_to_keep=1``)."""

    def __init__(self, fn: Callable, model: nn.Module, length: int):
        if length < 1:
            raise ValueError(f"prefill length must be >= 1, got {length}")
        self.fn, self.length = fn, length
        self.slots = -(-(length + 16) // 64) * 64  # room for a few new tokens; a multiple of 64 keeps SDPA fused
        self.cache = new_static_cache(model, 1, self.slots)
        self.ids = random_ids(model, (1, length), seed=length)
        self.kwargs = forward_kwargs(model, self.cache)

    def call(self, _: int = 0):
        return self.fn(input_ids=self.ids, **self.kwargs)

    def rewind(self, _: int = 0) -> None:
        set_cache_length(self.cache, 0)


class DecodeRun:
    """Decode steps of ``batch`` random tokens from position ``slots // 2`` of a static cache full of random K/V."""

    def __init__(self, fn: Callable, model: nn.Module, batch: int, slots: int, steps: int):
        if batch < 1 or slots < 8:
            raise ValueError(f"decode needs batch >= 1 and >= 8 cache slots, got batch {batch}, {slots} slots")
        self.fn, self.batch, self.slots = fn, batch, slots
        self.start = slots // 2
        self.steps = max(1, min(steps, slots - self.start - 4))
        self.cache = new_static_cache(model, batch, slots)
        fill_cache_random(self.cache, seed=batch)
        self.tokens = [t.clone() for t in random_ids(model, (self.steps + 4, batch, 1), seed=1000 + batch)]
        self.kwargs = forward_kwargs(model, self.cache)

    def step(self, i: int = 0):
        return self.fn(input_ids=self.tokens[i % len(self.tokens)], **self.kwargs)

    def rewind(self, _: int = 0) -> None:
        set_cache_length(self.cache, self.start)


def time_prefill(run: PrefillRun, clock: Clock, runs: int, steady: Callable[[], ContextManager] = nullcontext,
                 idle_s: float = 0.1) -> dict:
    """Time to first token: median of ``runs`` prefills (after a first call, which compiles, and a second, which
    records CUDA graphs under ``reduce-overhead``). ``steady()`` is entered around the timed calls only (e.g.
    ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``, once this shape is compiled).

    ``ttft`` is each call between two device events, issued back to back (the host may run ahead of the device; a
    large model keeps the card at its power limit this way); ``ttft_cold`` is the wall-clock time of one call from an
    idle device to its last kernel (host work before the launch included, calls one after the other);
    ``ttft_idle`` is each call between two device events on a card rested for ``idle_s`` first
    (:meth:`Clock.each_after_idle`: the device time of a single request at the card's higher clock)."""
    run.rewind()
    first_s = clock.wall(run.call)
    run.rewind()
    second_s = clock.wall(run.call)
    run.rewind()
    run.call()
    with steady():
        times = clock.each(run.call, runs, before=run.rewind)
        cold = []
        for _ in range(runs):
            run.rewind()
            cold.append(clock.wall(run.call) * 1e3)
        idle = clock.each_after_idle(run.call, runs, before=run.rewind, idle_s=idle_s)
    return {"ttft": summary(times), "ttft_cold": summary(cold), "ttft_idle": summary(idle), "idle_s": idle_s,
            "first_call_s": first_s, "second_call_s": second_s,
            "prompt": run.length, "cache_slots": run.slots, "cache_gb": cache_bytes(run.cache) / 2**30}


def time_decode(run: DecodeRun, clock: Clock, steady: Callable[[], ContextManager] = nullcontext) -> dict:
    """ms per decode step: each of ``run.steps`` steps between two events (after a compiling and a recording call);
    ``steady()`` as in :func:`time_prefill`."""
    run.rewind()
    first_s = clock.wall(lambda: run.step(0))
    second_s = clock.wall(lambda: run.step(1))
    run.step(2)
    run.rewind()
    with steady():
        times = clock.each(run.step, run.steps)
    stats = summary(times)
    return {"ms_per_step": stats, "tokens_per_s": run.batch * 1e3 / stats["median_ms"], "first_call_s": first_s,
            "second_call_s": second_s, "batch": run.batch, "cache_slots": run.slots,
            "positions": [run.start, run.start + run.steps], "cache_gb": cache_bytes(run.cache) / 2**30}
