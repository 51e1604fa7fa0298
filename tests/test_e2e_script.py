"""The end-to-end benchmark script itself (``benchmarks/e2e.py --model tiny``) on the CPU: it runs every variant and
records what its report reads (the eager cross-check with the compiled run's own masks, the all-active baseline's
realized masks, the ratios, backend options passed through), so a device run is not the first run of a changed
script."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_run_with_all_active_baseline(tmp_path):
    out = tmp_path / "e2e_tiny.json"
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "e2e.py"), "--model", "tiny", "--prefill", "16",
                           "--decode-batch", "1", "--decode-steps", "4", "--prefill-runs", "2", "--all-active",
                           "--wide-option", "wide.one_token_routers=reduction", "--skip-guard-eval", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["errors"] == []
    assert "all-active/wide" in proc.stdout  # the printed table has the baseline's columns
    prefill, decode = record["results"]["prefill"]["16"], record["results"]["decode"]["1"]
    for entry, metric in ((prefill, "ttft"), (decode, "ms_per_step")):
        assert set(entry) >= {"dense", "wide", "wide_all_active", "all_active_over_wide", "dense_over_all_active"}
        assert entry["wide_all_active"]["skip_rates"]["mean"] == 0.0  # forced on: nothing skipped
        assert 0.3 < entry["wide"]["skip_rates"]["mean"] < 0.7  # random routers: about half skipped
        ratio = entry["dense"][metric]["median_ms"] / entry["wide_all_active"][metric]["median_ms"]
        assert abs(entry["dense_over_all_active"] - ratio) < 1e-9
    for variant in ("dense", "wide"):  # one request from an idle device (wall clock, host work included); each call
        for key in ("ttft_cold", "ttft_idle"):  # on a rested card (device events)
            assert prefill[variant][key]["n"] == 2 and prefill[variant][key]["median_ms"] > 0
    for key, ratio in (("ttft_cold", "cold_time"), ("ttft_idle", "idle_time")):
        want = prefill["dense"][key]["median_ms"] / prefill["wide"][key]["median_ms"]
        assert abs(prefill["dense_over_wide"][ratio] - want) < 1e-9
    assert "one request from idle" in proc.stdout and "card idle before each call" in proc.stdout
    assert record["settings"]["wide_options"] == {"wide.one_token_routers": "reduction"}
    assert record["settings"]["skip_guard_eval"] is True  # the timed calls ran without guard evaluation
    assert record["stages"]["decode[1]/wide"]["wide_compile_report"]["lowered"]["router_reduction"] == 8  # 4 layers
    check = prefill["wide"]["check_vs_eager"]
    assert check["same_masks_logits_cosine"] > 0.9999 and check["same_masks_top1_equal"]  # fp32 CPU: same model
    assert 0.0 <= check["mask_flips"] <= 0.01
