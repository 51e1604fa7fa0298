"""Zero-shot lm-eval tasks read from local JSONL files (no dataset hub needed).

Each task here is lm-evaluation-harness' own task with only the data source changed: the generated
yaml (``dataset_path: json``, ``dataset_kwargs: {data_files: {<split>: <local file>}}``) carries the same
``doc_to_text`` / ``doc_to_target`` / ``doc_to_choice`` / ``process_docs`` / ``metric_list`` as lm-eval's
yaml, and is registered through lm-eval's ``TaskManager(include_path=...)``, so lm-eval itself builds
the requests and computes ``acc`` / ``acc_norm``.

Splits are the ones pruning papers report (lm-eval defaults): ARC-Easy, ARC-Challenge, OpenBookQA
**test**; BoolQ, PIQA, HellaSwag, WinoGrande **validation**.  Files live in ``<data_dir>/tasks/<task>/
<split>.jsonl`` (``wide_compile.data.data_dir()``, i.e. ``$WIDE_DATA_DIR``), in the HF datasets' schemas
(BoolQ in the ``google/boolq`` schema with ``answer: bool``).  Every file is checked against its schema
before any model runs (:class:`TaskDataError` names the file, line and field).  Metrics are exactly
lm-eval's: BoolQ and WinoGrande report ``acc`` only (lm-eval lists no ``acc_norm`` for them).

Where a hub is reachable and no local data folder exists, ``source="hub"`` (or ``"auto"``) uses
lm-eval's stock tasks of the same names instead.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["TASKS", "TaskDataError", "TaskSpec", "lm_eval_tasks", "require_lm_eval", "task_file", "task_yaml",
           "validate_task_file", "write_task_yamls"]

_SHIM = "wide_task_docs"  # module written next to the generated yamls (lm-eval resolves !function there)
_SHIM_SOURCE = "from wide_compile.evaluation.task_docs import *  # noqa: F401,F403\n"


class TaskDataError(ValueError):
    """A task file is missing or does not have the schema its task needs."""


@dataclass(frozen=True)
class Function:
    """A ``!function`` reference to :mod:`wide_compile.evaluation.task_docs` in a generated yaml.

    It goes through a one-line module written next to the yamls, since every lm-eval 0.4 release resolves
    ``!function module.name`` relative to the yaml's folder."""

    name: str

    def yaml(self) -> str:
        return f"!function {_SHIM}.{self.name}"


Check = Callable[[dict], str | None]  # returns an error message for a bad row, else None


@dataclass(frozen=True)
class TaskSpec:
    """One local task: where its file is, what a row must contain, and lm-eval's config for it."""

    name: str  #: lm-eval task name (same as lm-eval's own task)
    split: str  #: "test" or "validation"
    fields: dict[str, type | tuple[type, ...]]  #: required top-level keys and their JSON types
    config: dict[str, Any]  #: lm-eval task fields copied from lm-eval's yaml
    metrics: tuple[str, ...]  #: metrics lm-eval reports for it
    checks: tuple[Check, ...] = field(default=())  #: row checks beyond field types

    @property
    def relative_path(self) -> str:
        return f"tasks/{self.name}/{self.split}.jsonl"


def _choices_check(key: str, strip: bool = False) -> Check:
    def check(row: dict) -> str | None:
        choices = row["choices"]
        if not isinstance(choices, dict) or not isinstance(choices.get("text"), list) \
                or not isinstance(choices.get("label"), list):
            return "'choices' must be an object with lists 'text' and 'label'"
        if len(choices["text"]) != len(choices["label"]) or not choices["text"]:
            return "'choices.text' and 'choices.label' must be non-empty lists of the same length"
        if not all(isinstance(text, str) for text in choices["text"]):
            return "'choices.text' must hold strings"
        answer = row[key].lstrip() if strip else row[key]
        if answer not in choices["label"]:
            return f"{key}={row[key]!r} is not one of choices.label {choices['label']}"
        return None

    return check


def _int_label_check(key: str, n_choices: Callable[[dict], int]) -> Check:
    def check(row: dict) -> str | None:
        value = row[key]
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.isdigit())):
            return f"{key}={value!r} must be an integer (or a string of digits)"
        if not 0 <= int(value) < n_choices(row):
            return f"{key}={value!r} is out of range for {n_choices(row)} choices"
        return None

    return check


def _winogrande_check(row: dict) -> str | None:
    if "_" not in row["sentence"]:
        return "'sentence' has no '_' blank"
    if row["answer"] not in ("1", "2"):
        return f"answer={row['answer']!r} must be '1' or '2'"
    return None


