"""benchmarks/e2e.py with the input-group row GEMV as the one-token default for weights <= 48 MiB (the output
projection), for an in-model A/B (stop 30). Same arguments as e2e.py; run from the repository root:

    python3 benchmarks/e2e_output_rows.py --model llama3-8b-shape --sparsity 0.5 --prefill '' --decode-batch 1 \
        --mode reduce-overhead --budget-s 120 --skip-guard-eval --profile --out OUT.json
"""
import runpy
import sys

import wide_compile.templates.gemv_rows as gr

_orig = gr.applies


def applies(num_tokens, weight_bytes, group_size, config, output=True):
    if not output and config is None and num_tokens == 1 and weight_bytes <= gr.MAX_WEIGHT_BYTES:
        return True
    return _orig(num_tokens, weight_bytes, group_size, config, output)


gr.applies = applies
sys.argv = ["e2e.py"] + sys.argv[1:]
sys.path.insert(0, "benchmarks")
runpy.run_path("benchmarks/e2e.py", run_name="__main__")
