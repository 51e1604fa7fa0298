"""Router training (wide_compile.train): stages, loss, schedules, data, exact resume, CLI — on tiny models."""

from __future__ import annotations

import copy
import json
import math
import random

import pytest
import torch

import wide_compile
from _tiny_lm import byte_tokenizer, save_tiny_llama
from wide_compile.cli import main
from wide_compile.testing.tiny_models import tiny_model
from wide_compile.training import TrainConfig, train
from wide_compile.training.data_sources import resolve_sources
from wide_compile.training.loss import SkipTargets, realized_skip_rates, skip_penalty
from wide_compile.training.lora import lora_target_modules
from wide_compile.training.schedules import lr_multiplier, temperature_at
from wide_compile.training.sequences import BatchOrder, build_sequences

WORDS = "the quick brown fox jumps over a lazy dog while five wizards box and vex a jolly queen".split()


pytestmark = pytest.mark.usefixtures("one_thread")


def _write_jsonl(path, n_docs, seed, words_per_doc=(20, 90), tag=""):
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(n_docs):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(*words_per_doc)))
            f.write(json.dumps({"text": f"{tag}{i} {words}", "id": i}) + "\n")
    return path


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train_data")
    return [str(_write_jsonl(folder / "a.jsonl", 40, 0, tag="A")),
            str(_write_jsonl(folder / "b.jsonl", 30, 1, tag="B"))]


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


_TEMPLATES: dict[int, torch.nn.Module] = {}


def wide_tiny(tokenizer, ffn_group_size=32, router_seed=None):
    """A copy of the same tiny WIDE Llama (vocabulary fitted to the byte tokenizer); new routers if seeded."""
    if ffn_group_size not in _TEMPLATES:  # apply() captures the graph once per layout (slow part)
        model = tiny_model("llama", seed=0)
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        _TEMPLATES[ffn_group_size] = wide_compile.apply(model, sparsity=0.5, ffn_group_size=ffn_group_size)
    model = copy.deepcopy(_TEMPLATES[ffn_group_size])
    if router_seed is not None:
        torch.manual_seed(router_seed)
        for router in wide_compile.routers(model):
            router.reset_parameters()
    return model


def small(data_files, **overrides):
    base = dict(stage=1, steps=4, seq_len=32, batch_size=2, data=data_files, progress=False, eval_batches=1)
    return TrainConfig(**{**base, **overrides})


def router_state(model):
    return {k: v.clone() for k, v in model.state_dict().items() if ".wide_routers." in k}


# --------------------------------------------------------------------------- schedules


def test_temperature_is_linear_from_start_to_end():
    values = [temperature_at(s, 10, 5.0, 0.5) for s in range(10)]
    assert values[0] == 5.0 and values[-1] == 0.5
    assert all(math.isclose(b - a, -0.5) for a, b in zip(values, values[1:]))
    assert temperature_at(0, 1, 5.0, 0.5) == 0.5  # a one-step run uses the final temperature


def test_lr_has_linear_warmup_then_cosine_to_zero():
    total = 20  # warm-up: round(0.1 * 20) = 2 steps
    values = [lr_multiplier(s, total, 0.1) for s in range(total)]
    assert values[:3] == [0.5, 1.0, 1.0]
    for s in range(2, total):
        assert math.isclose(values[s], 0.5 * (1 + math.cos(math.pi * (s - 2) / 18)))
    assert all(b < a for a, b in zip(values[2:], values[3:]))
    assert lr_multiplier(0, 10, 0.0) == 1.0


def test_training_applies_both_schedules(tokenizer, data_files):
    result = train(wide_tiny(tokenizer), tokenizer, small(data_files, steps=10, lr=1e-3))
    assert [row["step"] for row in result.history] == list(range(1, 11))
    for index, row in enumerate(result.history):
        assert math.isclose(row["tau"], temperature_at(index, 10, 5.0, 0.5))
        assert math.isclose(row["lr"], 1e-3 * lr_multiplier(index, 10, 0.1))


# --------------------------------------------------------------------------- loss


def test_skip_penalty_mean_and_separate_targets():
    rates = {"attention": torch.tensor(0.2), "mlp": torch.tensor(0.6), "mean": torch.tensor(0.4)}
    assert math.isclose(float(skip_penalty(rates, SkipTargets(0.5))), 0.1, abs_tol=1e-6)
    separate = SkipTargets(0.5, attention=0.3, mlp=0.7)
    assert math.isclose(float(skip_penalty(rates, separate)), (0.1 + 0.1) / 2, abs_tol=1e-6)


