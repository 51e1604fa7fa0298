"""``wide-compile`` command line: one sub-command per module in this package.

Every public module here (name not starting with ``_``) that defines ``register(subparsers)`` is a
sub-command; ``register`` adds its parser and sets ``func`` (called with the parsed arguments, returns an
exit code or None).  To add a command (``demo``, ``train``, ``eval``, ``bench``...) drop a module in this
folder; nothing else needs editing.  Modules import heavy libraries inside ``func`` so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]

#: Errors reported as one ``wide-compile: error: ...`` line (exit code 1) instead of a traceback.
_USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, OSError, RuntimeError)


def _subcommand_modules() -> list[str]:
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered sub-command."""
    from wide_compile import __version__

    parser = argparse.ArgumentParser(
        prog="wide-compile",
        description="Token-level dynamic width pruning (WIDE) for HuggingFace causal LMs.",
    )
    parser.add_argument("--version", action="version", version=f"wide-compile {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _subcommand_modules():
        module = importlib.import_module(f"{__name__}.{name}")
        register = getattr(module, "register", None)
        if callable(register):
            register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    try:
        code = args.func(args)
    except _USER_ERRORS as exc:
        print(f"wide-compile {args.command}: error: {exc}", file=sys.stderr)
        return 1
    return int(code or 0)
