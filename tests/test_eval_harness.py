"""lm-eval evaluation: local task files, schema errors, equality with lm-eval's own path, skip rates, CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

import torch  # noqa: E402

import wide_compile  # noqa: E402
from _tiny_lm import SAMPLE_TEXT, byte_tokenizer, save_tiny_llama, tiny_llama  # noqa: E402
from wide_compile.cli import main  # noqa: E402
from wide_compile.evaluation import perplexity  # noqa: E402
import wide_compile  # noqa: E402
from wide_compile.evaluation.harness import evaluate  # noqa: E402
from wide_compile.evaluation.lm_eval_reference import reference_evaluate, stock_tasks  # noqa: E402
from wide_compile.evaluation.tasks import TASKS, TaskDataError, lm_eval_tasks, task_file  # noqa: E402

DOCS = 6
WORDS = "the a cat dog sun rain water stone tree river red blue small large quick slow runs falls grows".split()


def _phrase(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _doc(name: str, rng: random.Random, i: int) -> dict:
    """One synthetic document of task ``name`` in the local (HF) schema."""
    labels = ["A", "B", "C", "D"]
    choices = {"text": [_phrase(rng, rng.randint(1, 4)) for _ in labels], "label": labels}
    if name in ("arc_easy", "arc_challenge"):
        return {"id": f"q{i}", "question": _phrase(rng, 6) + "?", "choices": choices, "answerKey": rng.choice(labels)}
    if name == "openbookqa":
        return {"id": f"q{i}", "question_stem": _phrase(rng, 6), "choices": choices, "answerKey": rng.choice(labels)}
    if name == "boolq":
        return {"question": _phrase(rng, 5), "answer": rng.random() < 0.5, "passage": _phrase(rng, 20)}
    if name == "piqa":
        return {"goal": _phrase(rng, 5), "sol1": _phrase(rng, 4), "sol2": _phrase(rng, 4), "label": rng.randint(0, 1)}
    if name == "hellaswag":  # bracket artifacts and a lower-case ctx_b exercise lm-eval's preprocessing
        return {"ind": i, "activity_label": "Making tea", "ctx_a": _phrase(rng, 5) + " [title] step.",
                "ctx_b": _phrase(rng, 2), "endings": [_phrase(rng, 3) + " [header]" for _ in range(4)],
                "label": str(rng.randint(0, 3))}
    if name == "winogrande":
        return {"sentence": f"{_phrase(rng, 3)} _ {_phrase(rng, 4)}.", "option1": "cat", "option2": "dog",
                "answer": rng.choice(["1", "2"])}
    raise KeyError(name)


def write_data_root(root: Path, docs: int = DOCS) -> Path:
    """Tiny files for every task plus a WikiText-2 stand-in, laid out like ``$WIDE_DATA_DIR``."""
    rng = random.Random(0)
    for name in TASKS:
        path = task_file(name, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(_doc(name, rng, i)) + "\n" for i in range(docs)), encoding="utf-8")
    wiki = root / "wikitext-2-raw" / "wiki.test.raw"
    wiki.parent.mkdir(parents=True)
    wiki.write_text(SAMPLE_TEXT * 4, encoding="utf-8")
    c4 = root / "c4" / "c4_train00000_first1000.jsonl"  # calibration text of the static width baseline
    c4.parent.mkdir(parents=True)
    c4.write_text("".join(json.dumps({"text": SAMPLE_TEXT * (i + 1)}) + "\n" for i in range(3)), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return write_data_root(tmp_path_factory.mktemp("eval_data"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("eval_model") / "tiny", seed=3)


def test_prompts_equal_lm_eval_stock_yamls(data_root):
    """Every document gets the same context, choices and target as lm-eval's own task yaml gives it."""
    names = list(TASKS)
    with lm_eval_tasks(names, data_root=data_root) as (ours_tm, _), stock_tasks(names, data_root) as (stock_tm, _):
        ours, stock = ours_tm.load(names)["tasks"], stock_tm.load(names)["tasks"]
        for name in names:
            a, b = list(ours[name].eval_docs), list(stock[name].eval_docs)
            assert len(a) == len(b) == DOCS, name
            for x, y in zip(a, b):
                view_a = (ours[name].doc_to_text(x), ours[name].doc_to_choice(x), ours[name].doc_to_target(x))
                view_b = (stock[name].doc_to_text(y), stock[name].doc_to_choice(y), stock[name].doc_to_target(y))
                assert view_a == view_b, name
            assert ours[name].config.metric_list == stock[name].config.metric_list, name
    hellaswag = ours["hellaswag"]
    doc = next(iter(hellaswag.eval_docs))
    assert "[" not in hellaswag.doc_to_text(doc) and ". step." in hellaswag.doc_to_text(doc)


