"""wide-compile command line: sub-command discovery, fetch-model, ppl, errors, and one real subprocess run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _tiny_lm import SAMPLE_TEXT, save_tiny_llama
from wide_compile.cli import build_parser, main
from wide_compile.evaluation import perplexity
from wide_compile.model_zoo import SOURCE_FILE, load_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("cli") / "tiny")


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli_text") / "sample.txt"
    path.write_text(SAMPLE_TEXT * 3, encoding="utf-8")
    return path


def test_subcommands_are_discovered():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    assert {"fetch-model", "ppl"} <= set(subparsers.choices)


def test_no_subcommand_is_an_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_fetch_model_prints_cached_folder(tmp_path, capsys):
    folder = tmp_path / "models" / "smollm2"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / SOURCE_FILE).write_text("{}")  # a complete cached folder: returned without any download
    assert main(["fetch-model", "smollm2", "--cache-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(folder)


def test_fetch_model_rejects_unknown_alias(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["fetch-model", "gpt-17"])
    assert exc.value.code == 2
    assert "invalid choice: 'gpt-17'" in capsys.readouterr().err


def test_ppl_json_matches_library_call(tiny_model, text_file, capsys):
    code = main(["ppl", "--model", str(tiny_model), "--text-file", str(text_file), "--window", "64",
                 "--windows", "3", "--batch-size", "2", "--device", "cpu", "--json", "--no-progress"])
    assert code == 0
    record = json.loads(capsys.readouterr().out)
    model, tokenizer = load_model(tiny_model)
    expected = perplexity(model, tokenizer, SAMPLE_TEXT * 3, window=64, max_windows=3, progress=False)
    assert (record["windows"], record["tokens"]) == (expected.windows, expected.tokens) == (3, 3 * 63)
    assert record["ppl"] == pytest.approx(expected.ppl, rel=1e-5)
    assert (record["dtype"], record["device"], record["window"]) == ("float32", "cpu", 64)


def test_ppl_text_output_and_dtype(tiny_model, text_file, capsys):
    assert main(["ppl", "--model", str(tiny_model), "--text-file", str(text_file), "--window", "128",
                 "--dtype", "bf16", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ppl=") and "windows=3 " in out and "dtype=bfloat16" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--window", "1"], "window must be an int >= 2"),
        (["--window", "100000"], "fewer than one window of 100000 tokens"),
        (["--dtype", "fp8"], "unknown dtype 'fp8'"),
    ],
)
def test_ppl_bad_input_is_one_line_error(tiny_model, text_file, capsys, extra, message):
    code = main(["ppl", "--model", str(tiny_model), "--text-file", str(text_file), "--no-progress", *extra])
    assert code == 1
    assert message in capsys.readouterr().err


def test_ppl_missing_text_file_is_an_error(tiny_model, tmp_path, capsys):
    assert main(["ppl", "--model", str(tiny_model), "--text-file", str(tmp_path / "none.txt")]) == 1
    assert "none.txt" in capsys.readouterr().err


def test_python_dash_m_runs_the_cli(tiny_model, text_file):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "wide_compile", "ppl", "--model", str(tiny_model), "--text-file", str(text_file),
         "--window", "64", "--device", "cpu", "--json", "--no-progress"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["windows"] == len((SAMPLE_TEXT * 3).encode()) // 64 and record["ppl"] > 1.0
