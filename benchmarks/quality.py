"""Quality benchmark: WIDE (stage 1, stage 1+2) vs dynamic depth vs static width on real weights.

For each sparsity and method: build the model, train it (learned methods, equal tokens), evaluate
WikiText-2 test perplexity and the 7 zero-shot tasks through lm-eval (:func:`wide_compile.evaluate`).
Jobs run in ``--workers`` processes sharing the GPU; each finished job writes ``<out>/rows/<job>.json`` at
once (a re-run skips jobs whose row exists, so a timed-out run continues where it stopped).
``--timing-tokens`` first runs one WIDE stage-1 training alone to measure training throughput.

    python benchmarks/quality.py --out-dir /tmp/quality --tokens 4000000 --workers 4
    python benchmarks/quality_report.py /tmp/quality/quality_smollm2.json   # markdown table + PNG plot
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality_jobs import LEARNED, METHODS, Job, JobSettings, row_path, run_job  # noqa: E402

DEFAULT_TASKS = "arc_easy,arc_challenge,openbookqa,boolq,piqa,hellaswag,winogrande"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="zoo alias, HF folder or .gguf file")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--sparsities", default="0.5,0.25,0.7")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--tokens", type=int, default=4_000_000, help="training tokens per learned method")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks", default=DEFAULT_TASKS)
    ap.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    ap.add_argument("--eval-batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--device", default=None, help="default: cuda when available")
    ap.add_argument("--timing-tokens", type=int, default=0,
                    help="first train WIDE stage 1 at 0.5 alone for this many tokens and report tokens/s")
    ap.add_argument("--calibration-samples", type=int, default=128)
    ap.add_argument("--ffn-group-size", type=int, default=128)
    ap.add_argument("--routers-from", default=None,
                    help="wide_s1 jobs load <dir>/<job> (routers of an earlier run) instead of training")
    ap.add_argument("--ppl-windows", type=int, default=None, help="WikiText-2 windows (default: all)")
    return ap.parse_args(argv)


def jobs_of(args) -> list[Job]:
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; known: {list(METHODS)}")
    jobs = [Job("dense", 0.0)] if "dense" in methods else []
    for s in (float(x) for x in args.sparsities.split(",")):
        if not 0.0 < s < 1.0:
            raise SystemExit(f"sparsity must be in (0, 1), got {s}")
        jobs += [Job(m, s) for m in methods if m != "dense"]
    # learned jobs take longest: start them first so the pool ends together
    return sorted(jobs, key=lambda j: (j.method not in LEARNED, jobs.index(j)))


def environment(device: str) -> dict:
    import torch
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "device": device, "tf32_matmul": True}
    try:
        import lm_eval  # noqa: F401
        from importlib.metadata import version

        env["lm_eval"] = version("lm_eval")
    except ImportError:
        env["lm_eval"] = None
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def timing_run(settings: JobSettings, tokens: int) -> dict:
    """WIDE stage 1 at sparsity 0.5 for ``tokens`` tokens, alone on the device: training throughput."""
    import wide_compile
    from wide_compile.model_zoo import load_model

    model, tokenizer = load_model(settings.model, dtype="fp32", device=settings.device)
    wide_compile.apply(model, 0.5, seed=settings.seed)
    start = time.perf_counter()
    result = wide_compile.train(model, tokenizer, stage=1, tokens=tokens, seq_len=settings.seq_len,
                                batch_size=settings.batch_size, seed=settings.seed, device=settings.device,
                                history=False, eval_batches=0)
    return {"tokens": result.tokens, "steps": result.steps, "train_seconds": round(result.seconds, 2),
            "tokens_per_second": round(result.tokens_per_second, 1),
            "wall_seconds_incl_data": round(time.perf_counter() - start, 2), "last": result.last,
            "seq_len": settings.seq_len, "batch_size": settings.batch_size, "bf16_autocast": True}


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    settings = JobSettings(model=args.model, tokens=args.tokens, seq_len=args.seq_len, batch_size=args.batch_size,
                           seed=args.seed, tasks=tuple(t for t in args.tasks.split(",") if t), limit=args.limit,
                           eval_batch_size=args.eval_batch_size, device=device, out_dir=str(out),
                           calibration_samples=args.calibration_samples,
                           ppl_max_windows=args.ppl_windows, ffn_group_size=args.ffn_group_size,
                           routers_from=args.routers_from)
    command = "python benchmarks/quality.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    record: dict = {"command": command, "settings": asdict(settings), "environment": environment(device)}
    timing_file = out / "timing.json"
    if args.timing_tokens and not timing_file.exists():
        print(f"timing run: WIDE stage 1, {args.timing_tokens} tokens, alone", flush=True)
        timing_file.write_text(json.dumps(timing_run(settings, args.timing_tokens), indent=1) + "\n")
        if device.startswith("cuda"):
            torch.cuda.empty_cache()  # the workers need the memory the timing run cached
    if timing_file.exists():
        record["training_throughput"] = json.loads(timing_file.read_text())
    todo = [j for j in jobs_of(args) if not _done(row_path(settings, j))]
    print(f"{len(todo)} job(s) to run with {args.workers} worker(s): {[j.name for j in todo]}", flush=True)
    start = time.perf_counter()
    if args.workers > 1 and len(todo) > 1:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(args.workers, maxtasksperchild=1) as pool:
            for row in pool.imap_unordered(_run_packed, [(j, settings) for j in todo]):
                _report(row, start)
    else:
        for job in todo:
            _report(run_job(job, settings), start)
    rows = [json.loads(p.read_text()) for p in sorted((out / "rows").glob("*.json"))] if (out / "rows").exists() else []
    for row in rows:
        row.pop("settings", None)
    record["rows"] = rows
    target = out / f"quality_{Path(args.model).stem}.json"
    target.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {target}")
    return 0 if all("error" not in r for r in rows) else 1


def _done(path: Path) -> bool:
    """A job is done when its row exists without an error (failed jobs run again)."""
    return path.exists() and "error" not in json.loads(path.read_text())


def _run_packed(packed) -> dict:
    return run_job(*packed)


def _report(row: dict, start: float) -> None:
    elapsed = time.perf_counter() - start
    if "error" in row:
        print(f"[{elapsed:6.0f}s] {row['job']}: FAILED {row['error']}", flush=True)
        return
    ev = row["eval"]
    ppl = ev["ppl"]["wikitext2"] if ev.get("ppl") else float("nan")
    acc = ev.get("mean_acc") or float("nan")
    rates = (ev.get("skip_rates") or {}).get("mean")
    print(f"[{elapsed:6.0f}s] {row['job']}: ppl {ppl:.2f} mean acc {acc:.4f} skip {rates} ({row['seconds']:.0f} s)",
          flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
