"""``wide_compile.speed`` (compiled dense vs compiled WIDE timing on static KV caches) and ``wide-compile bench``, on
tiny models on the CPU (``aot_eager``): the flow, the weight-sharing twin, the runs' rewind, bad input."""

import json

import pytest
import torch
from _tiny_lm import save_tiny_llama, tiny_llama

import wide_compile
from wide_compile.cli import main as cli_main
from wide_compile.speed import DecodeRun, PrefillRun, dense_and_wide, measure_speed

APPLY = {"ffn_group_size": 16}  # the tiny Llama's 64 FFN channels in 4 groups


def test_measure_speed_times_both_variants_at_every_shape():
    report = measure_speed(tiny_llama(), decode_batches=(1, 2), prompt_lengths=(8,), decode_steps=3, prefill_runs=2,
                           kv_slots=32, progress=False, **APPLY)
    assert [(r["kind"], r["size"]) for r in report.rows] == [("decode", 1), ("decode", 2), ("prefill", 8)]
    for row in report.rows:
        assert row["dense_ms"] > 0 and row["wide_ms"] > 0
        assert 0.2 < row["wide_skip"] < 0.8  # fresh routers skip about half
        assert "skip_rates" not in row["dense"]
    assert report.rows[0]["wide"]["positions"] == [16, 19] and report.rows[2]["dense"]["cache_slots"] == 64
    assert report.settings["inner"] == "aot_eager" and report.settings["mode"] is None  # CPU defaults
    text = str(report)
    assert "dense/WIDE" in text and "TTFT 8 tokens" in text and "decode b=2 per step" in text
    assert "card idle before each call" in text and report.rows[2]["wide"]["ttft_idle"]["n"] == 2
    assert json.loads(json.dumps(report.to_dict(), default=str))["rows"][0]["kind"] == "decode"


def test_dense_and_wide_share_weights_in_every_case(tmp_path):
    model = tiny_llama()
    dense, wide, described = dense_and_wide(model, sparsity=0.5, seed=3, **APPLY)
    assert dense is model and not wide_compile.is_applied(dense) and wide_compile.is_applied(wide)
    assert "random" in described
    wide_tensors = {p.data_ptr() for p in wide.parameters()}
    assert all(p.data_ptr() in wide_tensors for p in dense.parameters())  # one copy of the base weights
    wide_compile.save(wide, tmp_path / "saved")  # routers + their configuration
    _, reloaded, described = dense_and_wide(tiny_llama(), routers=tmp_path / "saved")
    assert described.startswith("trained")
    for a, b in zip(wide_compile.router_parameters(wide), wide_compile.router_parameters(reloaded)):
        assert torch.equal(a, b)
    dense2, wide2, described = dense_and_wide(wide)  # an applied model: it is the WIDE one, the twin is dense
    assert wide2 is wide and wide_compile.is_applied(wide) and not wide_compile.is_applied(dense2)
    ids = torch.randint(0, 200, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(dense2(ids).logits, model(ids).logits)
        assert wide(ids).logits.shape == (1, 6, model.config.vocab_size)  # still runs as WIDE
    with pytest.raises(ValueError, match="already a WIDE model"):
        dense_and_wide(wide, routers=tmp_path / "saved")


def test_runs_rewind_to_the_same_state():
    """A decode step and a prefill give the same logits after their rewind (the cache is positioned in place)."""
    model = tiny_llama()
    with torch.no_grad():
        decode = DecodeRun(model, model, batch=2, slots=24, steps=50)
        assert decode.steps == 24 - 12 - 4  # bounded by the free slots
        decode.rewind()
        first = decode.step(0).logits.clone()
        decode.step(1)
        decode.rewind()
        torch.testing.assert_close(decode.step(0).logits, first)
        prefill = PrefillRun(model, model, length=10)
        prefill.rewind()
        first = prefill.call().logits.clone()
        prefill.rewind()
        torch.testing.assert_close(prefill.call().logits, first)


@pytest.mark.parametrize("kwargs, match", [
    ({"decode_batches": (0,)}, "decode_batches must be positive"),
    ({"prompt_lengths": (4, -1)}, "prompt_lengths must be positive"),
    ({"decode_steps": 0}, "decode_steps and prefill_runs"),
    ({"inner": "tvm"}, "inner must be"),
])
def test_bad_arguments_raise_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        measure_speed(tiny_llama(), progress=False, **{**APPLY, **kwargs})


def test_cli_bench_writes_a_json_report(tmp_path, capsys):
    folder = save_tiny_llama(tmp_path / "tiny")
    out = tmp_path / "bench.json"
    code = cli_main(["bench", "--model", str(folder), "--ffn-group-size", "16", "--decode-batch", "1", "--prefill",
                     "9", "--steps", "2", "--runs", "2", "--kv-slots", "32", "--wide-option",
                     "wide.one_token_routers=reduction", "--out", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    assert [(r["kind"], r["size"]) for r in record["rows"]] == [("decode", 1), ("prefill", 9)]
    assert record["settings"]["wide_options"] == {"wide.one_token_routers": "reduction"}
    assert "dense/WIDE" in capsys.readouterr().out
    wide = wide_compile.apply(tiny_llama(), sparsity=0.5, **APPLY)  # a wide_compile.save() folder: timed as it is
    wide_compile.save(wide, tmp_path / "saved")
    assert cli_main(["bench", "--model", str(tmp_path / "saved"), "--decode-batch", "1", "--prefill", "5", "--steps",
                     "2", "--runs", "2", "--kv-slots", "16", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["settings"]["routers"] == "the model's own"
    with pytest.raises(SystemExit):
        cli_main(["bench", "--model", str(folder), "--decode-batch", "0"])
    with pytest.raises(SystemExit):
        cli_main(["bench", "--model", str(folder), "--wide-option", "fast=1"])


def test_dense_variant_gets_the_wide_backends_inductor_settings(monkeypatch):
    """The dense baseline compiles with the ``wide`` backend's Inductor defaults (combo kernels) and with any Inductor
    setting given for the WIDE variant, so a setting cannot make the baseline slower than it has to be."""
    from wide_compile.backend import inductor_defaults
    from wide_compile.speed import variants

    seen = {}
    monkeypatch.setattr(variants.torch, "compile", lambda model, **kw: seen.update(kw) or model)
    model = torch.nn.Linear(2, 2)
    variants.compile_variant(model, "dense", "reduce-overhead", "inductor", False)
    assert seen["backend"] == "inductor" and "mode" not in seen
    assert seen["options"] == {**inductor_defaults(), "triton.cudagraphs": True}
    variants.compile_variant(model, "dense", None, "inductor", False, {"combo_kernels": False, "wide.rewrite": True})
    assert seen["options"]["combo_kernels"] is False and "wide.rewrite" not in seen["options"]
    seen.clear()
    variants.compile_variant(model, "dense", None, "aot_eager", False)
    assert seen["backend"] == "aot_eager" and "options" not in seen  # debugging backends take no Inductor options
