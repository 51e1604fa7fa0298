"""Quality evaluation of a (possibly WIDE-transformed) model: lm-eval zero-shot tasks, WikiText-2, skip rates.

:func:`evaluate` wraps the model object itself in lm-eval's ``HFLM`` (so routers and dynamic-width hooks
run exactly as in deployment) and runs lm-eval's ``simple_evaluate`` on the local tasks of
:mod:`wide_compile.evaluation.tasks`: lm-eval builds the prompts and computes ``acc`` / ``acc_norm``.
It then adds WikiText-2 test perplexity (:func:`wide_compile.evaluation.perplexity.perplexity`) and, for a
WIDE model, the realized skip rates accumulated over every forward of the evaluation.

Skip rates count every position the model sees; with ``batch_size > 1`` lm-eval right-pads a batch to its
longest request, so padded positions are counted too (``batch_size=1`` gives rates over real tokens only).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from .tasks import TASKS, lm_eval_tasks, require_lm_eval

__all__ = ["DEFAULT_TASKS", "evaluate", "format_results"]

DEFAULT_TASKS: tuple[str, ...] = tuple(TASKS)


def _meter_rates(meters: Sequence[Any]) -> dict | None:
    """Token-weighted per-block skip rates summed over ``meters``; per kind and overall means over blocks."""
    skipped: dict = {}
    total: dict = {}
    for meter in meters:
        for key, count in meter.total.items():
            total[key] = total.get(key, 0) + count
            skipped[key] = skipped.get(key, 0.0) + meter.skipped[key]
    if not total:
        return None
    per_block = {key: skipped[key] / max(1, total[key]) for key in sorted(total)}
    by_kind: dict[str, list[float]] = {}
    for (_, kind), rate in per_block.items():
        by_kind.setdefault(kind, []).append(rate)
    summary: dict[str, Any] = {kind: sum(v) / len(v) for kind, v in by_kind.items()}
    summary["mean"] = sum(summary.values()) / len(summary)
    summary["blocks"] = {f"{layer}.{kind}": rate for (layer, kind), rate in per_block.items()}
    return summary


def _task_rows(raw: dict, names: Sequence[str]) -> dict[str, dict]:
    rows = {}
    for name in names:
        metrics = raw["results"][name]
        counts = raw.get("n-samples", {}).get(name, {})
        row: dict[str, Any] = {"docs": counts.get("effective"), "docs_total": counts.get("original")}
        for metric in ("acc", "acc_norm"):
            value = metrics.get(f"{metric},none")
            stderr = metrics.get(f"{metric}_stderr,none")
            row[metric] = None if value is None else float(value)
            row[f"{metric}_stderr"] = float(stderr) if isinstance(stderr, (int, float)) else None
        rows[name] = row
    return rows


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _check_args(limit: int | float | None, batch_size: int) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0):
        raise ValueError(f"limit must be None or a positive number, got {limit!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")


def evaluate(
    model: torch.nn.Module,
    tokenizer: Any,
    tasks: Sequence[str] = DEFAULT_TASKS,
    limit: int | float | None = None,
    batch_size: int = 16,
    device: str | torch.device | None = None,
    *,
    ppl: bool = True,
    ppl_window: int = 1024,
    ppl_max_windows: int | None = None,
    data_root: str | Path | None = None,
    source: str = "auto",
    print_table: bool = True,
    progress: bool = False,
) -> dict:
    """Zero-shot accuracy (lm-eval), WikiText-2 test perplexity and realized skip rates of ``model``.

    Args:
        model: an HF causal LM, dense or transformed by :func:`wide_compile.apply` (evaluated in eval mode).
        tokenizer: its tokenizer.
        tasks: names from :data:`wide_compile.evaluation.tasks.TASKS` (``[]`` for perplexity only).
        limit: evaluate only the first ``limit`` documents of each task (a float < 1: that fraction).
        batch_size: requests per forward in lm-eval.
        device: move the model there first (default: leave it where it is).
        ppl: also compute WikiText-2 test perplexity.
        ppl_window, ppl_max_windows: window length and number of windows for the perplexity.
        data_root: folder with ``tasks/`` and ``wikitext-2-raw/`` (default: ``wide_compile.data.data_dir()``).
        source: task data source, see :func:`wide_compile.evaluation.tasks.lm_eval_tasks`.
        print_table: print :func:`format_results` of the result.
        progress: show progress bars of the perplexity.

    Returns:
        A JSON-serialisable dict: ``tasks`` ({task: acc, acc_stderr, acc_norm, acc_norm_stderr, docs}),
        ``mean_acc`` (mean ``acc``), ``mean_acc_norm`` (mean of ``acc_norm`` where lm-eval reports it, else
        ``acc``), ``ppl`` (or None), ``skip_rates`` (None for a dense model) and ``settings``.

    Raises:
        TaskDataError: a task file is missing or malformed (checked before the model runs).
        ValueError: an unknown task or a bad argument.
    """
    from wide_compile.data import wikitext2_test_text

    _check_args(limit, batch_size)
    task_names = list(dict.fromkeys([tasks] if isinstance(tasks, str) else tasks))
    if not task_names and not ppl:
        raise ValueError("nothing to evaluate: no tasks and ppl=False")
    if task_names:
        require_lm_eval()
    text = wikitext2_test_text(local_dir=data_root) if ppl else None  # fails fast when the text is missing
    if device is not None:
        model = model.to(device)
    was_training = model.training
    model.eval()
    try:
        record = _run(model, tokenizer, task_names, text, limit, batch_size, ppl_window, ppl_max_windows,
                      data_root, source, progress)
    finally:
        model.train(was_training)
    if print_table:
        print(format_results(record))
    return record


def _run(model: torch.nn.Module, tokenizer: Any, task_names: list[str], text: str | None,
         limit: int | float | None, batch_size: int, ppl_window: int, ppl_max_windows: int | None,
         data_root: str | Path | None, source: str, progress: bool) -> dict:
    import wide_compile

    from .perplexity import perplexity

    wide = wide_compile.is_applied(model)
    meters: dict[str, Any] = {}
    record: dict[str, Any] = {"tasks": {}, "mean_acc": None, "mean_acc_norm": None, "ppl": None, "skip_rates": None}
    start = time.perf_counter()
    if task_names:
        import lm_eval
        from lm_eval.models.huggingface import HFLM

        with lm_eval_tasks(task_names, data_root=data_root, source=source) as (manager, names):
            lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
            with _tracking(model, wide, meters, "tasks"):  # bootstrap_iters > 0: closed-form stderr of means
                raw = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=manager, limit=limit,
                                              num_fewshot=0, log_samples=False, bootstrap_iters=1000)
        record["tasks"] = _task_rows(raw, names)
        accs = [row["acc"] for row in record["tasks"].values()]
        norms = [row["acc_norm"] if row["acc_norm"] is not None else row["acc"] for row in record["tasks"].values()]
        record["mean_acc"], record["mean_acc_norm"] = _mean(accs), _mean(norms)
    if text is not None:
        with _tracking(model, wide, meters, "wikitext2"):
            result = perplexity(model, tokenizer, text, window=ppl_window, max_windows=ppl_max_windows,
                                progress=progress)
        record["ppl"] = {"wikitext2": result.ppl, "nll": result.nll, "tokens": result.tokens,
                         "windows": result.windows, "window": ppl_window}
    if wide:
        record["skip_rates"] = _meter_rates(list(meters.values()))
        record["skip_rates_by_phase"] = {phase: _meter_rates([m]) for phase, m in meters.items()}
    param = next(model.parameters())
    record["settings"] = {
        "limit": limit, "batch_size": batch_size, "device": str(param.device),
        "dtype": str(param.dtype).removeprefix("torch."), "num_fewshot": 0,
        "lm_eval_version": _version("lm_eval"),
        "wide_config": wide_compile.config_of(model).to_dict() if wide else None,
        "seconds": round(time.perf_counter() - start, 3),
    }
    return record


@contextlib.contextmanager
def _tracking(model: torch.nn.Module, wide: bool, meters: dict, phase: str) -> Iterator[None]:
    """``wide_compile.track_skip_rates`` for a WIDE model (its meter stored as ``meters[phase]``)."""
    if not wide:
        yield
        return
    import wide_compile

    with wide_compile.track_skip_rates(model) as meter:
        meters[phase] = meter
        yield


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_results(record: dict) -> str:
    """A plain-text table of :func:`evaluate`'s result."""
    lines = [f"{'task':<15}{'docs':>7}{'acc':>9}{'acc_norm':>10}"]
    for name, row in record["tasks"].items():
        lines.append(f"{name:<15}{row['docs'] or '-':>7}{_fmt(row['acc']):>9}{_fmt(row['acc_norm']):>10}")
    if record["tasks"]:
        lines.append(f"{'mean':<15}{'':>7}{_fmt(record['mean_acc']):>9}{_fmt(record['mean_acc_norm']):>10}"
                     "   (acc_norm column: acc where lm-eval reports no acc_norm)")
    if record["ppl"] is not None:
        p = record["ppl"]
        lines.append(f"wikitext2 ppl   {p['wikitext2']:.4f}  ({p['windows']} windows x {p['window']} tokens)")
    rates = record.get("skip_rates")
    if rates is not None:
        kinds = "  ".join(f"{k}={rates[k]:.4f}" for k in ("attention", "mlp") if k in rates)
        lines.append(f"skip rates      {kinds}  mean={rates['mean']:.4f}")
    return "\n".join(lines)
