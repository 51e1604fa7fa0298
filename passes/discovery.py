"""The discovery pass: capture a causal LM and map every decoder layer's attention and MLP blocks."""

from __future__ import annotations

from collections import defaultdict

import torch

from .attention_discovery import AttentionMatch, find_attention
from .blocks import AttentionBlock, LayerBlocks, MlpBlock, ModelBlueprint
from .capture import capture
from .errors import DiscoveryError
from .graph_utils import layer_path
from .mlp_discovery import MlpMatch, find_mlp
from .projections import Projection, find_projections
from .residual_discovery import find_residual, router_source


def _layer_of(module_path: str, what: str) -> str:
    path = layer_path(module_path)
    if path is None:
        raise DiscoveryError(f"{what} {module_path} is not inside a repeated decoder layer (no '.N.' in its path)")
    return path


def _attention_block(match: AttentionMatch, layer: str, proj_modules: set[str]) -> tuple[AttentionBlock, object]:
    residual = find_residual(match.o_proj.node, match.q_proj.input, layer, "attention")
    source = router_source(residual, [match.q_proj.node], proj_modules, layer, "attention")
    block = AttentionBlock(
        q_proj=match.q_proj.module_path, k_proj=match.k_proj.module_path, v_proj=match.v_proj.module_path,
        o_proj=match.o_proj.module_path, router_source=source, num_heads=match.num_heads,
        num_kv_heads=match.num_kv_heads, head_dim=match.head_dim,
        fused_qkv=match.q_proj.module_path == match.k_proj.module_path, core=match.kind,
    )
    return block, residual


def _mlp_block(match: MlpMatch, layer: str, proj_modules: set[str]) -> tuple[MlpBlock, object]:
    first_in = match.in_projs[0].input
    residual = find_residual(match.down.node, first_in, layer, "MLP")
    source = router_source(residual, [p.node for p in match.in_projs], proj_modules, layer, "MLP")
    block = MlpBlock(
        in_projs=tuple(p.module_path for p in match.in_projs), down_proj=match.down.module_path,
        router_source=source, intermediate=match.down.in_features, gated=match.gated,
        activation=match.activation, fused_gate_up=match.gated and len(match.in_projs) == 1,
    )
    return block, residual


def discover(model: torch.nn.Module, allow_partial: bool = False) -> ModelBlueprint:
    """Find every decoder layer's attention and MLP blocks of ``model`` from its captured graph.

    Raises :class:`DiscoveryError` naming the layer and what is missing or ambiguous; with
    ``allow_partial=True`` layers without a recognisable MLP or attention keep only what was found.
    """
    captured = capture(model)
    order = {node: i for i, node in enumerate(captured.graph.nodes)}
    projections = find_projections(captured)
    attentions = find_attention(captured.graph, projections)
    if not attentions:
        raise DiscoveryError(
            f"{type(model).__name__}: no attention block found (neither scaled_dot_product_attention nor "
            "softmax(Q K^T) V); unsupported architecture"
        )

    claimed: set[str] = set()
    attn_by_layer: dict[str, AttentionMatch] = {}
    for match in attentions:
        layer = _layer_of(match.o_proj.module_path, "attention output projection")
        if layer in attn_by_layer:
            raise DiscoveryError(f"layer {layer}: more than one attention block (unsupported block pattern)")
        attn_by_layer[layer] = match
        claimed.update(p.module_path for p in (match.q_proj, match.k_proj, match.v_proj, match.o_proj))

    by_layer: dict[str, list[Projection]] = defaultdict(list)
    for proj in projections.values():
        layer = layer_path(proj.module_path)
        if layer is not None and proj.module_path not in claimed:
            by_layer[layer].append(proj)

    proj_modules = {p.module_path for p in projections.values()}
    layers = []
    for index, layer in enumerate(sorted(set(attn_by_layer) | set(by_layer), key=_natural_key)):
        mlps = find_mlp(by_layer.get(layer, []), projections, order)
        if len(mlps) > 1:
            raise DiscoveryError(
                f"layer {layer}: ambiguous MLP, several down projections {[m.down.module_path for m in mlps]}"
            )
        used = {p.module_path for m in mlps for p in (*m.in_projs, m.down)}
        leftover = sorted(p.module_path for p in by_layer.get(layer, []) if p.module_path not in used)
        if leftover and not allow_partial:
            raise DiscoveryError(f"layer {layer}: projections {leftover} match no attention or MLP block")
        missing = [name for name, found in (("attention", layer in attn_by_layer), ("MLP", bool(mlps))) if not found]
        if missing and not allow_partial:
            raise DiscoveryError(f"layer {layer}: no {' and no '.join(missing)} block found")
        attn_block = mlp_block = attn_res = mlp_res = None
        if layer in attn_by_layer:
            attn_block, attn_res = _attention_block(attn_by_layer[layer], layer, proj_modules)
        if mlps:
            mlp_block, mlp_res = _mlp_block(mlps[0], layer, proj_modules)
        parallel = attn_res is not None and attn_res is mlp_res
        layers.append(LayerBlocks(index, layer, attn_block, mlp_block, parallel))

    hidden = model.get_input_embeddings().embedding_dim
    return ModelBlueprint(type(model).__name__, int(hidden), tuple(layers))


def _natural_key(path: str):
    return [int(p) if p.isdigit() else p for p in path.split(".")]
