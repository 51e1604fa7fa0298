"""lm-eval's *own* evaluation path on local files, to check :func:`wide_compile.evaluation.harness.evaluate`.

The reference tasks are lm-eval's stock task yamls (``include:`` of the installed file, e.g.
``lm_eval/tasks/arc/arc_easy.yaml``) with only the data source replaced by the local JSONL file, and the
model is loaded by lm-eval itself from a HuggingFace folder (``simple_evaluate(model="hf", ...)``).  Nothing
of wide-compile's prompt logic or model wrapping is involved, so equal numbers show that our copied task
configs and our ``HFLM(pretrained=<model object>)`` path match lm-eval.

BoolQ's stock yaml scores the ``super_glue`` field ``label``; the local file has the ``google/boolq`` field
``answer``, so a converted copy (``label = int(answer)``) is what the reference reads.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .tasks import TASKS, task_file, validate_task_file

__all__ = ["STOCK_YAMLS", "reference_evaluate", "stock_task_yaml", "stock_tasks"]

#: lm-eval's task yaml of each task, relative to the installed ``lm_eval/tasks`` folder.
STOCK_YAMLS: dict[str, str] = {
    "arc_easy": "arc/arc_easy.yaml",
    "arc_challenge": "arc/arc_challenge.yaml",
    "openbookqa": "openbookqa/openbookqa.yaml",
    "boolq": "super_glue/boolq/default.yaml",
    "piqa": "piqa/piqa.yaml",
    "hellaswag": "hellaswag/hellaswag.yaml",
    "winogrande": "winogrande/default.yaml",
}


def stock_task_yaml(name: str, data_file: str | Path) -> str:
    """A yaml that includes lm-eval's own yaml of ``name`` and reads ``data_file`` instead of the hub."""
    import lm_eval.tasks

    stock = Path(lm_eval.tasks.__file__).parent / STOCK_YAMLS[name]
    if not stock.is_file():
        raise FileNotFoundError(f"lm-eval's task yaml for {name!r} is not at {stock} (lm-eval layout changed?)")
    split = TASKS[name].split
    override = {
        "include": str(stock), "task": name, "dataset_path": "json", "dataset_name": None,
        "dataset_kwargs": {"data_files": {split: str(Path(data_file).resolve())}},
        "training_split": None, "validation_split": split if split == "validation" else None,
        "test_split": split if split == "test" else None,
    }
    return "".join(f"{key}: {json.dumps(value)}\n" for key, value in override.items())


def _boolq_as_super_glue(source: Path, target: Path) -> Path:
    with source.open(encoding="utf-8") as src, target.open("w", encoding="utf-8") as dst:
        for line in src:
            if line.strip():
                row = json.loads(line)
                dst.write(json.dumps({**row, "label": int(bool(row["answer"]))}) + "\n")
    return target


@contextlib.contextmanager
def stock_tasks(names: Sequence[str], data_root: str | Path | None = None) -> Iterator[tuple[Any, list[str]]]:
    """An lm-eval ``TaskManager`` with lm-eval's stock tasks ``names`` reading the local files."""
    from lm_eval.tasks import TaskManager

    names = list(dict.fromkeys(names))
    with tempfile.TemporaryDirectory(prefix="wide_compile_stock_tasks_") as folder:
        for name in names:
            path = task_file(name, data_root)
            validate_task_file(name, path)
            if name == "boolq":
                path = _boolq_as_super_glue(path, Path(folder) / "boolq_super_glue.jsonl")
            (Path(folder) / f"stock_{name}.yaml").write_text(stock_task_yaml(name, path), encoding="utf-8")
        yield TaskManager(include_path=folder, include_defaults=False), names


def reference_evaluate(model_dir: str | Path, tasks: Sequence[str], limit: int | float | None = None,
                       batch_size: int = 16, device: str = "cpu", dtype: str = "float32",
                       data_root: str | Path | None = None) -> dict[str, dict[str, float | None]]:
    """``{task: {"acc", "acc_norm"}}`` from ``lm_eval.simple_evaluate(model="hf", pretrained=model_dir)``."""
    import lm_eval

    with stock_tasks(tasks, data_root) as (manager, names):
        raw = lm_eval.simple_evaluate(
            model="hf", model_args={"pretrained": str(model_dir), "dtype": dtype}, tasks=names,
            task_manager=manager, limit=limit, num_fewshot=0, batch_size=batch_size, device=device,
            log_samples=False, bootstrap_iters=1000,
        )
    return {name: {m: raw["results"][name].get(f"{m},none") for m in ("acc", "acc_norm")} for name in names}
