"""``benchmarks/sanitize_kernels.py`` (what ``compute-sanitizer`` runs on the GPU) under the Triton interpreter: every
case runs and matches its reference, so the device run checks memory accesses of kernels that compute the right
thing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_sanitizer_driver_runs_every_case_on_the_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sanitize_kernels.py"), "--device", "cpu",
                           "--quick"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("ok", "FAIL"))]
    assert len(lines) >= 20 and not [ln for ln in lines if ln.startswith("FAIL")]
    for kernel in ("output_group_linear", "gated_up_groups", "gated_up_groups M=70 TMA", "input_group_linear",
                   "router_mask",
                   "prefill explicit mask", "mask_extents", "decode explicit mask",
                   "query GEMM on a shared row order, rotary epilogue", "prefill causal on a shared row order"):
        assert any(kernel in ln for ln in lines), kernel
