"""``wide-compile demo`` end-to-end on a tiny model: dense vs WIDE perplexity, skip rates, JSON output."""

from __future__ import annotations

import json
import math

import pytest
import torch

import wide_compile
from _tiny_lm import SAMPLE_TEXT, byte_tokenizer, save_tiny_llama, tiny_llama
from wide_compile.cli import main
from wide_compile.data import data_dir
from wide_compile.demo import DEMO_LR, run_demo
from wide_compile.evaluation import perplexity
from wide_compile.training.cpu_threads import idle_cpu_threads


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("demo_data") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": f"{i} {SAMPLE_TEXT * 2}"}) + "\n" for i in range(20)))
    return str(path)


def test_demo_runs_end_to_end_on_a_tiny_model(tmp_path, data_file):
    tokenizer, text = byte_tokenizer(), SAMPLE_TEXT * 8
    dense_ppl = perplexity(tiny_llama(), tokenizer, text, window=32, max_windows=3, progress=False).ppl
    model = tiny_llama()
    out = tmp_path / "demo.json"
    result = run_demo(model, tokenizer, sparsity=0.5, tokens=6 * 2 * 16, windows=3, seq_len=32, train_seq_len=16,
                      batch_size=2, data=[data_file], text=text, out=out, progress=False, ffn_group_size=16)
    assert wide_compile.is_applied(model) and wide_compile.config_of(model).ffn_group_size == 16
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(result.to_dict()))
    assert saved["dense_ppl"] == pytest.approx(dense_ppl)  # measured before the routers were added
    assert saved["windows"] == 3 and saved["eval_tokens"] == 3 * 31 and saved["seq_len"] == 32
    assert saved["train"]["steps"] == 6 and saved["train"]["tokens"] == 6 * 2 * 16
    assert saved["train"]["seq_len"] == 16 and saved["train"]["batch_size"] == 2 and saved["train"]["lr"] == DEMO_LR
    assert set(saved["skip_rates"]) == {"attention", "mlp", "mean"}
    assert all(0.0 <= r <= 1.0 for r in saved["skip_rates"].values())
    # the reported WIDE perplexity and skip rates are those of the trained model with argmax routers
    with wide_compile.track_skip_rates(model) as meter:
        again = perplexity(model, tokenizer, text, window=32, max_windows=3, progress=False)
    assert saved["wide_ppl"] == pytest.approx(again.ppl) and math.isfinite(again.ppl)
    mean_rate = sum(meter.rates().values()) / len(meter.rates())
    assert saved["skip_rates"]["mean"] == pytest.approx(mean_rate)
    assert {"load", "dense_eval", "apply", "untrained_eval", "train", "wide_eval", "total"} <= set(saved["seconds"])
    assert math.isfinite(saved["untrained_ppl"]) and saved["untrained_ppl"] != saved["wide_ppl"]  # routers changed
    table = result.table()
    assert "dense" in table and "WIDE 0.50 calibrated" in table and f"{result.wide_ppl:.3f}" in table
    assert f"{result.untrained_ppl:.3f}" in table


def test_demo_needs_a_tokenizer_for_a_model_object(data_file):
    with pytest.raises(ValueError, match="needs its tokenizer"):
        run_demo(tiny_llama(), None, tokens=64, windows=1, seq_len=32, text=SAMPLE_TEXT, progress=False,
                 data=[data_file])


def test_demo_bad_data_fails_before_loading_a_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run_demo("smollm2", data=[str(tmp_path / "none.jsonl")], progress=False)


@pytest.mark.skipif(data_dir() is None, reason="needs WIDE_DATA_DIR (WikiText-2 test split)")
def test_demo_cli_on_a_model_folder(tmp_path, data_file, capsys):
    folder = save_tiny_llama(tmp_path / "tiny")
    out = tmp_path / "result.json"
    code = main(["demo", "--model", str(folder), "--tokens", "64", "--windows", "2", "--seq-len", "32",
                 "--data", data_file, "--ffn-group-size", "32", "--out", str(out), "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["model"] == str(folder) and saved["device"] == "cpu" and saved["windows"] == 2
    assert f"{saved['dense_ppl']:.3f}" in printed and f"{saved['wide_ppl']:.3f}" in printed


@pytest.mark.parametrize("load,expected", [(0.0, 2), (1.2, 1), (7.0, 1)])
def test_idle_cpu_threads_leaves_busy_cores_alone(monkeypatch, load, expected):
    monkeypatch.setattr("os.getloadavg", lambda: (load, load, load))
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert idle_cpu_threads() == expected
