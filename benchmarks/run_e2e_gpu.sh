#!/usr/bin/env bash
# End-to-end benchmark on one GPU (H200), about 8 minutes in total: install, Llama-3-8B shape, then SmolLM2-135M.
#
#   OUT=/some/dir bash benchmarks/run_e2e_gpu.sh
#
# Environment:
#   OUT                 where JSON and logs go (default benchmarks/results)
#   WIDE_ROUTERS        trained SmolLM2 routers (folder with wide_routers.safetensors); SmolLM2 runs only when set
#   WIDE_SMOLLM2_DIR    SmolLM2-135M as an HF folder (needed with WIDE_ROUTERS: the GPU machine has no network)
#   E2E_8B_BUDGET_S     budget of the 8B-shape run in seconds (default 330 with SmolLM2, 420 without; with
#                       static shapes each (stage, variant) compiles in about 23 s on the H200)
#   E2E_SMOL_BUDGET_S   budget of the SmolLM2 run (default 95)
#   E2E_8B_ARGS         extra arguments for the 8B run (e.g. "--layers 16" if full-depth compiles are too slow)
#   E2E_RUN_TESTS=1     first run the GPU tests of tests/test_static_cache_generate.py (about a minute more)
# Each run has a time budget: stages that would not fit are recorded as skipped (most important first: decode at
# batch 1, prefill 4k, decode at batch 8/32, prefill 1k/16k); a hard `timeout` stops a run 45 s past its budget
# (SIGINT: the JSON written after every measurement is kept).
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
export PYTHONUNBUFFERED=1
if [ -n "$E2E_RUN_TESTS" ]; then
  python3 -m pytest -q -p no:cacheprovider tests/test_static_cache_generate.py -k gpu 2>&1 | tail -15 \
    | tee "$OUT/e2e_gpu_tests.log"
fi

if [ -n "$WIDE_ROUTERS" ]; then B8="${E2E_8B_BUDGET_S:-330}"; else B8="${E2E_8B_BUDGET_S:-420}"; fi
BS="${E2E_SMOL_BUDGET_S:-95}"

# shellcheck disable=SC2086
timeout --signal=INT --kill-after=15 $((B8 + 45)) \
  python3 benchmarks/e2e.py --model llama3-8b-shape --sparsity 0.5 --prefill 4096,1024,16384 --decode-batch 1,8,32 \
    --mode reduce-overhead --budget-s "$B8" --profile --out "$OUT/e2e_llama3_8b_shape.json" $E2E_8B_ARGS \
  2>&1 | tee "$OUT/e2e_llama3_8b_shape.log" | grep -v -E "^(W|I)[0-9]{4} " | tail -60

FILES=("$OUT/e2e_llama3_8b_shape.json")
if [ -n "$WIDE_ROUTERS" ] && [ -z "$WIDE_SMOLLM2_DIR" ]; then
  echo "WIDE_ROUTERS is set but WIDE_SMOLLM2_DIR is not: SmolLM2 needs a local HF folder on the GPU machine"
fi
if [ -n "$WIDE_ROUTERS" ]; then
  timeout --signal=INT --kill-after=15 $((BS + 45)) \
    python3 benchmarks/e2e.py --model smollm2 --model-dir "$WIDE_SMOLLM2_DIR" --routers "$WIDE_ROUTERS" \
      --prefill 4096,1024,16384 --decode-batch 1,8,32 --mode reduce-overhead --budget-s "$BS" \
      --out "$OUT/e2e_smollm2.json" \
    2>&1 | tee "$OUT/e2e_smollm2.log" | grep -v -E "^(W|I)[0-9]{4} " | tail -40
  FILES+=("$OUT/e2e_smollm2.json")
else
  echo "WIDE_ROUTERS not set: SmolLM2 run skipped"
fi
python3 benchmarks/e2e.py --summarize "${FILES[@]}"
