"""Core exactness on the real default model: dense vs WIDE (forced all-execute) perplexity, apply cost.

    python benchmarks/core_real_model.py --windows 4 --out benchmarks/results/core_smollm2.json

Writes JSON + markdown with versions and the command. Untrained (random-init) routers are also timed and
scored, to show they really skip work; their perplexity is not a quality claim.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import transformers

import wide_compile
from wide_compile.data import wikitext2_test_text
from wide_compile.evaluation import perplexity
from wide_compile.model_zoo import load_model


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/core_smollm2.json"))
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tok = load_model(args.model, dtype="fp32", device=device)
    text = wikitext2_test_text()
    ppl = lambda: perplexity(model, tok, text, window=1024, max_windows=args.windows, progress=False)  # noqa: E731
    t0 = time.perf_counter()
    dense = ppl()
    t1 = time.perf_counter()
    wide_compile.apply(model, sparsity=0.5)
    t2 = time.perf_counter()
    with wide_compile.forced(model, "execute"):
        execute = ppl()
    with wide_compile.track_skip_rates(model) as meter:
        routed = ppl()
    rates = meter.rates()
    record = {
        "command": "python " + " ".join(sys.argv),
        "model": args.model, "device": device, "dtype": "float32", "windows": args.windows, "window": 1024,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version(), "wide_compile": wide_compile.__version__},
        "dense_ppl": dense.ppl, "all_execute_ppl": execute.ppl, "tokens": dense.tokens,
        "all_execute_equals_dense": execute.ppl == dense.ppl,
        "untrained_router_ppl": routed.ppl,
        "untrained_skip_rate": {k: sum(v for (_, kind), v in rates.items() if kind == k) /
                                max(1, sum(1 for (_, kind) in rates if kind == k)) for k in ("attention", "mlp")},
        "apply_seconds": round(t2 - t1, 2), "dense_eval_seconds": round(t1 - t0, 2),
        "router_parameter_fraction": wide_compile.router_parameter_fraction(model),
        "layers": len(wide_compile.state.get_state(model).blueprint.layers),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    md = [f"# Core exactness on {args.model}", "", f"Command: `{record['command']}`", "",
          f"torch {torch.__version__}, transformers {transformers.__version__}, {device}, fp32, "
          f"{args.windows} x 1024-token windows of WikiText-2 test ({dense.tokens} scored tokens)", "",
          "| quantity | value |", "| --- | --- |"]
    for key in ("dense_ppl", "all_execute_ppl", "all_execute_equals_dense", "untrained_router_ppl",
                "untrained_skip_rate", "apply_seconds", "router_parameter_fraction", "layers"):
        md.append(f"| {key} | {record[key]} |")
    args.out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
