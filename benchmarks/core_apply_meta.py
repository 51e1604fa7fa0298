"""apply() on a meta-device Llama-3-8B-shaped model: discovery time and router parameter share (no memory used).

    python benchmarks/core_apply_meta.py --out benchmarks/results/core_apply_llama3_8b_meta.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig

import wide_compile


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/core_apply_llama3_8b_meta.json"))
    args = parser.parse_args()
    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    start = time.perf_counter()
    wide_compile.apply(model, sparsity=0.5)
    seconds = time.perf_counter() - start
    rows = wide_compile.describe(model, print_table=False)
    record = {
        "command": "python " + " ".join(sys.argv), "torch": torch.__version__, "transformers": transformers.__version__,
        "shape": "Llama-3-8B (hidden 4096, intermediate 14336, 32 layers, 32 q / 8 kv heads)",
        "apply_seconds_cpu": round(seconds, 2), "router_parameter_fraction": wide_compile.router_parameter_fraction(model),
        "attention_groups": sorted({r["groups"] for r in rows if r["block"] == "attention"}),
        "mlp_groups": sorted({r["groups"] for r in rows if r["block"] == "mlp"}),
    }
    args.out.write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
