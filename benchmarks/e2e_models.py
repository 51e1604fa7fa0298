"""Models and static KV caches for the end-to-end benchmark (``e2e.py``); its roofline bounds are in ``e2e_bounds``.

- :func:`build_models`: a dense model and a WIDE twin that *shares its weights* (one copy in memory; the twin gets
  ``wide_compile.apply``). ``llama3-8b-shape`` is built directly on the target device and dtype with random weights;
  ``smollm2`` loads an HF folder (or ``wide_compile.model_zoo``) and trained routers; ``tiny`` is a small random Llama.
- Static caches: created and initialised before any compiled call (so their K/V tensors are static-address inputs of
  the CUDA graphs), filled with random K/V, positioned by setting each layer's ``cumulative_length`` in place.
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
