#!/usr/bin/env bash
# Every GPU-marked test in one call (kernels, backend, attention lowering, static-cache CUDA graphs), with the
# failures' short reasons; log under $OUT. Usage (repo root, on the GPU machine): bash benchmarks/run_gpu_checks.sh
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
# --show-capture=no: a failing test's captured logs (torch's trace logger writes thousands of DEBUG lines) would push
# its traceback out of the tail
PYTHONUNBUFFERED=1 timeout "${GPU_TESTS_TIMEOUT_S:-540}" python3 -m pytest -q -p no:cacheprovider -m gpu -rfE \
  --show-capture=no --tb=short --durations=8 tests 2>&1 | grep -v -E "^(W|I)[0-9]{4} |^DEBUG " | tail -80 \
  | tee "$OUT/gpu_checks.log"
