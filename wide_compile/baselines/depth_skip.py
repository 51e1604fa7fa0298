"""Dynamic depth baseline (SkipGPT style): WIDE with exactly one group per attention and per MLP block."""

from __future__ import annotations

from typing import Any

from torch import nn


def block_sizes(model: nn.Module) -> tuple[int, int]:
    """``(query heads, intermediate size)`` shared by every layer of ``model`` (from the discovery pass).

    Raises:
        ValueError: the layers disagree (one group per block would need per-layer group sizes) or the
            model has no attention or no MLP blocks.
    """
    from wide_compile.passes.discovery import discover

    blueprint = discover(model)
    heads = {layer.attention.num_heads for layer in blueprint.layers if layer.attention is not None}
    intermediate = {layer.mlp.intermediate for layer in blueprint.layers if layer.mlp is not None}
    if len(heads) != 1 or len(intermediate) != 1:
        raise ValueError(
            f"depth skip needs the same number of query heads and the same intermediate size in every layer; "
            f"{blueprint.architecture} has heads {sorted(heads)} and intermediate sizes {sorted(intermediate)}"
        )
    return heads.pop(), intermediate.pop()


def apply_depth_skip(model: nn.Module, sparsity: float = 0.5, **apply_kwargs: Any) -> nn.Module:
    """Make ``model`` a dynamic-depth model: per token, a router runs or skips each whole block.

    Equivalent to ``wide_compile.apply(model, sparsity, attn_group_size=<query heads>,
    ffn_group_size=<intermediate size>)``; everything else (routers, training, skip rates, save / load)
    is the WIDE machinery.  ``apply_kwargs`` go to :func:`wide_compile.apply` (e.g. ``router_rank``,
    ``budget``; with one group, ``budget="topk"`` keeps ``round(1 - sparsity)`` groups, i.e. all or none).
    """
    import wide_compile

    for name in ("attn_group_size", "ffn_group_size"):
        if name in apply_kwargs:
            raise ValueError(f"apply_depth_skip sets {name} itself (one group per block); do not pass it")
    heads, intermediate = block_sizes(model)
    return wide_compile.apply(model, sparsity, attn_group_size=heads, ffn_group_size=intermediate, **apply_kwargs)
