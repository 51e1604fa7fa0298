"""Static KV caches for timing compiled models: created before the compiled call (their K/V tensors are then static
CUDA-graph inputs), filled with random K/V, positioned in place through each layer's ``cumulative_length``."""

from __future__ import annotations

import inspect

import torch
from torch import nn


def cache_argument(model: nn.Module) -> str:
    """transformers 5.24 calls the cache argument ``cache``; 5.17 ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def forward_kwargs(model: nn.Module, cache) -> dict:
    """Keyword arguments of one cached forward (``logits_to_keep=1``: only the last position's logits, as
    ``generate`` does)."""
    params = inspect.signature(model.forward).parameters
    kwargs = {cache_argument(model): cache, "use_cache": True}
    if "logits_to_keep" in params:
        kwargs["logits_to_keep"] = 1
    return kwargs


def new_static_cache(model: nn.Module, batch: int, max_len: int):
    """A StaticCache of ``max_len`` slots whose K/V tensors exist now (static addresses for CUDA graphs)."""
    from transformers import StaticCache

    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    param = next(model.parameters())
    cache = StaticCache(config=config, max_cache_len=max_len)
    cache.early_initialization(batch_size=batch, num_heads=config.num_key_value_heads, head_dim=head_dim,
                               dtype=param.dtype, device=param.device)
    return cache


def _cache_layers(cache) -> list:
    layers = getattr(cache, "layers", None)
    if not layers or not all(hasattr(layer, "cumulative_length") for layer in layers):
        raise RuntimeError("this transformers version's StaticCache has no per-layer cumulative_length "
                           "(the timing positions the cache through it; 5.17 and 5.24 have it)")
    return layers


def fill_cache_random(cache, seed: int = 0) -> None:
    """Random K/V in every slot (in place, keeping the static addresses)."""
    generator = None
    for layer in _cache_layers(cache):
        for t in (layer.keys, layer.values):
            if generator is None:
                generator = torch.Generator(device=t.device).manual_seed(seed)
            t.normal_(generator=generator)


def set_cache_length(cache, length: int) -> None:
    """Make the next forward write at position ``length`` (in place: no new tensors, no recompile)."""
    for layer in _cache_layers(cache):
        layer.cumulative_length.fill_(length)


def cache_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for layer in _cache_layers(cache) for t in (layer.keys, layer.values))
