"""Check that wide-compile's evaluation equals lm-eval's own on a real model; write JSON + markdown results.

1. Prompt parity on the full local task files: for every document of every task, our generated task and
   lm-eval's stock yaml (only the data source replaced) give the same context, choices and target.
2. Accuracy parity: ``wide_compile.evaluation.harness.evaluate`` (HFLM around the model object, our task
   yamls) vs ``lm_eval.simple_evaluate(model="hf", pretrained=<folder>)`` on lm-eval's stock yamls.

    python benchmarks/eval_parity.py --model smollm2 --tasks piqa,arc_easy --limit 200

Writes ``benchmarks/results/eval_parity_<model>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from importlib.metadata import version
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def prompt_parity(tasks: list[str]) -> dict[str, dict]:
    from wide_compile.evaluation.lm_eval_reference import stock_tasks
    from wide_compile.evaluation.tasks import lm_eval_tasks

    out = {}
    with lm_eval_tasks(tasks, source="local") as (ours_tm, names), stock_tasks(tasks) as (stock_tm, _):
        ours, stock = ours_tm.load(names)["tasks"], stock_tm.load(names)["tasks"]
        for name in names:
            a, b = list(ours[name].eval_docs), list(stock[name].eval_docs)
            view = lambda task, doc: (task.doc_to_text(doc), task.doc_to_choice(doc), task.doc_to_target(doc))
            mismatches = sum(view(ours[name], x) != view(stock[name], y) for x, y in zip(a, b))
            out[name] = {"docs": len(a), "stock_docs": len(b), "mismatches": mismatches + abs(len(a) - len(b))}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tasks", default="piqa,arc_easy")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--ppl-windows", type=int, default=20)
    parser.add_argument("--skip-prompt-parity", action="store_true")
    args = parser.parse_args()

    import torch

    from wide_compile.evaluation.harness import evaluate
    from wide_compile.evaluation.lm_eval_reference import reference_evaluate
    from wide_compile.evaluation.tasks import TASKS
    from wide_compile.model_zoo import fetch_model, load_model

    tasks = [t for t in args.tasks.split(",") if t]
    record: dict = {"command": "python " + " ".join(sys.argv), "model": args.model, "limit": args.limit,
                    "batch_size": args.batch_size, "device": "cpu", "dtype": "float32",
                    "versions": {p: version(p) for p in ("torch", "transformers", "lm_eval", "datasets")},
                    "python": platform.python_version(), "cpu_threads": torch.get_num_threads()}
    if not args.skip_prompt_parity:
        start = time.perf_counter()
        record["prompt_parity"] = prompt_parity(list(TASKS))
        record["prompt_parity_seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps(record["prompt_parity"]), flush=True)

    model, tokenizer = load_model(args.model, dtype="float32", device="cpu")
    start = time.perf_counter()
    ours = evaluate(model, tokenizer, tasks=tasks, limit=args.limit, batch_size=args.batch_size,
                    ppl=args.ppl_windows > 0, ppl_max_windows=args.ppl_windows or None)
    record["ours"] = ours
    record["ours_seconds"] = round(time.perf_counter() - start, 1)
    del model
    start = time.perf_counter()
    record["lm_eval"] = reference_evaluate(fetch_model(args.model), tasks, limit=args.limit,
                                           batch_size=args.batch_size, device="cpu", dtype="float32")
    record["lm_eval_seconds"] = round(time.perf_counter() - start, 1)
    record["equal"] = {t: {m: ours["tasks"][t][m] == record["lm_eval"][t][m] for m in ("acc", "acc_norm")}
                       for t in tasks}
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"eval_parity_{args.model}"
    stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(record, tasks))
    print(markdown(record, tasks))
    return 0 if all(all(v.values()) for v in record["equal"].values()) else 1


def markdown(record: dict, tasks: list[str]) -> str:
    fmt = lambda v: "-" if v is None else f"{v:.4f}"
    lines = [f"# Evaluation parity: wide-compile vs lm-eval ({record['model']}, limit {record['limit']})", "",
             f"Command: `{record['command']}`  ", f"Versions: {record['versions']}, Python {record['python']}, "
             f"CPU ({record['cpu_threads']} threads), {record['dtype']}, batch size {record['batch_size']}", "",
             "| task | docs | acc (ours) | acc (lm-eval) | acc_norm (ours) | acc_norm (lm-eval) | equal |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for t in tasks:
        o, r = record["ours"]["tasks"][t], record["lm_eval"][t]
        lines.append(f"| {t} | {o['docs']} | {fmt(o['acc'])} | {fmt(r['acc'])} | {fmt(o['acc_norm'])} | "
                     f"{fmt(r['acc_norm'])} | {all(record['equal'][t].values())} |")
    if record["ours"].get("ppl"):
        p = record["ours"]["ppl"]
        lines += ["", f"WikiText-2 test perplexity (ours, first {p['windows']} windows x {p['window']} tokens): "
                      f"{p['wikitext2']:.4f}"]
    if "prompt_parity" in record:
        lines += ["", "Prompt parity on the full local files (context, choices, target of every document):", "",
                  "| task | docs | mismatches |", "| --- | --- | --- |"]
        lines += [f"| {t} | {v['docs']} | {v['mismatches']} |" for t, v in record["prompt_parity"].items()]
    lines.append(f"\nSeconds: ours {record['ours_seconds']}, lm-eval {record['lm_eval_seconds']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
