"""Runtime state that ``apply()`` attaches to a model: routed blocks, forced decisions, realized masks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .config import WideConfig
from .state_registry import register

STATE_ATTR = "_wide_state"
ROUTERS_ATTR = "wide_routers"

# A forced decision: "execute", "skip", {(layer_index, kind): mask}, or fn(block, mask_shape) -> mask.
Forced = str | Mapping | Callable[["RoutedBlock", tuple], Tensor]


@dataclass(eq=False)
class RoutedBlock:
    """One routed (layer, sublayer): where its router reads and where its mask is applied."""

    layer_index: int
    layer_path: str
    kind: str  # "attention" or "mlp"
    groups: int
    group_width: int  # channels per group at the masked projection's input
    source_path: str  # module whose first input is the router input (residual)
    target_path: str  # projection whose input is masked (o_proj / down_proj)
    router: nn.Module
    mask: Tensor | None = None  # realized mask of the last forward, [..., groups]

    @property
    def key(self) -> tuple[int, str]:
        return (self.layer_index, self.kind)


@dataclass
class SkipRateMeter:
    """Accumulates realized skip rates over many forwards (see :func:`wide_compile.track_skip_rates`)."""

    skipped: dict = field(default_factory=dict)
    total: dict = field(default_factory=dict)

    def add(self, block: RoutedBlock, mask: Tensor) -> None:
        self.skipped[block.key] = self.skipped.get(block.key, 0.0) + float((1.0 - mask.float()).sum())
        self.total[block.key] = self.total.get(block.key, 0) + mask.numel()

    def rates(self) -> dict[tuple[int, str], float]:
        return {k: self.skipped[k] / max(1, self.total[k]) for k in self.total}


@dataclass(eq=False)
class WideState:
    """Everything ``apply()`` added to a model, kept on ``model._wide_state``."""

    config: WideConfig
    blueprint: object  # passes.blocks.ModelBlueprint
    blocks: list[RoutedBlock]
    root: nn.Module = field(repr=False)  # the transformed model (strong ref: deepcopy maps it to the copy)
    forced: Forced | None = None
    meter: SkipRateMeter | None = None
    hooks: list = field(default_factory=list)  # (path, module, handle, hook, kind)
    # The masks of the last forward, joined along the group axis when the forward ends (``passes.mask_packing``):
    # ``[..., sum of groups]``; ``mask_layout`` holds ``(key, start, groups)`` per packed block (see ``packed``).
    packed_masks: Tensor | None = field(default=None, repr=False)
    mask_layout: tuple = ()
    registry_key: int = field(default=-1, repr=False)  # its entry in ``state_registry`` (what the hooks hold)

    def __post_init__(self) -> None:
        self.registry_key = register(self)

    def __reduce_ex__(self, protocol):
        """Copies and unpickled states are registered as they are created (before their fields are filled, which
        may reach back here through the model's hooks), under a key of their own."""
        return _registered_state, (), {k: v for k, v in vars(self).items() if k != "registry_key"}

    def packed(self, key: tuple[int, str]) -> Tensor | None:
        """Block ``key``'s columns of ``packed_masks`` (a view), or None."""
        if self.packed_masks is not None:
            for packed_key, start, groups in self.mask_layout:
                if packed_key == key:
                    return self.packed_masks[..., start:start + groups]
        return None

    def block(self, layer_index: int, kind: str) -> RoutedBlock:
        for block in self.blocks:
            if block.layer_index == layer_index and block.kind == kind:
                return block
        raise KeyError(f"no routed {kind} block in layer {layer_index}")


def _registered_state() -> WideState:
    """An empty ``WideState`` with a registry key: what ``copy.deepcopy`` and ``pickle`` fill (``__reduce_ex__``)."""
    state = WideState.__new__(WideState)
    state.registry_key = register(state)
    return state


def get_state(model: nn.Module) -> WideState:
    """The WIDE state of a transformed model; raises a clear error for an untouched one."""
    state = getattr(_unwrap(model), STATE_ATTR, None)
    if state is None:
        raise ValueError(f"{type(model).__name__} has not been transformed: call wide_compile.apply(model) first")
    return state


def find_state(model: nn.Module) -> WideState | None:
    return getattr(_unwrap(model), STATE_ATTR, None)


def _unwrap(model: nn.Module) -> nn.Module:
    """The transformed HF model inside PEFT / torch.compile wrappers (breadth-first over wrapper attrs)."""
    frontier = [model]
    for _ in range(4):
        nxt = []
        for candidate in frontier:
            if STATE_ATTR in vars(candidate):
                return candidate
            for attr in ("_orig_mod", "model", "base_model"):
                inner = vars(candidate).get("_modules", {}).get(attr) or vars(candidate).get(attr)
                if isinstance(inner, nn.Module) and inner is not candidate:
                    nxt.append(inner)
        frontier = nxt
    return model


def realized_masks(model: nn.Module) -> dict[tuple[int, str], Tensor]:
    """The masks of the last forward, keyed by ``(layer_index, "attention" | "mlp")``, each ``[..., groups]``
    (views of one tensor when the forward ran through the model's own call, see ``passes.mask_packing``)."""
    state = get_state(model)
    masks = {key: state.packed(key) for key, _, _ in state.mask_layout} if state.packed_masks is not None else {}
    masks.update({b.key: b.mask for b in state.blocks if b.mask is not None})  # a forward of a part of the model
    return masks


def skip_rate_tensors(model: nn.Module) -> dict[str, Tensor]:
    """Differentiable mean skip rates of the last forward: ``{"attention", "mlp", "mean"}``.

    ``mean`` averages the attention and MLP rates (each a mean over its layers), as the WIDE loss does.
    """
    per_kind: dict[str, list[Tensor]] = {}
    for (_, kind), mask in realized_masks(model).items():
        per_kind.setdefault(kind, []).append(1.0 - mask.float().mean())
    if not per_kind:
        raise RuntimeError("no realized masks yet: run a forward pass first")
    rates = {kind: torch.stack(v).mean() for kind, v in per_kind.items()}
    rates["mean"] = torch.stack(list(rates.values())).mean()
    return rates
