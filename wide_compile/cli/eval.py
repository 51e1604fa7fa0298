"""``wide-compile eval --model NAME_OR_PATH|WIDE_DIR``: zero-shot accuracy (lm-eval), WikiText-2 ppl, skip rates."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

DEFAULT_TASKS = "arc_easy,arc_challenge,openbookqa,boolq,piqa,hellaswag,winogrande"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="zero-shot task accuracy (lm-eval), WikiText-2 perplexity and skip rates of a dense or WIDE model",
        description="Evaluates a model with lm-evaluation-harness on local task files ($WIDE_DATA_DIR/tasks; "
        "ARC-e/ARC-c/OBQA test, BoolQ/PIQA/HellaSwag/WinoGrande validation), plus WikiText-2 test perplexity. "
        "A folder written by wide_compile.save() is loaded as a WIDE model and its realized skip rates are "
        "reported. Needs the 'eval' extra (pip install 'wide-compile[eval]').",
    )
    parser.add_argument("--model", required=True,
                        help="zoo alias (e.g. smollm2), HF folder, .gguf file, hub id, or a wide_compile.save() folder")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer source when the model folder has none (alias, folder or hub id)")
    parser.add_argument("--tasks", default=DEFAULT_TASKS,
                        help=f"comma-separated task names, or 'none' for perplexity only (default: {DEFAULT_TASKS})")
    parser.add_argument("--limit", type=float, default=None, metavar="N",
                        help="first N documents per task (a value < 1: that fraction)")
    parser.add_argument("--batch-size", type=int, default=16, help="lm-eval requests per forward (default 16)")
    parser.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: the stored dtype)")
    parser.add_argument("--device", default=None, help="e.g. cpu, cuda (default: cuda if available, else cpu)")
    parser.add_argument("--no-ppl", action="store_true", help="skip the WikiText-2 perplexity")
    parser.add_argument("--ppl-window", type=int, default=1024, help="perplexity window in tokens (default 1024)")
    parser.add_argument("--ppl-windows", type=int, default=None, metavar="N",
                        help="evaluate only the first N perplexity windows")
    parser.add_argument("--data-dir", default=None, help="data folder (default: $WIDE_DATA_DIR)")
    parser.add_argument("--source", choices=("auto", "local", "hub"), default="auto",
                        help="task data: local files, lm-eval's hub datasets, or auto (local if a data folder exists)")
    parser.add_argument("--cache-dir", default=None, help="cache root for model aliases (default $WIDE_CACHE_DIR)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON to this file")
    static = parser.add_argument_group("static width baseline (FLAP / Wanda-sp style, applied to a dense model)")
    static.add_argument("--static-width", type=float, default=None, metavar="SPARSITY",
                        help="prune every block to a fixed round((1-SPARSITY)*G) groups chosen on C4 calibration text")
    static.add_argument("--ffn-group-size", type=int, default=128, help="FFN channels per group (default 128)")
    static.add_argument("--attn-group-size", type=int, default=None,
                        help="query heads per group (default: the heads sharing one KV head)")
    static.add_argument("--calibration-samples", type=int, default=128, help="calibration windows (default 128)")
    static.add_argument("--calibration-seq-len", type=int, default=512, help="tokens per window (default 512)")
    parser.set_defaults(func=run)


def _parse_tasks(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    return [] if names == ["none"] else names


def _limit(value: float | None) -> int | float | None:
    if value is None:
        return None
    return int(value) if value >= 1 and float(value).is_integer() else value


def load_saved_wide(name: str, dtype: str | None, device: str):
    """The WIDE model of a ``wide_compile.save`` folder ``name`` (eval mode, on ``device``), or None for any other
    source."""
    import wide_compile
    from wide_compile.model_zoo import resolve_dtype
    from wide_compile.serialization import CONFIG_FILE

    path = Path(name).expanduser()
    if not (path.is_dir() and (path / CONFIG_FILE).is_file()):
        return None
    torch_dtype = resolve_dtype(dtype)
    model = wide_compile.load(path, **({"dtype": torch_dtype} if torch_dtype is not None else {}))
    return model.to(device).eval()


def load_model_and_tokenizer(name: str, tokenizer: str | None, dtype: str | None, device: str,
                             cache_dir: str | None):
    """``(model, tokenizer, is_wide_folder)`` for a zoo alias / HF source or a ``wide_compile.save`` folder."""
    from wide_compile.model_zoo import load_model

    model = load_saved_wide(name, dtype, device)
    if model is not None:
        return model, _load_tokenizer(tokenizer or str(Path(name).expanduser()), cache_dir), True
    model, tokenizer_obj = load_model(name, dtype=dtype, device=device, cache_dir=cache_dir)
    if tokenizer is not None:
        tokenizer_obj = _load_tokenizer(tokenizer, cache_dir)
    return model, tokenizer_obj, False


def _load_tokenizer(source: str, cache_dir: str | None):
    from transformers import AutoTokenizer

    from wide_compile.model_zoo import fetch_model, is_alias

    folder = str(fetch_model(source, cache_dir=cache_dir)) if is_alias(source) else source
    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise OSError(f"no tokenizer could be loaded from {source!r} (pass --tokenizer): {exc}") from exc


def run(args: argparse.Namespace) -> int:
    import torch

    from wide_compile.evaluation.harness import evaluate

    tasks = _parse_tasks(args.tasks)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    start = time.perf_counter()
    model, tokenizer, wide_folder = load_model_and_tokenizer(args.model, args.tokenizer, args.dtype, device,
                                                             args.cache_dir)
    loaded = time.perf_counter()
    if args.static_width is not None:
        _apply_static_width(model, tokenizer, args)
    calibrated = time.perf_counter()
    record = evaluate(
        model, tokenizer, tasks=tasks, limit=_limit(args.limit), batch_size=args.batch_size, device=device,
        ppl=not args.no_ppl, ppl_window=args.ppl_window, ppl_max_windows=args.ppl_windows,
        data_root=args.data_dir, source=args.source, print_table=True,
    )
    record["settings"].update({"model": args.model, "wide_folder": wide_folder,
                               "load_seconds": round(loaded - start, 3),
                               "calibration_seconds": round(calibrated - loaded, 3),
                               "arguments": {k: (str(v) if isinstance(v, Path) else v)
                                             for k, v in vars(args).items() if k != "func"}})
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        print(f"results written to {args.out}")
    return 0


def _apply_static_width(model, tokenizer, args: argparse.Namespace) -> None:
    import wide_compile
    from wide_compile.baselines import apply_static_width, calibration_batches
    from wide_compile.baselines.calibration import C4_FILE

    if wide_compile.is_applied(model):
        raise ValueError("--static-width needs a dense model, not a WIDE folder")
    path = Path(args.data_dir) / C4_FILE if args.data_dir else None
    batches = calibration_batches(tokenizer, samples=args.calibration_samples, seq_len=args.calibration_seq_len,
                                  batch_size=8, path=path)
    apply_static_width(model, args.static_width, batches, ffn_group_size=args.ffn_group_size,
                       attn_group_size=args.attn_group_size)
