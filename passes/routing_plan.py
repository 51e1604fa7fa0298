"""Turn discovered blocks plus a config into routed-block specs (all validation before any mutation)."""

from __future__ import annotations

from dataclasses import dataclass

from .blocks import ModelBlueprint


@dataclass(frozen=True)
class BlockSpec:
    """What to route in one (layer, sublayer)."""

    layer_index: int
    layer_path: str
    kind: str  # "attention" | "mlp"
    groups: int
    group_width: int  # channels per group at the masked projection's input
    source_path: str
    target_path: str


def plan_blocks(blueprint: ModelBlueprint, blocks: tuple[str, ...], attn_group_size: int | None,
                ffn_group_size: int) -> list[BlockSpec]:
    """Validate group sizes against every layer and list the blocks to route."""
    specs = []
    for layer in blueprint.layers:
        attn, mlp = layer.attention, layer.mlp
        if "attention" in blocks and attn is not None:
            size = attn_group_size or attn.num_heads // attn.num_kv_heads
            if attn.num_heads % size:
                raise ValueError(
                    f"attn_group_size={size} does not divide the {attn.num_heads} query heads of layer {layer.path}"
                )
            specs.append(BlockSpec(layer.index, layer.path, "attention", attn.num_heads // size,
                                   size * attn.head_dim, attn.router_source, attn.o_proj))
        if "mlp" in blocks and mlp is not None:
            if mlp.intermediate % ffn_group_size:
                raise ValueError(
                    f"ffn_group_size={ffn_group_size} does not divide the intermediate size {mlp.intermediate} "
                    f"of layer {layer.path} (choose a divisor, e.g. {_divisor_hint(mlp.intermediate, ffn_group_size)})"
                )
            specs.append(BlockSpec(layer.index, layer.path, "mlp", mlp.intermediate // ffn_group_size,
                                   ffn_group_size, mlp.router_source, mlp.down_proj))
    if not specs:
        raise ValueError(f"nothing to route: no {' or '.join(blocks)} block was found")
    return specs


def _divisor_hint(n: int, near: int) -> int:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return min(divisors, key=lambda d: abs(d - near))
