"""Markdown table and PNG plot of a quality-benchmark JSON written by ``benchmarks/quality.py``.

    python benchmarks/quality_report.py benchmarks/results/quality_smollm2.json
    -> benchmarks/results/quality_smollm2.md and quality_smollm2.png (the plot needs matplotlib)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

LABELS = {"dense": "dense", "wide_s1": "WIDE stage 1", "wide_s12": "WIDE stage 1+2", "depth_s1": "depth skip",
          "static_width": "static width", "teal": "TEAL (training-free)"}
#: Accuracy of random guessing per task (answer choices), to report accuracy above chance.
CHANCE = {"arc_easy": 0.25, "arc_challenge": 0.25, "openbookqa": 0.25, "hellaswag": 0.25, "boolq": 0.5, "piqa": 0.5,
          "winogrande": 0.5}
TASK_ORDER = ("arc_easy", "arc_challenge", "openbookqa", "boolq", "piqa", "hellaswag", "winogrande")


def ok_rows(record: dict) -> list[dict]:
    return [r for r in record["rows"] if "error" not in r]


def chance_level(tasks: list[str]) -> float:
    return sum(CHANCE[t] for t in tasks) / len(tasks)


def _cell(value, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def training_sentence(rows: list[dict], settings: dict) -> str:
    loaded = sorted({t["loaded_from"] for r in rows for t in r.get("training") or [] if "loaded_from" in t})
    trained = any("stage" in t for r in rows for t in r.get("training") or [])
    parts = []
    if trained:
        parts.append(f"Training: {settings['tokens']:,} tokens per learned method (WIDE stage 1+2: half in stage 1, "
                     f"half in stage 2), sequences of {settings['seq_len']} x batch {settings['batch_size']}, "
                     "bf16 autocast on CUDA.")
    if loaded:
        parts.append(f"WIDE stage-1 routers loaded from an earlier run ({len(loaded)} folders), not trained here.")
    if any(r["method"] in ("static_width", "teal") for r in rows):
        parts.append(f"Static width and TEAL: calibrated on {settings.get('calibration_samples', 128)} C4 windows.")
    return " ".join(parts)


def evaluation_sentence(settings: dict, env: dict) -> str:
    docs = "all documents" if settings["limit"] is None else f"first {settings['limit']} documents"
    windows = settings.get("ppl_max_windows")
    ppl = "the whole split" if windows is None else f"the first {windows} windows"
    precision = "fp32 weights (TF32 matmuls)" if str(env.get("device", "")).startswith("cuda") else "fp32"
    return (f"Evaluation: {precision}, zero-shot, {docs} per task; WikiText-2 test perplexity in 1024-token "
            f"windows over {ppl}. Skip = realized mean skip rate during the perplexity run (attention and MLP blocks averaged); "
            "for TEAL the zeroed fraction of all projection inputs over the whole evaluation.")


def markdown(record: dict, source: str) -> str:
    rows = sorted(ok_rows(record), key=lambda r: (r["sparsity"], list(LABELS).index(r["method"])))
    tasks = [t for t in TASK_ORDER if rows and t in rows[0]["eval"]["tasks"]]
    chance = chance_level(tasks) if tasks else None
    settings, env = record["settings"], record["environment"]
    lines = [f"# Quality benchmark: {settings['model']} ({env.get('gpu', env['device'])})", "",
             f"Command: `{record['command']}` (seed {settings['seed']}); source JSON: `{source}`.", "",
             f"Versions: torch {env['torch']}, transformers {env['transformers']}, lm-eval {env.get('lm_eval')}, "
             f"Python {env['python']}.", "",
             training_sentence(rows, settings) + " " + evaluation_sentence(settings, env), ""]
    head = ["method", "sparsity", "skip", "PPL"] + tasks + ["mean acc", "above chance"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ev = r["eval"]
        rates = (ev.get("skip_rates_by_phase") or {}).get("wikitext2") or ev.get("skip_rates") or {}
        if r["method"] == "teal":  # zeroed fraction of projection inputs (per channel, not per group)
            rates = {"mean": r.get("teal_realized_sparsity")}
        accs = [ev["tasks"][t]["acc"] for t in tasks]
        mean = sum(accs) / len(accs) if accs else None
        cells = [LABELS[r["method"]], f"{r['sparsity']:g}", _cell(rates.get("mean"), ".3f"),
                 _cell(ev["ppl"]["wikitext2"] if ev.get("ppl") else None, ".2f")]
        cells += [f"{a:.3f}" for a in accs] + [_cell(mean, ".4f"), _cell(None if mean is None else mean - chance, "+.4f")]
        lines.append("| " + " | ".join(cells) + " |")
    failed = [r for r in record["rows"] if "error" in r]
    if failed:
        lines += ["", "Failed jobs: " + "; ".join(f"{r['job']}: {r['error'][:120]}" for r in failed)]
    if chance is not None:
        lines += ["", f"Chance level of the mean accuracy over these tasks: {chance:.4f} "
                      "(1/4 for ARC, OpenBookQA, HellaSwag; 1/2 for BoolQ, PIQA, WinoGrande)."]
    timing = record.get("training_throughput")
    if timing:
        minutes = 10_000_000 / timing["tokens_per_second"] / 60
        lines += ["", f"Training throughput (WIDE stage 1, alone on the GPU): {timing['tokens_per_second']:,.0f} "
                      f"tokens/s over {timing['tokens']:,} tokens ({timing['train_seconds']} s); a 10M-token stage-1 "
                      f"run takes about {minutes:.1f} minutes at this rate."]
    return "\n".join(lines) + "\n"


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = ok_rows(record)
    dense = next((r for r in rows if r["method"] == "dense"), None)
    fig, (ax_ppl, ax_acc) = plt.subplots(1, 2, figsize=(11, 4.2))
    for method, label in LABELS.items():
        if method == "dense":
            continue
        pts = sorted((r["sparsity"], r["eval"]["ppl"]["wikitext2"], r["eval"]["mean_acc"]) for r in rows
                     if r["method"] == method)
        if pts:
            xs, ppl, acc = zip(*pts)
            ax_ppl.plot(xs, ppl, marker="o", label=label)
            ax_acc.plot(xs, acc, marker="o", label=label)
    if dense is not None:
        ax_ppl.axhline(dense["eval"]["ppl"]["wikitext2"], color="k", ls="--", lw=1, label="dense")
        ax_acc.axhline(dense["eval"]["mean_acc"], color="k", ls="--", lw=1, label="dense")
    tasks = [t for t in TASK_ORDER if rows and t in rows[0]["eval"]["tasks"]]
    if tasks:
        ax_acc.axhline(chance_level(tasks), color="grey", ls=":", lw=1, label="chance")
    ax_ppl.set(xlabel="sparsity", ylabel="WikiText-2 perplexity (log)", yscale="log", title="Perplexity")
    ax_acc.set(xlabel="sparsity", ylabel="mean zero-shot accuracy (7 tasks)", title="Accuracy")
    for ax in (ax_ppl, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{record['settings']['model']}: WIDE vs baselines, {record['settings']['tokens']:,} training tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path)
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    record = json.loads(args.json.read_text())
    md = args.json.with_suffix(".md")
    md.write_text(markdown(record, args.json.name))
    print(f"wrote {md}")
    if not args.no_plot:
        plot(record, args.json.with_suffix(".png"))
        print(f"wrote {args.json.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
