"""Insert routers and dynamic-width masking into a live HF model, as forward pre-hooks.

The model stays a normal HF model (``generate``, ``save_pretrained``, PEFT): routers are registered as
``<layer>.wide_routers.{attention,mlp}``; a pre-hook on each router-source module (usually the norm) runs
the router on the residual and stores the block's mask; a pre-hook on the output / down projection masks
its input with ``wide::group_mask``; the last block's one then joins the masks of the forward into one tensor
(``mask_packing``). Under ``torch.compile`` these hooks trace into ``wide::`` nodes.
If PEFT replaces a hooked projection (LoRA), the hook moves to the replacement on the next eager forward,
so base and adapter paths both see the masked input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from wide_compile.config import WideConfig
from wide_compile.decisions import decide
from wide_compile.models.router import GroupRouter
from wide_compile.state import ROUTERS_ATTR, STATE_ATTR, RoutedBlock, WideState
from wide_compile.state_registry import live_state

from .blocks import ModelBlueprint
from .mask_packing import pack_masks
from .routing_plan import plan_blocks


@dataclass(eq=False)
class HookEntry:
    path: str
    module: nn.Module
    hook: object
    handle: object = None

    def bind(self, module: nn.Module) -> None:
        if self.handle is not None:
            self.handle.remove()
        self.module = module
        self.handle = module.register_forward_pre_hook(self.hook, with_kwargs=True)


def _first_tensor(args, kwargs, where: str) -> torch.Tensor:
    x = args[0] if args else kwargs.get("hidden_states", kwargs.get("input"))
    if not torch.is_tensor(x):
        raise RuntimeError(f"wide_compile: {where} was called without a tensor as its first input")
    return x


class _StateHook:
    """A hook that reaches its model's state through ``state_registry`` by key, never by attribute (one source
    for every hook under ``torch.compile``; see ``wide_compile.state_registry``)."""

    state_key: int

    def __getstate__(self) -> dict:
        """Copies and pickles carry the state object itself; ``__setstate__`` turns it into the copy's key."""
        return {**vars(self), "state_key": live_state(self.state_key)}

    def __setstate__(self, values: dict) -> None:
        state = values["state_key"]
        self.__dict__.update(values, state_key=state.registry_key if isinstance(state, WideState) else state)


class RouteHook(_StateHook):
    """Pre-hook on a router-source module: run the routers of its blocks on the residual."""

    def __init__(self, state: WideState, block_indices: list[int], source: str, targets: list[HookEntry]):
        self.state_key, self.block_indices, self.source = state.registry_key, tuple(block_indices), source
        self.starts_forward = self.block_indices[0] == 0  # the forward's first routed block
        self.targets = targets  # the mask hooks of these blocks, re-bound if PEFT replaced their module

    def __call__(self, module, args, kwargs):
        x = _first_tensor(args, kwargs, self.source)
        state = live_state(self.state_key)
        if not torch.compiler.is_compiling():
            _rebind(state, self.targets)
        if self.starts_forward:
            state.packed_masks = None  # a new forward: the last one's masks are gone
        for index in self.block_indices:
            block = state.blocks[index]
            if x.shape[-1] != block.router.hidden:
                raise RuntimeError(
                    f"wide_compile: router input at {self.source} has {x.shape[-1]} features, expected "
                    f"{block.router.hidden} (the residual stream)"
                )
            block.mask = decide(state, block, x)
            if state.meter is not None:
                state.meter.add(block, block.mask.detach())
        return None


class MaskHook(_StateHook):
    """Pre-hook on an output / down projection: zero each token's inactive groups of its input."""

    def __init__(self, state: WideState, block_index: int):
        self.state_key, self.block_index = state.registry_key, block_index
        self.ends_forward = block_index == len(state.blocks) - 1  # the forward's last masked projection

    def __call__(self, module, args, kwargs):
        state = live_state(self.state_key)
        block = state.blocks[self.block_index]
        x = _first_tensor(args, kwargs, block.target_path)
        mask = block.mask if block.mask is not None else state.packed(block.key)
        if mask is None:
            raise RuntimeError(f"wide_compile: {block.target_path} ran before the router of its block")
        rows = x.shape[:-1]
        if mask.numel() != torch.Size(rows).numel() * block.groups:
            raise RuntimeError(
                f"wide_compile: mask {tuple(mask.shape)} does not match the input {tuple(x.shape)} of "
                f"{block.target_path}"
            )
        masked = torch.ops.wide.group_mask(x, mask.reshape(*rows, block.groups), block.group_width)
        if self.ends_forward:  # one tensor for all masks of the forward
            pack_masks(state)
        if args:
            return (masked, *args[1:]), kwargs
        key = "hidden_states" if "hidden_states" in kwargs else "input"
        return args, {**kwargs, key: masked}


def _rebind(state: WideState, entries: list[HookEntry]) -> None:
    root = state.root
    for entry in entries:
        current = root.get_submodule(entry.path)
        if current is not entry.module:
            entry.bind(current)


def install(model: nn.Module, blueprint: ModelBlueprint, config: WideConfig,
            router_dtype: torch.dtype = torch.float32, seed: int | None = None) -> WideState:
    """Create routers and hooks on ``model``; on any failure the model is left as it was."""
    specs = plan_blocks(blueprint, config.blocks, config.attn_group_size, config.ffn_group_size)
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    blocks = [
        RoutedBlock(s.layer_index, s.layer_path, s.kind, s.groups, s.group_width, s.source_path, s.target_path,
                    GroupRouter(blueprint.hidden_size, s.groups, config.router_rank, dtype=router_dtype, device=device,
                                generator=generator))
        for s in specs
    ]
    for block in blocks:
        block.router.train(model.training)  # follow the model's mode (eval: deterministic argmax)
    state = WideState(config=config, blueprint=blueprint, blocks=blocks, root=model)
    try:
        for layer_path in dict.fromkeys(b.layer_path for b in blocks):
            routers = nn.ModuleDict({b.kind: b.router for b in blocks if b.layer_path == layer_path})
            model.get_submodule(layer_path).add_module(ROUTERS_ATTR, routers)
        targets = {b.target_path: HookEntry(b.target_path, None, MaskHook(state, i)) for i, b in enumerate(blocks)}
        for entry in targets.values():
            entry.bind(model.get_submodule(entry.path))
        state.hooks.extend(targets.values())
        for source in dict.fromkeys(b.source_path for b in blocks):
            routed = [i for i, b in enumerate(blocks) if b.source_path == source]
            hook = RouteHook(state, routed, source, [targets[blocks[i].target_path] for i in routed])
            entry = HookEntry(source, None, hook)
            entry.bind(model.get_submodule(source))
            state.hooks.append(entry)
        setattr(model, STATE_ATTR, state)
    except Exception:
        uninstall(model, state)
        raise
    return state


def uninstall(model: nn.Module, state: WideState) -> None:
    """Remove everything :func:`install` added."""
    for entry in state.hooks:
        if entry.handle is not None:
            entry.handle.remove()
    state.hooks.clear()
    for layer_path in dict.fromkeys(b.layer_path for b in state.blocks):
        layer = model.get_submodule(layer_path)
        if ROUTERS_ATTR in layer._modules:
            del layer._modules[ROUTERS_ATTR]
    if STATE_ATTR in vars(model):
        delattr(model, STATE_ATTR)