def test_realized_skip_rates_leave_out_padding(tokenizer):
    model = wide_tiny(tokenizer)
    ids = torch.randint(0, 200, (2, 6))
    token_mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])

    def decisions(block, shape):  # real tokens: all groups execute; padding: all skip
        return token_mask[..., None].expand(shape).float()

    with torch.no_grad(), wide_compile.forced(model, decisions):
        model(input_ids=ids)
    assert float(realized_skip_rates(model)["mean"]) == pytest.approx(2 / 12)  # padding counted
    masked = realized_skip_rates(model, token_mask)
    assert {k: float(v) for k, v in masked.items()} == {"attention": 0.0, "mlp": 0.0, "mean": 0.0}


# --------------------------------------------------------------------------- stages


def test_stage1_trains_only_the_routers(tokenizer, data_files):
    model = wide_tiny(tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = train(model, tokenizer, small(data_files))
    assert result.model is model and not model.training
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed, "no parameter changed"
    assert all(".wide_routers." in k for k in changed), sorted(changed)[:3]
    assert len(changed) == len(router_state(model))  # every router tensor moved
    assert result.steps == 4 and result.tokens == 4 * 2 * 32 and result.tokens_per_second > 0
    val = result.validation
    assert val is not None and math.isfinite(val["ce"]) and 0.0 <= val["skip_mean"] <= 1.0


@pytest.mark.parametrize("target", [0.85, 0.15])
def test_skip_loss_moves_the_realized_rate_to_the_target(tokenizer, data_files, target):
    result = train(wide_tiny(tokenizer), tokenizer, small(data_files, steps=40, lr=2e-2, target_sparsity=target))
    rates = [row["skip_mean"] for row in result.history]
    start, end = sum(rates[:5]) / 5, sum(rates[-5:]) / 5
    assert abs(end - target) < abs(start - target) - 0.2, (start, end)


def test_separate_targets_move_attention_and_mlp_apart(tokenizer, data_files):
    config = small(data_files, steps=40, lr=2e-2, attn_target=0.15, mlp_target=0.85)
    last = train(wide_tiny(tokenizer), tokenizer, config).history[-5:]
    attention = sum(r["skip_attention"] for r in last) / 5
    mlp = sum(r["skip_mlp"] for r in last) / 5
    assert attention < 0.4 < 0.6 < mlp, (attention, mlp)


def test_lora_targets_come_from_the_blueprint(tokenizer):
    llama = wide_compile.apply(tiny_model("llama"), ffn_group_size=32)
    assert lora_target_modules(llama) == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    gpt2 = wide_compile.apply(tiny_model("gpt2"), ffn_group_size=32)
    assert set(lora_target_modules(gpt2)) == {"c_attn", "c_proj", "c_fc"}  # fused qkv


def test_stage2_trains_lora_and_routers_then_merges(tokenizer, data_files, tmp_path):
    pytest.importorskip("peft")
    model = wide_tiny(tokenizer)
    base_before = {k: v.clone() for k, v in model.state_dict().items() if ".wide_routers." not in k}
    routers_before = router_state(model)
    result = train(model, tokenizer, small(data_files, stage=2, lr=1e-2, output_dir=str(tmp_path / "run")))
    merged = result.model
    assert type(merged).__name__ == "LlamaForCausalLM" and wide_compile.is_applied(merged)
    state = merged.state_dict()
    assert not any("lora_" in k for k in state)
    projections = [k for k in base_before if k.endswith(("q_proj.weight", "down_proj.weight"))]
    assert projections and all(not torch.equal(state[k], base_before[k]) for k in projections)  # LoRA merged in
    assert torch.equal(state["model.embed_tokens.weight"], base_before["model.embed_tokens.weight"])
    assert any(not torch.equal(state[k], v) for k, v in routers_before.items())
    # the saved final folder reproduces the merged model exactly (deterministic routers)
    reloaded = wide_compile.load(result.saved_to).eval()
    ids = torch.randint(0, 200, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, merged(ids).logits)


# --------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("stage,mode", [(1, "packed"), (2, "document")])
def test_resume_from_half_way_is_exact(tokenizer, data_files, tmp_path, stage, mode):
    if stage == 2:
        pytest.importorskip("peft")
    config = small(data_files, stage=stage, steps=6, data_mode=mode, checkpoint_every=3, eval_batches=0,
                   output_dir=str(tmp_path / "a"))
    straight = train(wide_tiny(tokenizer), tokenizer, config)
    half = tmp_path / "a" / "checkpoint-3"
    assert half.is_dir() and [p.name for p in straight.checkpoints] == ["checkpoint-3", "checkpoint-6"]
    # a fresh model (other random routers) continues from step 3 to step 6
    resumed = train(wide_tiny(tokenizer, router_seed=1), tokenizer,
                    config.with_updates(output_dir=str(tmp_path / "b"), resume_from=str(half)))
    assert resumed.steps == 6 and len(resumed.history) == 3
    assert [r["loss"] for r in resumed.history] == [r["loss"] for r in straight.history[3:]]
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_resume_refuses_another_layout_or_settings(tokenizer, data_files, tmp_path):
    config = small(data_files, steps=2, checkpoint_every=1, eval_batches=0, output_dir=str(tmp_path / "a"))
    train(wide_tiny(tokenizer), tokenizer, config)
    half = str(tmp_path / "a" / "checkpoint-1")
    other = config.with_updates(output_dir=str(tmp_path / "b"), resume_from=half)
    with pytest.raises(ValueError, match="another model or group layout"):
        train(wide_tiny(tokenizer, ffn_group_size=64), tokenizer, other)
    with pytest.raises(ValueError, match="settings differ.*seq_len"):
        train(wide_tiny(tokenizer), tokenizer, other.with_updates(seq_len=16))
    latest = config.with_updates(resume_from="latest")
    assert train(wide_tiny(tokenizer), tokenizer, latest).history == []  # already at its last step


# --------------------------------------------------------------------------- data


def test_packed_and_document_sequences(tokenizer, data_files):
    sources = resolve_sources(data_files)
    kwargs = dict(seq_len=24, train_sequences=10, val_sequences=4, val_fraction=0.1, seed=0)
    train_set, val_set = build_sequences(sources, tokenizer, mode="packed", **kwargs)
    assert train_set.input_ids.shape == (10, 24) and train_set.attention_mask is None
    assert train_set.per_source == {"a.jsonl": 5, "b.jsonl": 5}  # mixed evenly
    assert len(val_set) == 4
    again, _ = build_sequences(sources, tokenizer, mode="packed", **kwargs)
    assert torch.equal(again.input_ids, train_set.input_ids)  # deterministic
    other, _ = build_sequences(sources, tokenizer, mode="packed", **{**kwargs, "seed": 1})
    assert not torch.equal(other.input_ids, train_set.input_ids)

    docs, _ = build_sequences(sources, tokenizer, mode="document", **{**kwargs, "seq_len": 512})
    batch = docs.batch(torch.arange(len(docs)))
    lengths = batch["attention_mask"].sum(1)
    assert (lengths < 512).all() and (lengths > 2).all()  # short documents, padded
    assert torch.equal(batch["labels"] == -100, batch["attention_mask"] == 0)


def test_packing_joins_documents_with_eos(tokenizer, tmp_path):
    path = tmp_path / "abc.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["aaa", "bbb", "ccc", "ddd", "ee"]))
    rows, _ = build_sequences(resolve_sources([str(path)]), tokenizer, seq_len=4, mode="packed", train_sequences=99,
                              val_sequences=0, val_fraction=0.0, seed=0)
    eos = tokenizer.eos_token_id
    stream = rows.input_ids.flatten().tolist()
    assert len(stream) == 16 and stream.count(eos) == 4  # 3 + 3 + 3 + 3 + 2 + 5 EOS = 19 -> 4 full blocks
    texts = tokenizer.decode(stream).split(tokenizer.eos_token)
    assert set(texts[:3]) <= {"aaa", "bbb", "ccc", "ddd", "ee"} and len(set(texts[:3])) == 3


def test_validation_documents_are_held_out(tokenizer, data_files):
    sources = resolve_sources(data_files)
    train_set, val_set = build_sequences(sources, tokenizer, seq_len=512, mode="document", train_sequences=200,
                                         val_sequences=200, val_fraction=0.1, seed=0)
    def first_words(rows):  # the "A12" / "B7" tag that starts every document
        return {tokenizer.decode(r[m.bool()]).split()[0] for r, m in zip(rows.input_ids, rows.attention_mask)}

    train_ids, val_ids = first_words(train_set), first_words(val_set)
    assert len(val_ids) == 4 + 3  # round(10% of 40) + round(10% of 30) documents
    assert not train_ids & val_ids and len(train_ids) == 36 + 27


def test_batch_order_is_a_reshuffle_per_epoch_and_resumable():
    order = BatchOrder(5, 2, seed=3)
    rows = torch.cat([order.next_indices() for _ in range(5)]).tolist()
    assert sorted(rows[:5]) == sorted(rows[5:10]) == [0, 1, 2, 3, 4]
    resumed = BatchOrder(5, 2, seed=3, position=4)
    assert torch.cat([resumed.next_indices() for _ in range(3)]).tolist() == rows[4:10]


@pytest.mark.parametrize("content,error,match", [
    (None, FileNotFoundError, "does not exist"),
    ("", ValueError, "is empty"),
    ('{"content": "no text field"}\n', ValueError, "'text' field"),
    ("not json\n", ValueError, "not valid JSON"),
])
def test_bad_data_fails_before_any_compute(tmp_path, content, error, match):
    path = tmp_path / "data.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(error, match=match):
        train(object(), None, steps=1, data=[str(path)])  # the model is never touched


def test_sources_folders_globs_parquet_text_and_hub_names(tmp_path):
    pyarrow_parquet = pytest.importorskip("pyarrow.parquet")
    import pyarrow

    pyarrow_parquet.write_table(pyarrow.table({"text": ["one doc", "two doc"]}), tmp_path / "p.parquet")
    (tmp_path / "t.txt").write_text("line one\nline two\n")
    _write_jsonl(tmp_path / "j.jsonl", 3, 0)
    by_name = {s.name: s for s in resolve_sources([str(tmp_path)])}  # a folder: every supported file
    assert {n: s.kind for n, s in by_name.items()} == {"j.jsonl": "json", "p.parquet": "parquet", "t.txt": "text"}
    assert by_name["p.parquet"].documents() == ["one doc", "two doc"]
    assert by_name["t.txt"].documents() == ["line one", "line two"]
    assert [s.name for s in resolve_sources([str(tmp_path / "*.jsonl")])] == ["j.jsonl"]
    hub = resolve_sources(["allenai/c4:en"])[0]  # not a local path: a hub dataset (read lazily, streaming)
    assert (hub.kind, hub.location, hub.hub_config) == ("hub", "allenai/c4", "en")
    pyarrow_parquet.write_table(pyarrow.table({"body": ["x"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="no 'text' column"):
        resolve_sources([str(tmp_path / "bad.parquet")])
    with pytest.raises(FileNotFoundError, match="matches no supported file"):
        resolve_sources([str(tmp_path / "*.csv")])


def test_data_too_short_for_one_sequence(tokenizer, tmp_path):
    path = tmp_path / "short.jsonl"
    path.write_text(json.dumps({"text": "hi"}) + "\n")
    with pytest.raises(ValueError, match="no sequence of 512 tokens"):
        train(wide_tiny(tokenizer), tokenizer, steps=1, seq_len=512, data=[str(path)], progress=False)


@pytest.mark.parametrize("kwargs,match", [
    (dict(steps=1, tokens=10), "exactly one of steps"),
    (dict(), "exactly one of steps"),
    (dict(steps=1, stage=3), "stage must be 1"),
    (dict(steps=1, attn_target=0.3), "both attn_target and mlp_target"),
    (dict(steps=1, data_mode="chunks"), "data_mode"),
    (dict(steps=1, checkpoint_every=5), "needs output_dir"),
])
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


def test_tokens_become_steps_and_stage_sets_lr():
    config = TrainConfig(tokens=1000, seq_len=32, batch_size=2, grad_accum=2)
    assert config.total_steps == math.ceil(1000 / 128) and config.peak_lr == 2e-3
    assert TrainConfig(stage=2, steps=1).peak_lr == 2e-4
    with pytest.raises(TypeError, match="unknown TrainConfig field"):
        train(None, None, stpes=3)


# --------------------------------------------------------------------------- CLI


def test_cli_train_writes_a_loadable_model(tmp_path, data_files, capsys):
    folder = save_tiny_llama(tmp_path / "tiny")
    out = tmp_path / "run"
    code = main(["train", "--model", str(folder), "--stage", "1", "--sparsity", "0.4", "--steps", "3",
                 "--seq-len", "32", "--batch-size", "2", "--data", *data_files, "--output-dir", str(out),
                 "--ffn-group-size", "16", "--no-progress", "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["tokens"] == 3 * 2 * 32
    model = wide_compile.load(out / "final")
    assert wide_compile.config_of(model).sparsity == 0.4 and wide_compile.config_of(model).ffn_group_size == 16

    pytest.importorskip("peft")  # stage 2 continues from the stage-1 folder: its routers, LoRA on top
    assert main(["train", "--model", str(out / "final"), "--stage", "2", "--steps", "2", "--seq-len", "32",
                 "--batch-size", "2", "--data", *data_files, "--output-dir", str(tmp_path / "run2"),
                 "--no-progress"]) == 0
    assert "stage 2: 2 steps" in capsys.readouterr().out
    stage2 = wide_compile.load(tmp_path / "run2" / "final")
    routers1, routers2 = router_state(model), router_state(stage2)
    assert routers1.keys() == routers2.keys() and any(not torch.equal(routers1[k], routers2[k]) for k in routers1)


def test_cli_train_reports_bad_data(tmp_path, capsys):
    code = main(["train", "--model", "smollm2", "--steps", "1", "--data", str(tmp_path / "missing.jsonl"),
                 "--output-dir", str(tmp_path / "out")])
    assert code == 1
    assert "missing.jsonl" in capsys.readouterr().err
