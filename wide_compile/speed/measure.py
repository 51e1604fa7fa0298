"""``measure_speed``: compiled dense vs compiled WIDE, decode ms/step and time to first token, on static KV caches.

Both variants share one copy of the weights (:func:`~wide_compile.speed.twin.dense_and_wide`). Each (shape, variant)
is compiled afresh with static shapes: dense with ``inner`` (Inductor by default on CUDA), WIDE with
``backend="wide"``, both with the same ``mode`` (``"reduce-overhead"``: CUDA graphs; only on CUDA). Decode steps run
from the middle of a static cache of ``kv_slots`` random K/V with random tokens; a prefill writes a random prompt
into an empty cache sized to it. Times are medians (CUDA events on a GPU). On a CPU the numbers say little about a GPU
(the kernels run as PyTorch reference code there); the point there is that the flow works.

Every (shape, variant) starts from ``torch._dynamo.reset()``: graphs compiled earlier in the process are forgotten.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .clock import Clock
from .runs import DecodeRun, PrefillRun, time_decode, time_prefill
from .twin import dense_and_wide
from .variants import INNER_COMPILERS, compile_variant

VARIANTS = ("dense", "wide")


@dataclass
class SpeedReport:
    """What :func:`measure_speed` measured: one row per (kind, size) with both variants' results."""

    rows: list[dict] = field(default_factory=list)
    settings: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"settings": self.settings, "rows": self.rows}

    def __str__(self) -> str:
        header = ("measurement", "dense ms", "WIDE ms", "dense/WIDE", "WIDE skip", "first call s dense / WIDE")
        lines = [header]
        for row in self.rows:
            label = f"decode b={row['size']} per step" if row["kind"] == "decode" else f"TTFT {row['size']} tokens"
            dense, wide = row["dense_ms"], row["wide_ms"]
            lines.append((label, f"{dense:.3f}", f"{wide:.3f}", f"{dense / wide:.2f}x", f"{row['wide_skip']:.3f}",
                          f"{row['dense']['first_call_s']:.1f} / {row['wide']['first_call_s']:.1f}"))
            if row["kind"] == "prefill" and "ttft_idle" in row["dense"]:  # each call on a rested card
                rested = row["dense"]["ttft_idle"]["median_ms"], row["wide"]["ttft_idle"]["median_ms"]
                lines.append(("  card idle before each call", f"{rested[0]:.3f}", f"{rested[1]:.3f}",
                              f"{rested[0] / rested[1]:.2f}x", "", ""))
        widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
        return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)) for line in lines)


def _check_sizes(name: str, values) -> tuple[int, ...]:
    values = tuple(int(v) for v in values)
    if any(v < 1 for v in values):
        raise ValueError(f"{name} must be positive integers, got {values}")
    return values


def measure_speed(
    model: nn.Module,
    *,
    routers: str | Path | None = None,
    sparsity: float = 0.5,
    decode_batches=(1,),
    prompt_lengths=(512,),
    mode: str | None = "reduce-overhead",
    inner: str | None = None,
    decode_steps: int = 50,
    prefill_runs: int = 5,
    kv_slots: int = 1024,
    wide_options: dict | None = None,
    seed: int = 0,
    progress: bool = True,
    **apply_kwargs,
) -> SpeedReport:
    """Time ``model`` dense and as a WIDE model, both compiled (see the module docstring).

    Args:
        model: a HF causal LM (dense: it gets a WIDE twin sharing its weights; already ``apply``-ed: the dense
            twin is made by removing WIDE).
        routers: trained routers (a ``wide_compile.save`` folder or routers file) for the WIDE twin; default fresh
            routers at ``sparsity`` (about half the pairs skipped, depending on the token).
        decode_batches / prompt_lengths: decode batch sizes and prefill lengths to time.
        mode: ``torch.compile`` mode for both variants (used on CUDA with Inductor only: CUDA graphs need both).
        inner: what compiles the graphs: ``"inductor"`` (default on CUDA), ``"aot_eager"`` (default elsewhere:
            seconds instead of minutes per compile) or ``"eager"``.
        wide_options: extra ``wide`` backend options (e.g. ``{"wide.one_token_routers": "reduction"}``).
        apply_kwargs: passed to ``wide_compile.apply`` for fresh routers (e.g. ``ffn_group_size``).
    """
    decode_batches = _check_sizes("decode_batches", decode_batches)
    prompt_lengths = _check_sizes("prompt_lengths", prompt_lengths)
    if decode_steps < 1 or prefill_runs < 1:
        raise ValueError(f"decode_steps and prefill_runs must be >= 1, got {decode_steps} and {prefill_runs}")
    import wide_compile

    device = next(model.parameters()).device
    mode = mode if device.type == "cuda" else None
    inner = inner or ("inductor" if device.type == "cuda" else "aot_eager")
    if inner not in INNER_COMPILERS:
        raise ValueError(f"inner must be 'inductor', 'aot_eager' or 'eager', got {inner!r}")
    mode = mode if inner == "inductor" else None  # CUDA graphs come with Inductor
    dense, wide, described = dense_and_wide(model, routers=routers, sparsity=sparsity, seed=seed, **apply_kwargs)
    clock = Clock(device)
    report = SpeedReport(settings={
        "device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "dtype": str(next(model.parameters()).dtype), "mode": mode, "inner": inner, "routers": described,
        "decode_steps": decode_steps, "prefill_runs": prefill_runs, "kv_slots": kv_slots,
        "wide_options": dict(wide_options or {}), "torch": torch.__version__,
    })
    shapes = [("decode", b) for b in decode_batches] + [("prefill", n) for n in prompt_lengths]
    start = time.perf_counter()
    for kind, size in shapes:
        row = {"kind": kind, "size": size}
        for variant, net in zip(VARIANTS, (dense, wide)):
            torch._dynamo.reset()
            wide_compile.backend.reset_compile_report()
            with torch.no_grad():
                fn = compile_variant(net, variant, mode, inner, False, wide_options)
                if kind == "decode":
                    run = DecodeRun(fn, net, size, kv_slots, decode_steps)
                    result = time_decode(run, clock)
                else:
                    run = PrefillRun(fn, net, size)
                    result = time_prefill(run, clock, prefill_runs)
                if variant == "wide":  # the masks of one more call from the same position
                    run.rewind()
                    if kind == "decode":
                        run.step(0)
                    else:
                        run.call()
                    result["skip_rates"] = {k: v for k, v in wide_compile.skip_rates(net).items() if k != "blocks"}
            row[variant] = result
            del fn, run
        metric = "ms_per_step" if kind == "decode" else "ttft"
        row["dense_ms"], row["wide_ms"] = row["dense"][metric]["median_ms"], row["wide"][metric]["median_ms"]
        row["wide_skip"] = row["wide"]["skip_rates"]["mean"]
        report.rows.append(row)
        if progress:
            print(f"[wide-compile bench {time.perf_counter() - start:6.1f}s] {kind} {size}: dense "
                  f"{row['dense_ms']:.3f} ms, WIDE {row['wide_ms']:.3f} ms ({row['dense_ms'] / row['wide_ms']:.2f}x)",
                  flush=True)
    torch._dynamo.reset()
    return report
