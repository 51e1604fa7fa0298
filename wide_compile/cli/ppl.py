"""``wide-compile ppl --model NAME_OR_PATH``: dense perplexity on WikiText-2 test (or a text file)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ppl",
        help="perplexity of a model on WikiText-2 test (non-overlapping windows)",
        description="Token-level perplexity over non-overlapping windows (trailing partial window dropped). "
        "Text: WikiText-2 raw test from $WIDE_DATA_DIR (or the datasets hub), unless --text-file is given.",
    )
    parser.add_argument(
        "--model", required=True, help="zoo alias (e.g. smollm2), local HF folder, .gguf file or hub id"
    )
    parser.add_argument("--windows", type=int, default=None, metavar="N", help="evaluate only the first N windows")
    parser.add_argument("--window", type=int, default=1024, help="tokens per window (default 1024)")
    parser.add_argument("--batch-size", type=int, default=1, help="windows per forward pass (default 1)")
    parser.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: the stored dtype)")
    parser.add_argument("--device", default=None, help="e.g. cpu, cuda, cuda:1 (default: cuda if available, else cpu)")
    parser.add_argument(
        "--text-file", type=Path, default=None, help="UTF-8 text file to evaluate instead of WikiText-2"
    )
    parser.add_argument("--cache-dir", default=None, help="cache root for model aliases (default $WIDE_CACHE_DIR)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from wide_compile.data import wikitext2_test_text
    from wide_compile.evaluation import perplexity
    from wide_compile.model_zoo import load_model

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.text_file is not None:
        text, text_name = args.text_file.read_text(encoding="utf-8"), str(args.text_file)
    else:
        text, text_name = wikitext2_test_text(), "wikitext-2-raw-v1 test"
    start = time.perf_counter()
    model, tokenizer = load_model(args.model, dtype=args.dtype, device=device, cache_dir=args.cache_dir)
    loaded = time.perf_counter()
    result = perplexity(
        model, tokenizer, text, window=args.window, max_windows=args.windows,
        batch_size=args.batch_size, device=device, progress=not args.no_progress,
    )
    done = time.perf_counter()
    record = {
        "model": args.model, "text": text_name, "ppl": result.ppl, "nll": result.nll,
        "tokens": result.tokens, "windows": result.windows, "window": args.window,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "device": device,
        "load_seconds": round(loaded - start, 3), "eval_seconds": round(done - loaded, 3),
    }
    if args.json:
        print(json.dumps(record))
    else:
        print(
            f"ppl={result.ppl:.4f} nll={result.nll:.5f} tokens={result.tokens} windows={result.windows} "
            f"window={args.window} dtype={record['dtype']} device={device} model={args.model} "
            f"text={text_name!r} load={record['load_seconds']:.1f}s eval={record['eval_seconds']:.1f}s"
        )
    return 0