def test_accuracy_equals_lm_eval_simple_evaluate(data_root, model_dir):
    """Our HFLM(model object) + local yamls == lm-eval's simple_evaluate(model="hf") + its stock yamls."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    names = list(TASKS)
    ours = evaluate(model, tokenizer, tasks=names, batch_size=4, ppl=False, data_root=data_root, print_table=False)
    reference = reference_evaluate(model_dir, names, batch_size=4, data_root=data_root)
    for name in names:
        row = ours["tasks"][name]
        assert row["docs"] == DOCS
        assert (row["acc"], row["acc_norm"]) == (reference[name]["acc"], reference[name]["acc_norm"]), name
        assert row["acc"] is not None and (row["acc_norm"] is None) == (TASKS[name].metrics == ("acc",))
        assert row["acc_stderr"] > 0 or row["acc"] in (0.0, 1.0)  # closed-form stderr of the mean
    assert ours["mean_acc"] == pytest.approx(sum(ours["tasks"][n]["acc"] for n in names) / len(names))
    assert ours["skip_rates"] is None and ours["ppl"] is None


def test_wide_model_reports_skip_rates_and_ppl(data_root):
    model = wide_compile.apply(tiny_llama(seed=1), sparsity=0.5, ffn_group_size=16, budget="topk")
    record = evaluate(model, byte_tokenizer(), tasks=["piqa", "winogrande"], limit=3, batch_size=2,
                      ppl_window=64, data_root=data_root, print_table=False)
    assert [record["tasks"][t]["docs"] for t in ("piqa", "winogrande")] == [3, 3]
    rates = record["skip_rates"]
    # top-k keeps exactly half of the groups of every block for every token
    assert rates["attention"] == rates["mlp"] == rates["mean"] == 0.5
    assert set(rates["blocks"]) == {"0.attention", "0.mlp", "1.attention", "1.mlp"}
    assert set(record["skip_rates_by_phase"]) == {"tasks", "wikitext2"}
    ppl = perplexity(model, byte_tokenizer(), SAMPLE_TEXT * 4, window=64,
                     progress=False)
    assert record["ppl"]["wikitext2"] == pytest.approx(ppl.ppl) and record["ppl"]["windows"] == ppl.windows
    assert record["settings"]["wide_config"]["budget"] == "topk"


def _fail(*args):
    raise AssertionError("the model ran before the task files were checked")


def _rows(data_root: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in task_file(name, data_root).read_text().splitlines()]


def _corrupt(root: Path, source: Path, name: str, edit) -> Path:
    write_data_root(root)
    rows = _rows(source, name)
    text = edit(rows)
    task_file(name, root).write_text(text if isinstance(text, str) else "".join(json.dumps(r) + "\n" for r in text))
    return root


@pytest.mark.parametrize(
    ("name", "edit", "message"),
    [
        ("piqa", lambda rows: [{k: v for k, v in r.items() if k != "sol2"} for r in rows],
         r"missing field\(s\) \['sol2'\]"),
        ("piqa", lambda rows: [{**r, "label": "first"} for r in rows], "field 'label' must be of type integer"),
        ("piqa", lambda rows: [{**r, "label": 2} for r in rows], "out of range for 2 choices"),
        ("boolq", lambda rows: [{**r, "answer": 1} for r in rows], "field 'answer' must be of type boolean"),
        ("arc_easy", lambda rows: [{**r, "answerKey": "E"} for r in rows], "answerKey='E' is not one of"),
        ("winogrande", lambda rows: [{**r, "sentence": "no blank"} for r in rows], "has no '_' blank"),
        ("hellaswag", lambda rows: [{**r, "label": ""} for r in rows], "must be an integer"),
        ("openbookqa", lambda rows: "{not json\n", "line 1 is not valid JSON"),
        ("arc_challenge", lambda rows: "\n", "has no documents"),
    ],
)
def test_bad_task_file_is_reported_before_the_model_runs(tmp_path, data_root, name, edit, message):
    root = _corrupt(tmp_path / "data", data_root, name, edit)
    model = tiny_llama()
    model.register_forward_pre_hook(_fail)
    with pytest.raises(TaskDataError, match=message) as info:
        evaluate(model, byte_tokenizer(), tasks=["arc_easy", name], data_root=root, ppl=False, print_table=False)
    assert str(task_file(name, root)) in str(info.value) and repr(name) in str(info.value)


def test_missing_task_file_and_unknown_task(tmp_path, data_root):
    with pytest.raises(TaskDataError, match=r"data file .*tasks/piqa/validation.jsonl not found"):
        evaluate(tiny_llama(), byte_tokenizer(), tasks=["piqa"], data_root=tmp_path, ppl=False)
    with pytest.raises(ValueError, match="unknown task 'mmlu'; known tasks: arc_easy"):
        evaluate(tiny_llama(), byte_tokenizer(), tasks=["mmlu"], data_root=data_root, ppl=False)
    with pytest.raises(ValueError, match="limit must be None or a positive number"):
        evaluate(tiny_llama(), byte_tokenizer(), tasks=["piqa"], limit=0, data_root=data_root)
    with pytest.raises(ValueError, match="nothing to evaluate"):
        evaluate(tiny_llama(), byte_tokenizer(), tasks=[], ppl=False, data_root=data_root)


def test_cli_eval_dense_and_wide_folder(tmp_path, data_root, model_dir, capsys):
    out = tmp_path / "dense.json"
    args = ["--tasks", "piqa,boolq", "--limit", "3", "--batch-size", "2", "--data-dir", str(data_root),
            "--ppl-window", "64", "--ppl-windows", "2", "--device", "cpu"]
    assert main(["eval", "--model", str(model_dir), *args, "--out", str(out)]) == 0
    dense = json.loads(out.read_text())
    assert "piqa" in capsys.readouterr().out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    direct = evaluate(model, tokenizer, tasks=["piqa", "boolq"], limit=3, batch_size=2, ppl_window=64,
                      ppl_max_windows=2, data_root=data_root, print_table=False)
    assert dense["tasks"] == direct["tasks"] and dense["ppl"] == pytest.approx(direct["ppl"])
    assert dense["skip_rates"] is None and dense["settings"]["wide_folder"] is False

    wide_dir = tmp_path / "wide"
    wide_compile.save(wide_compile.apply(model, sparsity=0.5, ffn_group_size=32, budget="topk"), wide_dir)
    out = tmp_path / "wide.json"
    assert main(["eval", "--model", str(wide_dir), "--tokenizer", str(model_dir), *args, "--out", str(out)]) == 0
    wide = json.loads(out.read_text())
    assert wide["settings"]["wide_folder"] is True and wide["skip_rates"]["mean"] == 0.5


def test_cli_eval_static_width_baseline(tmp_path, data_root, model_dir):
    out = tmp_path / "static.json"
    assert main(["eval", "--model", str(model_dir), "--tasks", "piqa", "--limit", "2", "--data-dir", str(data_root),
                 "--no-ppl", "--static-width", "0.5", "--ffn-group-size", "16", "--calibration-samples", "4",
                 "--calibration-seq-len", "32", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    # tiny Llama: 2 head groups (keep 1) and 64 / 16 = 4 FFN groups (keep 2) in every layer, for every token
    assert record["skip_rates"]["attention"] == record["skip_rates"]["mlp"] == 0.5
    assert record["settings"]["wide_config"]["ffn_group_size"] == 16


def test_cli_eval_bad_task_is_one_line_error(data_root, model_dir, capsys):
    code = main(["eval", "--model", str(model_dir), "--tasks", "piqa,nope", "--data-dir", str(data_root), "--no-ppl"])
    assert code == 1
    assert "unknown task 'nope'" in capsys.readouterr().err


def test_forward_is_not_changed_by_evaluation(data_root):
    """evaluate() leaves the model as it found it (eval mode, same outputs)."""
    model = tiny_llama(seed=2)
    ids = torch.randint(0, 200, (1, 12))
    before = model(ids).logits
    evaluate(model, byte_tokenizer(), tasks=["piqa"], limit=2, data_root=data_root, ppl=False, print_table=False)
    torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=0)


def test_evaluate_is_public_api():
    """The issue's entry point ``wide_compile.evaluate`` is the harness (importing it does not load lm-eval)."""
    assert wide_compile.evaluate is evaluate
    assert wide_compile.evaluation.evaluate is evaluate