def _hellaswag_endings(row: dict) -> str | None:
    endings = row["endings"]
    if not endings or not all(isinstance(e, str) for e in endings):
        return "'endings' must be a non-empty list of strings"
    return None


_ACC = ({"metric": "acc", "aggregation": "mean", "higher_is_better": True},)
_ACC_NORM = _ACC + ({"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},)
_ARC = {  # lm-eval tasks/arc/arc_easy.yaml (arc_challenge includes it)
    "doc_to_text": "Question: {{question}}\nAnswer:",
    "doc_to_target": "{{choices.label.index(answerKey)}}",
    "doc_to_choice": "{{choices.text}}",
    "metric_list": _ACC_NORM,
}
_ARC_FIELDS = {"question": str, "choices": dict, "answerKey": str}

TASKS: dict[str, TaskSpec] = {
    spec.name: spec for spec in (
        TaskSpec("arc_easy", "test", _ARC_FIELDS, _ARC, ("acc", "acc_norm"), (_choices_check("answerKey"),)),
        TaskSpec("arc_challenge", "test", _ARC_FIELDS, _ARC, ("acc", "acc_norm"), (_choices_check("answerKey"),)),
        TaskSpec(  # lm-eval tasks/openbookqa/openbookqa.yaml
            "openbookqa", "test", {"question_stem": str, "choices": dict, "answerKey": str},
            {"doc_to_text": "question_stem", "doc_to_target": "{{choices.label.index(answerKey.lstrip())}}",
             "doc_to_choice": "{{choices.text}}", "metric_list": _ACC_NORM},
            ("acc", "acc_norm"), (_choices_check("answerKey", strip=True),)),
        TaskSpec(  # lm-eval tasks/super_glue/boolq/default.yaml (data: google/boolq schema)
            "boolq", "validation", {"question": str, "passage": str, "answer": bool},
            {"process_docs": Function("boolq_process_docs"),
             "doc_to_text": "{{passage}}\nQuestion: {{question}}?\nAnswer:", "doc_to_target": "label",
             "doc_to_choice": ["no", "yes"], "metric_list": ({"metric": "acc"},)},
            ("acc",)),
        TaskSpec(  # lm-eval tasks/piqa/piqa.yaml
            "piqa", "validation", {"goal": str, "sol1": str, "sol2": str, "label": int},
            {"doc_to_text": "Question: {{goal}}\nAnswer:", "doc_to_target": "label",
             "doc_to_choice": "{{[sol1, sol2]}}", "metric_list": _ACC_NORM},
            ("acc", "acc_norm"), (_int_label_check("label", lambda row: 2),)),
        TaskSpec(  # lm-eval tasks/hellaswag/hellaswag.yaml + utils.py
            "hellaswag", "validation",
            {"activity_label": str, "ctx_a": str, "ctx_b": str, "endings": list, "label": (str, int)},
            {"process_docs": Function("hellaswag_process_docs"), "doc_to_text": "{{query}}",
             "doc_to_target": "{{label}}", "doc_to_choice": "choices", "metric_list": _ACC_NORM},
            ("acc", "acc_norm"), (_hellaswag_endings, _int_label_check("label", lambda row: len(row["endings"])))),
        TaskSpec(  # lm-eval tasks/winogrande/default.yaml + preprocess_winogrande.py
            "winogrande", "validation", {"sentence": str, "option1": str, "option2": str, "answer": str},
            {"doc_to_text": Function("winogrande_doc_to_text"), "doc_to_target": Function("winogrande_doc_to_target"),
             "doc_to_choice": Function("winogrande_doc_to_choice"), "metric_list": _ACC},
            ("acc",), (_winogrande_check,)),
    )
}


def _spec(name: str) -> TaskSpec:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[name]


def task_file(name: str, data_root: str | Path | None = None) -> Path:
    """``<data_root>/tasks/<name>/<split>.jsonl`` (``data_root`` defaults to ``wide_compile.data.data_dir()``)."""
    spec = _spec(name)
    if data_root is None:
        from wide_compile.data import data_dir

        data_root = data_dir()
        if data_root is None:
            raise TaskDataError(
                f"no local data folder for task {name!r}: set WIDE_DATA_DIR to a folder containing "
                f"{spec.relative_path} (or use source='hub' where a dataset hub is reachable)"
            )
    return Path(data_root).expanduser() / spec.relative_path


def _type_name(types: type | tuple[type, ...]) -> str:
    names = {str: "string", int: "integer", bool: "boolean", dict: "object", list: "list"}
    return " or ".join(names.get(t, t.__name__) for t in (types if isinstance(types, tuple) else (types,)))


def _row_error(spec: TaskSpec, row: Any) -> str | None:
    if not isinstance(row, dict):
        return f"expected a JSON object, got {type(row).__name__}"
    missing = [k for k in spec.fields if k not in row]
    if missing:
        return f"missing field(s) {missing} (a {spec.name} row needs {sorted(spec.fields)})"
    for key, types in spec.fields.items():
        value = row[key]
        wrong_bool = isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,))
        if wrong_bool or not isinstance(value, types):
            return f"field {key!r} must be of type {_type_name(types)}, got {type(value).__name__} {value!r:.60}"
    for check in spec.checks:
        message = check(row)
        if message:
            return message
    return None


