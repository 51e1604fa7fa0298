"""benchmarks/e2e.py with the one-token output projection's kernel chosen for an in-model A/B (stops 30-31): the
input-group row GEMV (``templates/gemv_rows.py``, the default since stop 31 on weights <= 48 MiB) or, with
``--input-rows off``, the split-K GEMV of ``templates/gemv_decode.py``. Other arguments as e2e.py's; run from the
repository root:

    python3 benchmarks/e2e_output_rows.py --input-rows off --model llama3-8b-shape --sparsity 0.5 --prefill '' \
        --decode-batch 1 --mode reduce-overhead --budget-s 120 --skip-guard-eval --profile --out OUT.json
"""
import json
import runpy
import shlex
import sys
from pathlib import Path

import wide_compile.templates.gemv_rows as gr

_orig = gr.applies


def _take_flag(argv: list[str]) -> tuple[bool, list[str]]:
    if "--input-rows" not in argv:
        return True, argv
    i = argv.index("--input-rows")
    value = argv[i + 1]
    if value not in ("on", "off"):
        raise SystemExit(f"--input-rows takes on or off, not {value!r}")
    return value == "on", argv[:i] + argv[i + 2:]


def main() -> None:
    input_rows, rest = _take_flag(sys.argv[1:])

    def applies(num_tokens, weight_bytes, group_size, config, output=True):
        if not output and config is None:
            return input_rows and num_tokens == 1 and weight_bytes <= gr.MAX_WEIGHT_BYTES
        return _orig(num_tokens, weight_bytes, group_size, config, output)

    gr.applies = applies
    command = shlex.join(["python3", "benchmarks/e2e_output_rows.py", *sys.argv[1:]])
    sys.argv = ["e2e.py"] + rest
    sys.path.insert(0, "benchmarks")
    try:
        runpy.run_path("benchmarks/e2e.py", run_name="__main__")
    finally:  # the record names this script and its flag, not e2e.py
        out = Path(rest[rest.index("--out") + 1]) if "--out" in rest else None
        if out is not None and out.exists():
            record = json.loads(out.read_text())
            record["command"] = command
            out.write_text(json.dumps(record, indent=2, default=str))


if __name__ == "__main__":
    main()
