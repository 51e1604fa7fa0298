"""Host work of one compiled decode call, dense vs WIDE (CPU, a random tiny Llama; no GPU needed).

What a compiled call does on the host besides running its graph grows with the WIDE model: Dynamo's guard tree
(the routers' tensors, the pre-hooks and their attributes), the graph's inputs (every router parameter) and outputs
(the masks kept for ``realized_masks``: one tensor since ``passes/mask_packing.py``, one per block before). This
measures, per variant:

- ``guard_nodes``: lines of the guard tree of the compiled frame (``torch._dynamo`` cache entry), and
  ``diff_guard_sources``: the sources whose guards ``skip_guard_eval_unsafe`` still checks (tensor guards of
  buffers and inputs; 235 for the WIDE model before ``decisions._temperature`` kept the routers' temperature buffers
  out of inference graphs, 48 for the dense one);
- ``diff_identity_guards``: ``a is b`` guards in that diff-guard tree (Dynamo's duplicate-input guards between two
  attribute chains to one object, evaluated in Python on every call; 32 on a 4-layer WIDE model while the hooks held
  the state as an attribute; since ``wide_compile/state_registry.py`` as many as the dense model's, transformers' own:
  9 on 8 layers);
- ``graph_inputs`` / ``graph_outputs``: of the captured graph (a counting backend);
- ``outside_graph_us`` / ``cache_lookup_us``: under ``torch.profiler``, per call, the compiled region's CPU time
  minus its compiled-graph call, and Dynamo's cache lookup (guard check), with the default stance and with
  ``skip_guard_eval_unsafe``. Profiler times are inflated; compare the variants, not the absolute values.

Usage: ``python benchmarks/host_overhead.py [--layers 8] [--out FILE]`` (default
``benchmarks/results/host_overhead_cpu.json``)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_models import build_models  # noqa: E402
from e2e_timing import versions  # noqa: E402

from wide_compile.speed import DecodeRun, compile_variant  # noqa: E402


def cache_entries(model) -> list:
    """Dynamo cache entries of the functions a compiled HF model call goes through (forward and its wrappers)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    found, seen = [], set()
    stack = [type(model).forward, type(model).__call__, type(model)._call_impl]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        code = getattr(fn, "__code__", None)
        if code is not None:
            found += _debug_get_cache_entry_list(code)
        stack.append(getattr(fn, "__wrapped__", None))
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if callable(value):
                stack.append(value)
    return found


def diff_guard_text(entry) -> str:
    """The printed diff-guard tree of a cache entry (the guards ``skip_guard_eval_unsafe`` still checks), or ''."""
    manager = entry.guard_manager
    diff = getattr(manager, "diff_guard_root", None)
    if diff is None:
        return ""
    root = manager.root
    try:
        manager.root = diff  # the printer walks ``root``
        return str(manager)
    finally:
        manager.root = root


def graph_arity(model) -> tuple[int, int]:
    """(inputs, outputs) of the graph Dynamo captures for one decode step."""
    seen = []

    def counting(gm, inputs):
        out = next(n for n in gm.graph.nodes if n.op == "output")
        seen.append((len(inputs), len(out.args[0])))
        return gm.forward

    torch._dynamo.reset()
    run = DecodeRun(torch.compile(model, backend=counting), model, 1, 64, 4)
    run.rewind()
    with torch.no_grad():
        run.step(0)
    return seen[0]


def profiled_host_us(run: DecodeRun, skip_guards: bool, calls: int = 40) -> dict:
    from torch.profiler import ProfilerActivity, profile

    stance = (torch.compiler.set_stance("default", skip_guard_eval_unsafe=True) if skip_guards
              else torch.no_grad())
    with stance, torch.no_grad():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(calls):
                if i % 10 == 0:
                    run.rewind()
                run.step(i % 10)
    totals = {}
    for evt in prof.key_averages():
        for name in ("Torch-Compiled Region", "## Call CompiledFxGraph", "TorchDynamo Cache Lookup"):
            if evt.key.startswith(name):
                totals[name] = totals.get(name, 0.0) + evt.cpu_time_total / calls
    region, graph = totals.get("Torch-Compiled Region", 0.0), totals.get("## Call CompiledFxGraph", 0.0)
    return {"outside_graph_us": region - graph, "cache_lookup_us": totals.get("TorchDynamo Cache Lookup", 0.0)}


def measure(model, variant: str) -> dict:
    inputs, outputs = graph_arity(model)
    torch._dynamo.reset()
    run = DecodeRun(compile_variant(model, variant, None, "inductor", False), model, 1, 64, 20)
    run.rewind()
    with torch.no_grad():
        for i in range(3):
            run.step(i)
    entries = cache_entries(model)
    guard_nodes = sum(str(e.guard_manager).count("\n") for e in entries)
    diff_sources = sum(len(getattr(e.guard_manager, "diff_guard_sources", ())) for e in entries)
    identity = sum(1 for e in entries for line in diff_guard_text(e).splitlines()
                   if "LAMBDA_GUARD" in line and " is " in line.split("#")[0] and "L[" in line)
    return {"graph_inputs": inputs, "graph_outputs": outputs, "cache_entries": len(entries),
            "guard_nodes": guard_nodes, "diff_guard_sources": diff_sources, "diff_identity_guards": identity,
            "default_stance": profiled_host_us(run, False),
            "skip_guard_eval": profiled_host_us(run, True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "host_overhead_cpu.json"))
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    models = build_models("tiny", torch.device("cpu"), torch.float32, layers=args.layers)
    result = {"command": "python benchmarks/host_overhead.py " + " ".join(sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "versions": versions(),
              "layers": args.layers}
    for variant, model in (("dense", models.dense), ("wide", models.wide)):
        result[variant] = measure(model, variant)
        print(variant, json.dumps(result[variant]), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
