"""A dense model and its WIDE twin sharing one copy of the weights, for side-by-side timing."""

from __future__ import annotations

import copy
from pathlib import Path

from torch import nn


def weight_sharing_twin(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` whose parameters and buffers are the *same tensors* (no extra memory)."""
    tensors = list(model.parameters()) + list(model.buffers())
    twin = copy.deepcopy(model, memo={id(t): t for t in tensors})
    shared = {t.data_ptr() for t in tensors}
    if any(t.data_ptr() not in shared for t in list(twin.parameters()) + list(twin.buffers())):
        raise RuntimeError("weight_sharing_twin: the twin has tensors of its own (expected shared weights)")
    return twin


def dense_and_wide(model: nn.Module, *, routers: str | Path | None = None, sparsity: float = 0.5, seed: int = 0,
                   **apply_kwargs) -> tuple[nn.Module, nn.Module, str]:
    """``(dense, wide, routers_description)`` sharing ``model``'s weights, both in eval mode.

    - ``model`` already transformed (``wide_compile.apply`` / ``load``): it is the WIDE one; the dense one is a twin
      with WIDE removed.
    - ``routers`` (a folder or file written by ``wide_compile.save`` / training): the twin gets the saved
      configuration (``wide_config.json`` beside it, else ``sparsity`` and ``apply_kwargs``) and those routers.
    - otherwise the twin gets ``apply(sparsity=..., seed=..., **apply_kwargs)`` with fresh routers (zero output bias:
      the argmax then skips about half of the (token, group) pairs, depending on the token).
    """
    import wide_compile
    from wide_compile.serialization import apply_saved

    if wide_compile.is_applied(model):
        if routers is not None:
            raise ValueError("dense_and_wide: the model is already a WIDE model; pass routers for a dense model")
        dense = wide_compile.remove(weight_sharing_twin(model))
        return dense.eval(), model.eval(), "the model's own"
    wide = weight_sharing_twin(model)
    if routers is None:
        wide_compile.apply(wide, sparsity=sparsity, seed=seed, **apply_kwargs)
        described = f"random (seed {seed}, zero output bias: argmax gives ~50% token-dependent skips)"
    else:
        apply_saved(wide, routers, sparsity=sparsity, seed=seed, **apply_kwargs)
        described = f"trained, loaded from {routers}"
    return model.eval(), wide.eval(), described
