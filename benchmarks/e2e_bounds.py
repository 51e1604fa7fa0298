"""Roofline bounds of the end-to-end benchmark, from the masks the routers realized.

- Decode (``decode_byte_bound``): weight bytes one step must read, dense vs the union of the batch's masks.
- Prefill (``prefill_flop_bound``): matmul FLOPs of one prompt, dense vs WIDE, two ways: *exact* (every token
  computes only its active groups: the issue's ~1.9x at 50%) and *tile* (the input-group projections, o_proj and
  down_proj, skip a group only when no token of a 128-token tile needs it: what a tile-skipping GEMM can reach;
  with i.i.d. masks almost no tile skips anything, so those projections stay dense).
"""

from __future__ import annotations

import torch
from torch import nn

import wide_compile
from wide_compile.state import get_state

PREFILL_TILE = 128


def _bytes(model: nn.Module, path: str) -> int:
    module = model.get_submodule(path)
    return sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))


def _unique_param_bytes(model: nn.Module, skip: set[int] = frozenset()) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in skip)


def decode_byte_bound(wide: nn.Module, steps: list[dict[tuple[int, str], torch.Tensor]], batch: int,
                      kv_slots: int) -> dict:
    """Bytes one decode step of ``batch`` tokens must read, dense vs the union of the realized masks.

    ``steps``: realized masks (``snapshot_masks``) of several decode steps, each ``[batch, 1, groups]``. A group's
    rows of q_proj / o_proj (attention) and of gate, up and down (MLP) are read when any token of the batch needs
    it; K/V projections, norms, the LM head and the router weights are read in full, the embedding only for the
    batch's rows. K/V cache: ``kv_slots`` per sequence (a static cache reads all its slots); with head-group
    skipping in attention, a (sequence, KV head) pair is read when one of its query heads is active.
    """
    state = get_state(wide)
    embedding = wide.get_input_embeddings().weight
    routers = {id(p) for p in wide_compile.router_parameters(wide)}
    lm_head = wide.get_output_embeddings()
    tied = lm_head is not None and lm_head.weight is embedding
    skip = routers if tied else routers | {id(embedding)}
    dense = _unique_param_bytes(wide, skip) + batch * embedding.shape[1] * embedding.element_size()
    router_bytes = sum(p.numel() * p.element_size() for p in wide_compile.router_parameters(wide))

    layer_by_index = {layer.index: layer for layer in state.blueprint.layers}
    kv_dense = sum(2 * batch * kv_slots * layer.attention.num_kv_heads * layer.attention.head_dim
                   * embedding.element_size() for layer in state.blueprint.layers if layer.attention is not None)
    saved_per_step, kv_fraction, unions = [], [], {"attention": [], "mlp": []}
    for masks in steps:
        saved, kv_active, kv_total = 0.0, 0.0, 0
        for block in state.blocks:
            mask = masks[block.key].reshape(-1, block.groups)  # [batch tokens, groups]
            union = mask.any(0).float().mean().item()
            unions[block.kind].append(union)
            layer = layer_by_index[block.layer_index]
            if block.kind == "attention":
                a = layer.attention
                q_bytes = _bytes(wide, a.q_proj)
                if a.fused_qkv:
                    q_bytes = q_bytes * a.num_heads // (a.num_heads + 2 * a.num_kv_heads)
                saved += (1.0 - union) * (q_bytes + _bytes(wide, a.o_proj))
                heads = mask.repeat_interleave(a.num_heads // block.groups, dim=1)  # [batch, q heads]
                kv_active += heads.reshape(mask.shape[0], a.num_kv_heads, -1).any(-1).float().sum().item()
                kv_total += mask.shape[0] * a.num_kv_heads
            else:
                m = layer.mlp
                saved += (1.0 - union) * (sum(_bytes(wide, p) for p in m.in_projs) + _bytes(wide, m.down_proj))
        saved_per_step.append(saved)
        kv_fraction.append(kv_active / max(1, kv_total))

    saved = sum(saved_per_step) / len(saved_per_step)
    wide_bytes = dense - saved + router_bytes
    kv_frac = sum(kv_fraction) / len(kv_fraction)
    return {
        "batch": batch, "steps": len(steps),
        "weight_bytes_dense": dense, "weight_bytes_wide": wide_bytes, "router_bytes": router_bytes,
        "weight_fraction": wide_bytes / dense, "weight_bound_speedup": dense / wide_bytes,
        "union_active_attention": sum(unions["attention"]) / max(1, len(unions["attention"])),
        "union_active_mlp": sum(unions["mlp"]) / max(1, len(unions["mlp"])),
        "kv_bytes_dense": kv_dense, "kv_fraction_with_head_group_skip": kv_frac,
        "bound_speedup_weights_plus_kv_dense": (dense + kv_dense) / (wide_bytes + kv_dense),
        "bound_speedup_weights_plus_kv_skipped": (dense + kv_dense) / (wide_bytes + kv_frac * kv_dense),
    }


def _tile_union_fraction(mask: torch.Tensor, tile: int) -> float:
    """Mean over token tiles of the fraction of groups some token of the tile needs, weighted by tile size."""
    total, covered = 0, 0.0
    for start in range(0, mask.shape[0], tile):
        chunk = mask[start:start + tile]
        covered += chunk.any(0).float().mean().item() * chunk.shape[0]
        total += chunk.shape[0]
    return covered / max(1, total)


def prefill_flop_bound(wide: nn.Module, masks: dict[tuple[int, str], torch.Tensor], tile: int = PREFILL_TILE) -> dict:
    """Matmul FLOPs of one causal prefill from an empty cache (``masks``: ``snapshot_masks`` of that prefill, each
    ``[1, T, groups]``), dense vs WIDE exact and WIDE tile (see module docstring). K/V projections stay dense; the
    attention core counts ``4 * head_dim * (t + 1)`` per active query head of token ``t``; norms, RoPE and the LM
    head (one position) are left out."""
    state = get_state(wide)
    layer_by_index = {layer.index: layer for layer in state.blueprint.layers}
    hidden = wide.config.hidden_size
    dense = exact = tiled = 0.0
    for block in state.blocks:
        mask = masks[block.key].reshape(-1, block.groups) != 0  # [T, groups]
        tokens = mask.shape[0]
        active = mask.float().mean(1)  # per token
        act_sum, tile_frac = active.sum().item(), _tile_union_fraction(mask, tile)
        layer = layer_by_index[block.layer_index]
        if block.kind == "attention":
            a = layer.attention
            q_w, kv_w = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
            qo = 2 * hidden * q_w  # per token, each of q and o
            kv = 2 * tokens * 2 * hidden * kv_w
            positions = torch.arange(1, tokens + 1, dtype=torch.float64, device=active.device)
            core_dense = 4 * a.head_dim * a.num_heads * positions.sum().item()
            core_wide = 4 * a.head_dim * a.num_heads * (positions * active.double()).sum().item()
            dense += 2 * qo * tokens + kv + core_dense
            exact += 2 * qo * act_sum + kv + core_wide
            tiled += qo * act_sum + qo * tile_frac * tokens + kv + core_wide
        else:
            m = layer.mlp
            per_token = 2 * hidden * m.intermediate
            ins = 2 if m.gated else 1
            dense += (ins + 1) * per_token * tokens
            exact += (ins + 1) * per_token * act_sum
            tiled += ins * per_token * act_sum + per_token * tile_frac * tokens
    return {"tile_tokens": tile, "flops_dense": dense, "flops_wide_exact": exact, "flops_wide_tile": tiled,
            "exact_bound_speedup": dense / exact, "tile_bound_speedup": dense / tiled}
