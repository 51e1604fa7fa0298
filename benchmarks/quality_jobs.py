"""One job of the quality benchmark: build a pruned model (WIDE / depth skip / static width / dense), train it
if it learns, evaluate it with :func:`wide_compile.evaluate`, and return one JSON-serialisable row.

Every learned method gets the same training tokens (``JobSettings.tokens``): WIDE stage 1 and depth skip
spend them all in stage 1; "WIDE stage 1+2" spends the first half in stage 1 (routers) and the second half
in stage 2 (LoRA + routers, merged before evaluation). Static width and TEAL are calibrated, not trained;
``routers_from`` re-evaluates WIDE stage-1 routers of an earlier run (e.g. GPU-trained routers on the CPU).
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

METHODS = ("dense", "static_width", "wide_s1", "depth_s1", "wide_s12", "teal")
LEARNED = ("wide_s1", "depth_s1", "wide_s12")


@dataclass(frozen=True)
class JobSettings:
    """What every job shares (one benchmark run)."""

    model: str
    tokens: int  # training tokens per learned method
    seq_len: int
    batch_size: int
    seed: int
    tasks: tuple[str, ...]
    limit: int | None
    eval_batch_size: int
    device: str
    out_dir: str
    calibration_samples: int = 128
    calibration_seq_len: int = 512
    ppl_max_windows: int | None = None  # None: the whole WikiText-2 test split
    ppl_window: int = 1024
    ffn_group_size: int = 128  # WIDE and static width (depth skip uses one group per block)
    routers_from: str | None = None  # wide_s1: load <routers_from>/<job> (an earlier run's routers) instead of training


@dataclass(frozen=True)
class Job:
    method: str
    sparsity: float

    @property
    def name(self) -> str:
        return self.method if self.method == "dense" else f"{self.method}_{self.sparsity:g}"


def row_path(settings: JobSettings, job: Job) -> Path:
    return Path(settings.out_dir) / "rows" / f"{job.name}.json"


def _train(model, tokenizer, settings: JobSettings, stage: int, tokens: int, sparsity: float):
    import wide_compile

    result = wide_compile.train(
        model, tokenizer, stage=stage, tokens=tokens, target_sparsity=sparsity, seq_len=settings.seq_len,
        batch_size=settings.batch_size, seed=settings.seed, device=settings.device, progress=False,
        history=False,
    )
    summary = {"stage": stage, "steps": result.steps, "tokens": result.tokens, "seconds": round(result.seconds, 2),
               "tokens_per_second": round(result.tokens_per_second, 1), "last": result.last,
               "validation": result.validation}
    return result.model, summary


def build(job: Job, settings: JobSettings):
    """(model, tokenizer, training summaries) for ``job``, on ``settings.device``."""
    import wide_compile
    from wide_compile.baselines import apply_depth_skip, apply_static_width, apply_teal, calibration_batches
    from wide_compile.model_zoo import load_model

    model, tokenizer = load_model(settings.model, dtype="fp32", device=settings.device)
    training: list[dict] = []
    if job.method in ("static_width", "teal"):  # calibrated on the same C4 windows
        batches = [b.to(settings.device) for b in calibration_batches(
            tokenizer, samples=settings.calibration_samples, seq_len=settings.calibration_seq_len, seed=settings.seed)]
    if job.method == "static_width":
        apply_static_width(model, job.sparsity, batches, ffn_group_size=settings.ffn_group_size)
    elif job.method == "teal":
        apply_teal(model, job.sparsity, batches, seed=settings.seed)
    elif job.method in ("wide_s1", "wide_s12"):
        wide_compile.apply(model, job.sparsity, seed=settings.seed, ffn_group_size=settings.ffn_group_size)
    elif job.method == "depth_s1":
        apply_depth_skip(model, job.sparsity, seed=settings.seed)
    if job.method == "wide_s1" and settings.routers_from:
        folder = Path(settings.routers_from) / job.name
        wide_compile.load_routers(model, folder)
        training.append({"loaded_from": str(folder)})
    elif job.method in ("wide_s1", "depth_s1"):
        model, summary = _train(model, tokenizer, settings, 1, settings.tokens, job.sparsity)
        training.append(summary)
    elif job.method == "wide_s12":
        half = settings.tokens // 2
        model, summary = _train(model, tokenizer, settings, 1, half, job.sparsity)
        training.append(summary)
        model, summary = _train(model, tokenizer, settings, 2, settings.tokens - half, job.sparsity)
        training.append(summary)
    return model, tokenizer, training


def run_job(job: Job, settings: JobSettings) -> dict:
    """Build, train, evaluate; the row is also written to ``<out_dir>/rows/<job>.json`` (errors too)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True  # evaluation in fp32 weights; recorded in the settings
    start = time.perf_counter()
    row: dict = {"job": job.name, "method": job.method, "sparsity": job.sparsity if job.method != "dense" else 0.0}
    try:
        model, tokenizer, training = build(job, settings)
        row["training"] = training
        import wide_compile
        from wide_compile.serialization import write_routers

        if job.method == "wide_s1" and not settings.routers_from:  # kept for the end-to-end benchmark (trained routers on real weights)
            write_routers(model, Path(settings.out_dir) / "routers" / job.name)

        row["eval"] = wide_compile.evaluate(model, tokenizer, tasks=list(settings.tasks), limit=settings.limit,
                                            batch_size=settings.eval_batch_size, print_table=False,
                                            ppl_window=settings.ppl_window, ppl_max_windows=settings.ppl_max_windows)
        if job.method == "teal":
            from wide_compile.baselines import teal_state

            row["teal_realized_sparsity"] = teal_state(model).realized_sparsity()  # zeroed projection inputs
    except Exception as exc:  # one failed job must not stop the others; the error is the row
        row["error"] = f"{type(exc).__name__}: {exc}"
        row["traceback"] = traceback.format_exc()[-4000:]
    row["seconds"] = round(time.perf_counter() - start, 2)
    row["settings"] = asdict(settings)
    path = row_path(settings, job)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row, indent=1) + "\n")
    return row
