"""``wide-compile demo``: fetch a real model, calibrate WIDE routers briefly, compare dense vs WIDE perplexity."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="dense vs WIDE perplexity on a real model after a short router calibration",
        description="Fetches the model (cached), measures dense WikiText-2 perplexity on the first windows, "
        "applies WIDE at --sparsity, trains the routers briefly (stage 1: base frozen), then measures WIDE "
        "perplexity with deterministic routers and the realized skip rates. Defaults fit a few minutes on a "
        "2-core CPU; with CUDA the calibration and windows are longer.",
    )
    parser.add_argument("--model", default="smollm2", help="zoo alias, local HF folder or hub id (default smollm2)")
    parser.add_argument("--sparsity", type=float, default=0.5, help="target skip rate (default 0.5)")
    parser.add_argument("--tokens", type=int, default=None, help="calibration tokens (default: 16384 CPU, 2M CUDA)")
    parser.add_argument("--windows", type=int, default=None, help="WikiText-2 windows (default: 8 CPU, 40 CUDA)")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="evaluation window and training sequence length (default: 256 CPU, 1024 CUDA)")
    parser.add_argument("--lr", type=float, default=None, help="peak calibration LR (default 1e-2)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: the idle cores, see wide_compile.training.cpu_threads)")
    parser.add_argument("--ffn-group-size", type=int, default=128, help="FFN channels per group (default 128)")
    parser.add_argument("--data", nargs="+", default=None, help="calibration data (default: $WIDE_DATA_DIR mix)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from wide_compile.demo import DEMO_LR, run_demo
    from wide_compile.training.cpu_threads import idle_cpu_threads

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads is not None or device.startswith("cpu"):
        torch.set_num_threads(args.threads or idle_cpu_threads())
    result = run_demo(args.model, sparsity=args.sparsity, tokens=args.tokens, windows=args.windows,
                      seq_len=args.seq_len, lr=args.lr or DEMO_LR, data=args.data, device=args.device, out=args.out,
                      progress=not args.no_progress, ffn_group_size=args.ffn_group_size)
    print(result.table())
    if args.out is not None:
        print(f"wrote {args.out}")
    return 0
