"""Models, static KV caches and the union-of-masks byte bound for the end-to-end benchmark (``e2e.py``).

- :func:`build_models`: a dense model and a WIDE twin that *shares its weights* (one copy in memory; the twin gets
  ``wide_compile.apply``). ``llama3-8b-shape`` is built directly on the target device and dtype with random weights;
  ``smollm2`` loads an HF folder (or ``wide_compile.model_zoo``) and trained routers; ``tiny`` is a small random Llama.
- Static caches: created and initialised before any compiled call (so their K/V tensors are static-address inputs of
  the CUDA graphs), filled with random K/V, positioned by setting each layer's ``cumulative_length`` in place.
- :func:`decode_byte_bound`: weight (and K/V) bytes a decode step must read given the realized masks of a batch: per
  layer and projection, a group is read when at least one token of the batch needs it; K/V projections, norms,
  embedding rows and the LM head stay dense.
"""

from __future__ import annotations

import copy
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

import wide_compile
from wide_compile.state import get_state

MODELS = ("llama3-8b-shape", "smollm2", "tiny")

# Llama-3-8B: hidden 4096, intermediate 14336, 32 layers, 32 q / 8 kv heads, vocab 128256, rope theta 500000.
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=131072)
TINY = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1024, rope_theta=10000.0, max_position_embeddings=4096)
TINY_FFN_GROUP = 64  # 8 MLP groups per layer in the tiny model (the default 128 would give 4)


@dataclass
class BenchModels:
    name: str
    dense: nn.Module
    wide: nn.Module
    info: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------- building
def _random_llama(shape: dict, layers: int | None, device: torch.device, dtype: torch.dtype, seed: int) -> nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**{**shape, "num_hidden_layers": layers or shape["num_hidden_layers"]})
    torch.manual_seed(seed)
    with torch.device(device):  # parameters are created and initialised on the device, in ``dtype``
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def weight_sharing_twin(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` whose parameters and buffers are the *same tensors* (no extra memory)."""
    tensors = list(model.parameters()) + list(model.buffers())
    twin = copy.deepcopy(model, memo={id(t): t for t in tensors})
    shared = {t.data_ptr() for t in tensors}
    if any(t.data_ptr() not in shared for t in list(twin.parameters()) + list(twin.buffers())):
        raise RuntimeError("weight_sharing_twin: the twin has tensors of its own (expected shared weights)")
    return twin


def _load_smollm2(model_dir: str | None, device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, str]:
    if model_dir:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        source = str(model_dir)
    else:
        from wide_compile.model_zoo import load_model

        model, _ = load_model("smollm2")
        source = "wide_compile.model_zoo.load_model('smollm2')"
    return model.to(device=device, dtype=dtype).eval(), source


def _apply_with_routers(twin: nn.Module, routers: str | None, sparsity: float, seed: int,
                        ffn_group_size: int) -> str:
    """apply() to the twin; with ``routers``: the saved config (wide_config.json) and the trained routers."""
    if routers is None:
        wide_compile.apply(twin, sparsity=sparsity, ffn_group_size=ffn_group_size, seed=seed)
        return f"random (seed {seed}, zero output bias: argmax gives ~50% token-dependent skips)"
    folder = Path(routers)
    folder = folder if folder.is_dir() else folder.parent
    meta_file = folder / wide_compile.serialization.CONFIG_FILE
    if meta_file.exists():
        config = wide_compile.WideConfig.from_dict(json.loads(meta_file.read_text())["config"])
        wide_compile.apply(twin, config=config)
    else:
        wide_compile.apply(twin, sparsity=sparsity, ffn_group_size=ffn_group_size, seed=seed)
    wide_compile.load_routers(twin, routers)
    return f"trained, loaded from {routers}"


def build_models(name: str, device: torch.device, dtype: torch.dtype, *, layers: int | None = None,
                 routers: str | None = None, model_dir: str | None = None, sparsity: float = 0.5,
                 seed: int = 0) -> BenchModels:
    """Dense model + weight-sharing WIDE twin (see module docstring)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {MODELS}")
    if name == "smollm2":
        if layers is not None:
            raise ValueError("--layers applies to the random-weight models only (trained routers fit all layers)")
        dense, source = _load_smollm2(model_dir, device, dtype)
        ffn_group = 128
    else:
        if routers is not None:
            raise ValueError("--routers applies to --model smollm2 only (the other models have random weights)")
        shape = LLAMA3_8B if name == "llama3-8b-shape" else TINY
        dense = _random_llama(shape, layers, device, dtype, seed)
        source = "random weights (HF init, std 0.02), built on the device"
        ffn_group = 128 if name == "llama3-8b-shape" else TINY_FFN_GROUP
    wide = weight_sharing_twin(dense)
    router_source = _apply_with_routers(wide, routers, sparsity, seed, ffn_group)
    wide.eval()
    state = get_state(wide)
    config = dense.config
    info = {
        "name": name, "weights": source, "routers": router_source, "dtype": str(dtype).replace("torch.", ""),
        "layers": config.num_hidden_layers, "hidden": config.hidden_size, "intermediate": config.intermediate_size,
        "heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads, "vocab": config.vocab_size,
        "parameters": sum(p.numel() for p in dense.parameters()),
        "router_parameter_fraction": wide_compile.router_parameter_fraction(wide),
        "wide_config": state.config.to_dict(),
        "groups": sorted({(b.kind, b.groups, b.group_width) for b in state.blocks}),
    }
    return BenchModels(name, dense, wide, info)


# ----------------------------------------------------------------------------------------------- static caches
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
                           "(the benchmark positions the cache through it; 5.17 and 5.24 have it)")
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


# ----------------------------------------------------------------------------------------------- masks, byte bound
def snapshot_masks(wide: nn.Module) -> dict[tuple[int, str], torch.Tensor]:
    """The realized masks of the last forward as bool copies (read right after the call: CUDA-graph outputs are
    overwritten by the next replay)."""
    return {b.key: b.mask.detach().bool().clone() for b in get_state(wide).blocks if b.mask is not None}


def clear_masks(wide: nn.Module) -> None:
    for block in get_state(wide).blocks:
        block.mask = None


def skip_rates(masks: dict[tuple[int, str], torch.Tensor]) -> dict:
    """Mean skipped fraction of (token, group) pairs per kind, and the per-block range."""
    per_kind: dict[str, list[float]] = {}
    for (_, kind), mask in masks.items():
        per_kind.setdefault(kind, []).append(1.0 - mask.float().mean().item())
    out = {kind: sum(v) / len(v) for kind, v in per_kind.items()}
    out["mean"] = sum(out.values()) / max(1, len(out))
    out["block_min"] = min(min(v) for v in per_kind.values()) if per_kind else float("nan")
    out["block_max"] = max(max(v) for v in per_kind.values()) if per_kind else float("nan")
    return out


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
