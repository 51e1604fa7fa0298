"""wide_compile.testing: the user-facing checks and the ``pytest --wide-model`` plugin."""

import subprocess
import sys

import torch

import wide_compile
from wide_compile.testing import check_all_execute, check_forced_masks, prepare, verify
from wide_compile.testing.tiny_models import tiny_model


def test_verify_passes_on_a_supported_family():
    report = verify(tiny_model("phi3"), ffn_group_size=32)
    assert report.ok, str(report)
    assert len(report.results) == 4


def test_checks_detect_a_broken_transformation():
    base, wide = prepare(tiny_model("llama"), ffn_group_size=32)
    with torch.no_grad():
        wide.model.layers[0].self_attn.o_proj.weight.mul_(1.5)  # the copy now differs from the base
    assert not check_all_execute(base, wide).passed
    block = wide_compile.state.get_state(wide).blocks[0]
    block.group_width //= 2  # masks applied to the wrong channels
    try:
        result = check_forced_masks(wide)
        assert not result.passed and "raised" in result.detail
    finally:
        block.group_width *= 2
    assert check_forced_masks(wide).passed


def test_pytest_plugin_runs_the_checks_on_a_saved_model(tmp_path):
    model_dir = tmp_path / "model"
    tiny_model("qwen3").save_pretrained(model_dir)
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--wide-model", str(model_dir),
         "--wide-ffn-group-size", "32", str(empty)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "4 passed" in proc.stdout
