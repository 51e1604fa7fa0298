"""``wide-compile train --model NAME --stage 1 --sparsity 0.5 --tokens N``: train WIDE routers (and LoRA)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train WIDE routers (stage 1) or routers + LoRA (stage 2)",
        description="Stage 1 freezes the model and trains only the routers; stage 2 trains LoRA adapters and "
        "routers, then merges the adapters. A --model folder written by an earlier run (it has "
        "wide_config.json) continues with its routers, e.g. stage 2 after stage 1. The result goes to "
        "OUTPUT_DIR/final (load it with wide_compile.load), resumable checkpoints to OUTPUT_DIR/checkpoint-N.",
    )
    parser.add_argument("--model", required=True,
                        help="zoo alias (e.g. smollm2), local HF folder or WIDE folder from a run, .gguf or hub id")
    parser.add_argument("--stage", type=int, choices=(1, 2), default=1)
    parser.add_argument("--sparsity", type=float, default=0.5, help="target mean skip rate (default 0.5)")
    parser.add_argument("--attn-target", type=float, default=None, help="separate attention target (with --mlp-target)")
    parser.add_argument("--mlp-target", type=float, default=None, help="separate MLP target (with --attn-target)")
    length = parser.add_mutually_exclusive_group(required=True)
    length.add_argument("--tokens", type=int, help="training tokens")
    length.add_argument("--steps", type=int, help="optimizer steps")
    parser.add_argument("--data", nargs="+", default=None,
                        help="jsonl/json/parquet/txt files, folders, globs or hub names (default: $WIDE_DATA_DIR mix)")
    parser.add_argument("--data-mode", choices=("packed", "document"), default="packed")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--lr", type=float, default=None, help="peak LR (default 2e-3 stage 1, 2e-4 stage 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS")
    parser.add_argument("--resume", default=None, help="checkpoint folder, or 'latest' (newest in --output-dir)")
    parser.add_argument("--ffn-group-size", type=int, default=128)
    parser.add_argument("--attn-group-size", type=int, default=None)
    parser.add_argument("--router-rank", type=int, default=32)
    parser.add_argument("--device", default=None, help="e.g. cpu, cuda (default: cuda if available)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads (default: the idle cores, see wide_compile.training.cpu_threads)")
    parser.add_argument("--dtype", default=None, help="model dtype: fp32, bf16, fp16 (default: stored dtype)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.set_defaults(func=run)


def load_for_training(name: str, args: argparse.Namespace):
    """(model, tokenizer): a WIDE folder from an earlier run keeps its routers; anything else gets apply()."""
    import wide_compile
    from wide_compile.model_zoo import load_model
    from wide_compile.serialization import CONFIG_FILE

    path = Path(name).expanduser()
    if (path / CONFIG_FILE).is_file():
        from transformers import AutoTokenizer

        kwargs = {"dtype": _dtype(args.dtype)} if args.dtype else {}
        return wide_compile.load(path, **kwargs), AutoTokenizer.from_pretrained(path)
    model, tokenizer = load_model(name, dtype=args.dtype)
    wide_compile.apply(model, sparsity=args.sparsity, ffn_group_size=args.ffn_group_size,
                       attn_group_size=args.attn_group_size, router_rank=args.router_rank)
    return model, tokenizer


def _dtype(name: str):
    from wide_compile.model_zoo import resolve_dtype

    return resolve_dtype(name)


def run(args: argparse.Namespace) -> int:
    import torch

    from wide_compile.training import TrainConfig, train
    from wide_compile.training.cpu_threads import idle_cpu_threads

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads is not None or device.startswith("cpu"):
        torch.set_num_threads(args.threads or idle_cpu_threads())
    config = TrainConfig(  # validated before the model is loaded
        stage=args.stage, target_sparsity=args.sparsity, attn_target=args.attn_target, mlp_target=args.mlp_target,
        tokens=args.tokens, steps=args.steps, seq_len=args.seq_len, batch_size=args.batch_size,
        grad_accum=args.grad_accum, lr=args.lr, seed=args.seed, data=args.data, data_mode=args.data_mode,
        output_dir=str(args.output_dir), checkpoint_every=args.checkpoint_every, resume_from=args.resume,
        device=args.device, progress=not args.no_progress, history=False,
    )
    from wide_compile.training.data_sources import resolve_sources

    resolve_sources(config.data)  # fail on bad data before loading a model
    model, tokenizer = load_for_training(args.model, args)
    result = train(model, tokenizer, config)
    summary = {"model": args.model, "stage": args.stage, "steps": result.steps, "tokens": result.tokens,
               "seconds": round(result.seconds, 2), "tokens_per_second": round(result.tokens_per_second, 1),
               "last": result.last, "validation": result.validation, "saved_to": str(result.saved_to)}
    if args.json:
        print(json.dumps(summary))
    else:
        val = result.validation or {}
        print(f"stage {args.stage}: {result.steps} steps, {result.tokens} tokens, "
              f"{result.tokens_per_second:.0f} tok/s; "
              f"val ce={val.get('ce', float('nan')):.4f} ppl={val.get('ppl', float('nan')):.3f} "
              f"skip attn={val.get('skip_attention', float('nan')):.3f} mlp={val.get('skip_mlp', float('nan')):.3f}; "
              f"saved to {result.saved_to}")
    return 0
