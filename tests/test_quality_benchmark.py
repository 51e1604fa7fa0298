"""benchmarks/quality.py jobs and benchmarks/quality_report.py on a tiny model (the H200 run uses the same code)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from _tiny_lm import save_tiny_llama  # noqa: E402
from test_eval_harness import write_data_root  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _settings(tmp_path, model_dir, **over):
    from quality_jobs import JobSettings

    values = dict(model=str(model_dir), tokens=128, seq_len=32, batch_size=2, seed=0, tasks=("piqa",), limit=2,
                  eval_batch_size=2, device="cpu", out_dir=str(tmp_path / "out"), calibration_samples=2,
                  calibration_seq_len=32,
                  ppl_max_windows=1, ppl_window=64, ffn_group_size=16)
    values.update(over)
    return JobSettings(**values)


def test_jobs_train_equal_tokens_and_evaluate(tmp_path, monkeypatch):
    """WIDE s1 and s1+2 spend the same token budget; each row has eval results; routers of s1 are saved."""
    import json

    from quality_jobs import Job, row_path, run_job

    root = write_data_root(tmp_path / "data")
    (root / "calibration").mkdir()
    (root / "calibration" / "mix.jsonl").write_text(
        "\n".join(json.dumps({"text": f"document {i} " + "some calibration words " * 40}) for i in range(40)))
    monkeypatch.setenv("WIDE_DATA_DIR", str(root))
    model_dir = save_tiny_llama(tmp_path / "model")
    settings = _settings(tmp_path, model_dir)
    s1 = run_job(Job("wide_s1", 0.5), settings)
    s12 = run_job(Job("wide_s12", 0.5), settings)
    assert "error" not in s1, s1.get("traceback")
    assert "error" not in s12, s12.get("traceback")
    assert [t["stage"] for t in s12["training"]] == [1, 2]
    budget = [t["tokens"] for t in s1["training"]], [t["tokens"] for t in s12["training"]]
    assert sum(budget[0]) == sum(budget[1]) == 128
    for row in (s1, s12):
        assert set(row["eval"]["tasks"]) == {"piqa"} and row["eval"]["ppl"]["wikitext2"] > 1
        assert 0 < row["eval"]["skip_rates"]["mean"] < 1
    assert (Path(settings.out_dir) / "routers" / "wide_s1_0.5" / "wide_routers.safetensors").is_file()
    assert json.loads(row_path(settings, Job("wide_s1", 0.5)).read_text())["job"] == "wide_s1_0.5"
    reloaded = run_job(Job("wide_s1", 0.5), _settings(tmp_path, model_dir, out_dir=str(tmp_path / "again"),
                                                        routers_from=str(Path(settings.out_dir) / "routers")))
    assert reloaded["training"][0]["loaded_from"].endswith("wide_s1_0.5")
    assert reloaded["eval"]["ppl"] == s1["eval"]["ppl"]  # the same routers give the same model
    teal = run_job(Job("teal", 0.5), settings)
    assert "error" not in teal, teal.get("traceback")
    assert 0.3 < teal["teal_realized_sparsity"] < 0.7 and teal["eval"]["skip_rates"] is None
    bad = run_job(Job("wide_s1", 0.5), _settings(tmp_path, tmp_path / "missing"))
    assert "error" in bad  # recorded in the row, so the other jobs of a run go on


def test_report_table_counts_accuracy_above_chance_and_lists_failures():
    from quality_report import chance_level, markdown

    tasks = {"piqa": {"acc": 0.6}, "arc_easy": {"acc": 0.4}}
    record = {
        "command": "python benchmarks/quality.py --x", "environment": {"torch": "t", "transformers": "tf",
                                                                       "python": "3", "device": "cpu"},
        "settings": {"model": "m", "seed": 0, "tokens": 10, "seq_len": 8, "batch_size": 2, "limit": None},
        "rows": [
            {"job": "dense", "method": "dense", "sparsity": 0.0,
             "eval": {"tasks": tasks, "ppl": {"wikitext2": 20.0}, "skip_rates": None}},
            {"job": "wide_s1_0.5", "method": "wide_s1", "sparsity": 0.5,
             "eval": {"tasks": {"piqa": {"acc": 0.55}, "arc_easy": {"acc": 0.3}}, "ppl": {"wikitext2": 40.0},
                      "skip_rates": {"mean": 0.5}}},
            {"job": "depth_s1_0.5", "method": "depth_s1", "sparsity": 0.5, "error": "OutOfMemoryError: x"},
        ],
    }
    assert chance_level(["piqa", "arc_easy"]) == pytest.approx(0.375)
    text = markdown(record, "q.json")
    assert "| dense | 0 | n/a | 20.00 | 0.400 | 0.600 | 0.5000 | +0.1250 |" in text
    assert "| WIDE stage 1 | 0.5 | 0.500 | 40.00 | 0.300 | 0.550 | 0.4250 | +0.0500 |" in text
    assert "Failed jobs: depth_s1_0.5: OutOfMemoryError" in text
