"""Shared by the CPU kernel tests that run Triton under its interpreter (``TRITON_INTERPRET=1``)."""

from __future__ import annotations

import importlib
import sys


def ensure_interpreted_triton() -> None:
    """Triton's own @jit helpers (tl.max, tl.sum, ...) are interpreted only if triton was imported with
    TRITON_INTERPRET=1; if another test imported it before, re-import its Python modules."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(tl.max, InterpretedFunction):
        return
    for name in [n for n in sys.modules if n == "triton" or n.startswith("triton.")]:
        if not name.startswith("triton._C"):
            del sys.modules[name]
    importlib.import_module("triton.language")


def interpreted_module(name: str):
    """Generator for a module-scoped fixture: yields module ``name`` re-imported with its ``@triton.jit`` kernels
    defined under the interpreter, then restores ``TRITON_INTERPRET`` and re-imports it as it was."""
    import os

    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    ensure_interpreted_triton()
    module = importlib.reload(importlib.import_module(name))
    yield module
    if old is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = old
    importlib.reload(module)