def validate_task_file(name: str, path: str | Path) -> int:
    """Check every row of a task file against the task's schema; returns the number of documents.

    Raises:
        TaskDataError: the file is missing, empty, not JSON lines, or a row lacks / mistypes a field.
    """
    spec, path = _spec(name), Path(path)
    if not path.is_file():
        raise TaskDataError(f"task {name!r}: data file {path} not found (expected the {spec.split} split as "
                            f"JSON lines with fields {sorted(spec.fields)})")
    count = 0
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskDataError(f"task {name!r}: {path} line {number} is not valid JSON: {exc}") from None
            error = _row_error(spec, row)
            if error:
                raise TaskDataError(f"task {name!r}: {path} line {number}: {error}")
            count += 1
    if count == 0:
        raise TaskDataError(f"task {name!r}: {path} has no documents")
    return count


def _yaml_value(value: Any) -> str:
    if isinstance(value, Function):
        return value.yaml()
    return json.dumps(value if not isinstance(value, tuple) else list(value), ensure_ascii=False)  # JSON is YAML


def task_yaml(name: str, path: str | Path) -> str:
    """The lm-eval yaml of local task ``name`` reading ``path``."""
    spec = _spec(name)
    config = {
        "task": spec.name,
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {spec.split: str(Path(path).resolve())}},
        "output_type": "multiple_choice",
        "training_split": None,
        "validation_split": spec.split if spec.split == "validation" else None,
        "test_split": spec.split if spec.split == "test" else None,
        **spec.config,
        "metadata": {"version": 1.0, "source": "wide_compile local task file"},
    }
    return "".join(f"{key}: {_yaml_value(value)}\n" for key, value in config.items())


def write_task_yamls(names: Sequence[str], folder: str | Path, data_root: str | Path | None = None) -> list[Path]:
    """Validate the task files of ``names`` and write one lm-eval yaml per task into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        path = task_file(name, data_root)
        validate_task_file(name, path)
        out = folder / f"wide_local_{name}.yaml"
        out.write_text(task_yaml(name, path), encoding="utf-8")
        written.append(out)
    (folder / f"{_SHIM}.py").write_text(_SHIM_SOURCE, encoding="utf-8")
    return written


def require_lm_eval() -> None:
    """Raise a clear ImportError when lm-evaluation-harness is not installed."""
    try:
        import lm_eval  # noqa: F401
    except ImportError as exc:
        raise ImportError("task evaluation needs lm-evaluation-harness: pip install 'wide-compile[eval]' "
                          "(or pip install lm-eval)") from exc


def _check_names(names: Sequence[str]) -> list[str]:
    if isinstance(names, str):
        names = [names]
    names = list(dict.fromkeys(names))
    if not names:
        raise ValueError("no tasks given")
    for name in names:
        _spec(name)
    return names


@contextlib.contextmanager
def lm_eval_tasks(names: Sequence[str], data_root: str | Path | None = None,
                  source: str = "auto") -> Iterator[tuple[Any, list[str]]]:
    """An lm-eval ``TaskManager`` that knows ``names``, and the task names to pass to lm-eval.

    Args:
        names: task names from :data:`TASKS`.
        data_root: folder holding ``tasks/<task>/<split>.jsonl`` (default: ``wide_compile.data.data_dir()``).
        source: ``"local"`` (files; validated here, before any model runs), ``"hub"`` (lm-eval's stock tasks,
            needs a dataset hub) or ``"auto"`` (local when a data folder exists, else hub).
    """
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    names = _check_names(names)
    if source not in ("auto", "local", "hub"):
        raise ValueError(f"source must be 'auto', 'local' or 'hub', got {source!r}")
    if source == "auto":
        from wide_compile.data import data_dir

        source = "local" if (data_root is not None or data_dir() is not None) else "hub"
    if source == "hub":
        yield TaskManager(), names
        return
    with tempfile.TemporaryDirectory(prefix="wide_compile_tasks_") as folder:
        write_task_yamls(names, folder, data_root)
        yield TaskManager(include_path=folder, include_defaults=False), names
