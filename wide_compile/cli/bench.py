"""``wide-compile bench --model NAME_OR_PATH``: compiled dense vs compiled WIDE speed (decode ms/step, TTFT)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _sizes(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.startswith("wide."):
        raise argparse.ArgumentTypeError(f"expected wide.KEY=VALUE, got {text!r}")
    return key, {"true": True, "false": False}.get(value.lower(), value)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="speed of the WIDE model against the dense one, both through torch.compile on static KV caches",
        description="Times decode steps (ms per step at each batch size, from the middle of a static KV cache) and "
        "time to first token (each prompt length) for the dense model and its WIDE twin (the same weights), both "
        "compiled with the same mode; prints a table of medians and dense/WIDE ratios. On a GPU the compiled "
        "WIDE model runs the group-skipping Triton kernels; on a CPU the timings only show that the flow works. "
        "benchmarks/e2e.py is the fuller benchmark (roofline bounds, profiles, time budgets).",
    )
    parser.add_argument("--model", required=True,
                        help="zoo alias (e.g. smollm2), HF folder, .gguf file, hub id, or a wide_compile.save() folder")
    parser.add_argument("--routers", default=None,
                        help="trained routers (a wide_compile.save() folder or routers file); default: fresh routers")
    parser.add_argument("--sparsity", type=float, default=0.5, help="target skip rate of fresh routers (default 0.5)")
    parser.add_argument("--ffn-group-size", type=int, default=None, help="FFN channels per group for fresh routers")
    parser.add_argument("--decode-batch", type=_sizes, default=[1], help="decode batch sizes (default 1)")
    parser.add_argument("--prefill", type=_sizes, default=[512], help="prompt lengths (default 512)")
    parser.add_argument("--steps", type=int, default=50, help="timed decode steps per batch size (default 50)")
    parser.add_argument("--runs", type=int, default=5, help="timed prefills per length (default 5)")
    parser.add_argument("--kv-slots", type=int, default=1024, help="static cache slots for decode (default 1024)")
    parser.add_argument("--mode", default="reduce-overhead",
                        help="torch.compile mode on CUDA (default reduce-overhead: CUDA graphs; 'none' for none)")
    parser.add_argument("--inner", choices=("inductor", "aot_eager", "eager"), default=None,
                        help="graph compiler (default: inductor on CUDA, aot_eager on CPU)")
    parser.add_argument("--wide-option", type=_option, action="append", default=[], metavar="wide.KEY=VALUE",
                        help="a wide backend option, e.g. wide.one_token_routers=reduction (repeatable)")
    parser.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: bf16 on CUDA, else stored)")
    parser.add_argument("--device", default=None, help="e.g. cpu, cuda (default: cuda if available, else cpu)")
    parser.add_argument("--cache-dir", default=None, help="cache root for model aliases (default $WIDE_CACHE_DIR)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON to this file")
    parser.set_defaults(func=run)


def _load(args: argparse.Namespace, device: str):
    from wide_compile.cli.eval import load_saved_wide
    from wide_compile.model_zoo import load_model

    dtype = args.dtype or ("bf16" if device.startswith("cuda") else None)
    model = load_saved_wide(args.model, dtype, device)
    if model is None:
        model, _ = load_model(args.model, dtype=dtype, device=device, cache_dir=args.cache_dir, with_tokenizer=False)
    return model


def run(args: argparse.Namespace) -> int:
    import torch

    from wide_compile.speed import measure_speed

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = _load(args, device)
    apply_kwargs = {"ffn_group_size": args.ffn_group_size} if args.ffn_group_size else {}
    report = measure_speed(
        model, routers=args.routers, sparsity=args.sparsity, decode_batches=args.decode_batch,
        prompt_lengths=args.prefill, mode=None if args.mode.lower() == "none" else args.mode, inner=args.inner,
        decode_steps=args.steps, prefill_runs=args.runs, kv_slots=args.kv_slots,
        wide_options=dict(args.wide_option), **apply_kwargs,
    )
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"model": args.model, **report.to_dict()}, indent=2, default=str))
        print(f"wrote {args.out}")
    return 0
