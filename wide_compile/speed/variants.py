"""``torch.compile`` of the two variants that are timed side by side: the dense model (Inductor, or a debugging
backend) and its WIDE twin (``backend="wide"``), with the same mode, dynamic-shape setting and Inductor settings
(the dense model gets the ``wide`` backend's Inductor defaults, ``backend.inductor_defaults()``, so that the
baseline is not slower by a setting WIDE has)."""

from __future__ import annotations

import torch
from torch import nn

INNER_COMPILERS = ("inductor", "aot_eager", "eager")


def compile_variant(model: nn.Module, variant: str, mode: str | None, inner: str, dynamic: bool | None,
                    wide_options: dict | None = None):
    """``torch.compile`` of the dense model (``inner`` backend) or the WIDE model (``"wide"`` backend, with the
    backend's own ``wide_options``, e.g. ``{"wide.one_token_routers": "reduction"}``)."""
    if inner not in INNER_COMPILERS:
        raise ValueError(f"inner compiler must be inductor, aot_eager or eager, got {inner!r}")
    if inner != "inductor" and mode not in (None, "default"):
        raise ValueError(f"compile mode {mode!r} needs the inductor inner compiler, not {inner!r}")
    if variant == "dense":
        if inner != "inductor":
            return torch.compile(model, backend=inner, dynamic=dynamic)
        from torch._inductor import list_mode_options

        from wide_compile.backend import inductor_defaults

        options = {**inductor_defaults(), **list_mode_options(mode or "default"), **dense_inductor_options(wide_options)}
        return torch.compile(model, backend="inductor", options=options, dynamic=dynamic)
    if wide_options:  # torch.compile takes a mode or options, not both: the mode's settings go in as options
        from torch._inductor import list_mode_options

        settings = list_mode_options(mode or "default") if inner == "inductor" else {"wide.inner": inner}
        return torch.compile(model, backend="wide", options={**settings, **wide_options}, dynamic=dynamic)
    if inner == "inductor":
        return torch.compile(model, backend="wide", mode=mode, dynamic=dynamic)
    return torch.compile(model, backend="wide", options={"wide.inner": inner}, dynamic=dynamic)


def dense_inductor_options(wide_options: dict | None) -> dict:
    """The Inductor settings among ``wide_options`` (keys without the ``wide.`` prefix): both variants get them."""
    return {k: v for k, v in (wide_options or {}).items() if not k.startswith("wide.")}
