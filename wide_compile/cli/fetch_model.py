"""``wide-compile fetch-model ALIAS``: fetch a known real model into the cache and print its folder."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from wide_compile.model_zoo import MODEL_ZOO

    known = ", ".join(f"{alias} ({entry.description})" for alias, entry in sorted(MODEL_ZOO.items()))
    parser = subparsers.add_parser(
        "fetch-model",
        help="download and convert a known real model; prints the local HF folder",
        description=f"Fetch a known model into the cache and print its folder. Known: {known}.",
    )
    parser.add_argument("alias", choices=sorted(MODEL_ZOO), help="model alias")
    parser.add_argument(
        "--cache-dir", default=None,
        help="cache root (models go to <root>/models/<alias>); default $WIDE_CACHE_DIR or ~/.cache/wide_compile",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from wide_compile.model_zoo import fetch_model

    print(fetch_model(args.alias, cache_dir=args.cache_dir))
    return 0
