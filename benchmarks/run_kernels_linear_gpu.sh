#!/usr/bin/env bash
# GPU recipe for the group-skipping linear kernels: install, GPU tests, benchmark (results under $OUT).
# Usage (repo root, on the GPU machine): bash benchmarks/run_kernels_linear_gpu.sh [benchmark args...]
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-benchmarks/results}"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ -z "$SKIP_TESTS" ]; then
  PYTHONUNBUFFERED=1 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_group_linear.py 2>&1 | tail -25 | tee "$OUT/gpu_tests.log"
fi
PYTHONUNBUFFERED=1 python3 benchmarks/kernels_linear.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
