"""TEAL-style baseline: training-free magnitude sparsity of every projection's input activations.

Every projection the discovery pass finds (q / k / v / o, gate / up / down or their fused forms) gets a
:class:`~wide_compile.models.magnitude_threshold.MagnitudeGate` as a forward pre-hook. Its threshold is the
``sparsity``-quantile of ``|input|`` over calibration batches, so about ``sparsity`` of the entries are zeroed per
projection (per token and channel, unlike WIDE's head / channel groups). The model is otherwise unchanged
(no routers; ``wide_compile.apply`` is not used); :func:`remove_teal` takes the hooks off.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from wide_compile.models.magnitude_threshold import MagnitudeGate, QuantileSketch

TEAL_ATTR = "_wide_teal"


@dataclass
class TealState:
    sparsity: float
    gates: dict[str, MagnitudeGate]  # projection module path -> gate
    handles: list = field(default_factory=list, repr=False)

    def realized_sparsity(self) -> float:
        """Zeroed fraction over all gated inputs since the gates were installed (or :meth:`reset`)."""
        zeroed = sum(g.zeroed for g in self.gates.values())
        total = sum(g.total for g in self.gates.values())
        return zeroed / total if total else float("nan")

    def reset(self) -> None:
        for gate in self.gates.values():
            gate.zeroed = gate.total = 0


def projection_paths(model: nn.Module) -> list[str]:
    """Module paths of every projection of the discovered attention and MLP blocks (each once)."""
    from wide_compile.passes.discovery import discover

    paths: list[str] = []
    for layer in discover(model).layers:
        if layer.attention is not None:
            a = layer.attention
            paths += [a.q_proj, a.k_proj, a.v_proj, a.o_proj]
        if layer.mlp is not None:
            paths += [*layer.mlp.in_projs, layer.mlp.down_proj]
    return list(dict.fromkeys(paths))


def _sketch_hook(sketch: QuantileSketch):
    def hook(module, args, kwargs):
        x = args[0] if args else kwargs.get("hidden_states", kwargs.get("input"))
        sketch.add(x)
    return hook


@torch.no_grad()
def apply_teal(model: nn.Module, sparsity: float, calibration_batches: Iterable, seed: int = 0) -> TealState:
    """Calibrate thresholds on ``calibration_batches`` (input-id tensors ``[batch, seq]``) and install the gates.

    Raises:
        ValueError: ``sparsity`` outside [0, 1), no calibration batch, or TEAL already applied.
    """
    if not 0.0 <= float(sparsity) < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    if getattr(model, TEAL_ATTR, None) is not None:
        raise ValueError("TEAL gates are already installed on this model (remove_teal first)")
    paths = projection_paths(model)
    sketches = {path: QuantileSketch(seed=seed) for path in paths}
    handles = [model.get_submodule(p).register_forward_pre_hook(_sketch_hook(sketches[p]), with_kwargs=True)
               for p in paths]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    batches = 0
    try:
        for batch in calibration_batches:
            model(input_ids=batch.to(device), use_cache=False)
            batches += 1
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    if batches == 0:
        raise ValueError("apply_teal needs at least one calibration batch")
    gates = {p: MagnitudeGate(sketches[p].quantile(float(sparsity))) for p in paths}
    state = TealState(float(sparsity), gates)
    state.handles = [model.get_submodule(p).register_forward_pre_hook(gates[p], with_kwargs=True) for p in paths]
    setattr(model, TEAL_ATTR, state)
    return state


def teal_state(model: nn.Module) -> TealState:
    state = getattr(model, TEAL_ATTR, None)
    if state is None:
        raise ValueError("this model has no TEAL gates (use apply_teal)")
    return state


def remove_teal(model: nn.Module) -> nn.Module:
    """Take the gates off; the model computes exactly as before :func:`apply_teal`."""
    state = teal_state(model)
    for handle in state.handles:
        handle.remove()
    delattr(model, TEAL_ATTR)
    return model
