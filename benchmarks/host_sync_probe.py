"""Does a compiled prefill call wait for the GPU? Dense vs WIDE, CUDA graphs (``reduce-overhead``), GPU only.

In the end-to-end runs the WIDE prefill's warm time to first token exceeds its profiled device window by 0.3-2.1 ms
(runs R-AB), the dense one's does not (``benchmarks/notes_e2e.md``). Back-to-back timed calls hide each call's host
work behind the previous call's kernels only if the call never waits for the device; a call that synchronises
somewhere pays its host work again in the device timeline. This checks, per variant:

- ``host_ms_while_busy``: host time of one call issued while the GPU still runs a long ``torch.cuda._sleep``
  (a call that never waits returns after its own host work, far sooner than the sleep);
- ``syncs``: the synchronising CUDA calls PyTorch reports in that call (``torch.cuda.set_sync_debug_mode``);
- ``ttft_back_to_back_ms`` (as ``e2e.py`` times it) against ``ttft_queued_ms``: the same calls all queued behind one
  sleep first, so no call's host work can show between kernels.

Usage: ``python benchmarks/host_sync_probe.py [--layers 4] [--tokens 4096] [--out FILE]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_models import build_models  # noqa: E402
from e2e_timing import versions  # noqa: E402

from wide_compile.speed import PrefillRun, compile_variant  # noqa: E402

SLEEP_CYCLES = 400_000_000  # about 0.2 s at the H200's clock: longer than any call's host work


def _events(n: int) -> list:
    return [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]


def timed(run: PrefillRun, runs: int, queued: bool) -> list[float]:
    """Each call between two events, issued back to back; with ``queued`` all behind one long sleep."""
    events = _events(runs)
    torch.cuda.synchronize()
    if queued:
        torch.cuda._sleep(SLEEP_CYCLES)
    for start, end in events:
        run.rewind()
        start.record()
        run.call()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in events]


def probe(run: PrefillRun, runs: int) -> dict:
    for _ in range(3):  # compile, record the CUDA graph, one replay
        run.rewind()
        run.call()
    torch.cuda.synchronize()
    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
        host = []
        for _ in range(5):
            run.rewind()
            torch.cuda.synchronize()
            torch.cuda._sleep(SLEEP_CYCLES)
            t0 = time.perf_counter()
            run.call()
            host.append((time.perf_counter() - t0) * 1e3)
            torch.cuda.synchronize()
        run.rewind()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run.call()
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        back = timed(run, runs, queued=False)
        queued = timed(run, runs, queued=True)
    return {"host_ms_while_busy": [round(v, 3) for v in host],
            "syncs": sorted({str(w.message)[:200] for w in caught if "synchroniz" in str(w.message).lower()}),
            "ttft_back_to_back_ms": statistics.median(back), "ttft_queued_ms": statistics.median(queued),
            "back_to_back_all": [round(v, 3) for v in back], "queued_all": [round(v, 3) for v in queued]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_sync_probe needs a CUDA GPU")
    models = build_models("llama3-8b-shape", torch.device("cuda"), torch.bfloat16, layers=args.layers)
    record = {"command": " ".join(["python"] + sys.argv), "versions": versions(), "layers": args.layers,
              "tokens": args.tokens, "sleep_cycles": SLEEP_CYCLES, "results": {}}
    for variant, model in (("dense", models.dense), ("wide", models.wide)):
        torch._dynamo.reset()
        fn = compile_variant(model, variant, "reduce-overhead", "inductor", False)
        with torch.no_grad():
            record["results"][variant] = probe(PrefillRun(fn, model, args.tokens), args.runs)
        r = record["results"][variant]
        print(f"{variant:5s} host while busy {r['host_ms_while_busy']} ms; syncs {len(r['syncs'])}; ttft back to back "
              f"{r['ttft_back_to_back_ms']:.3f} ms, queued {r['ttft_queued_ms']:.3f} ms", flush=True)
        for s in r["syncs"]:
            print("   sync:", s)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
