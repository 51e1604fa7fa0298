"""Models for the end-to-end benchmark (``e2e.py``); its roofline bounds are in ``e2e_bounds``, the static caches and
timed runs in ``wide_compile.speed``.

- :func:`build_models`: a dense model and a WIDE twin that *shares its weights* (one copy in memory; the twin gets
  ``wide_compile.apply``, ``wide_compile.speed.dense_and_wide``). ``llama3-8b-shape`` is built directly on the target
  device and dtype with random weights; ``smollm2`` loads an HF folder (or ``wide_compile.model_zoo``) and trained
  routers; ``tiny`` is a small random Llama.
- The realized masks of the WIDE twin, and their skip rates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

import wide_compile
from wide_compile.speed import dense_and_wide
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
    dense, wide, router_source = dense_and_wide(dense, routers=routers, sparsity=sparsity, seed=seed,
                                                ffn_group_size=ffn_group)
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


# ----------------------------------------------------------------------------------------------- masks, byte bound
def snapshot_masks(wide: nn.Module) -> dict[tuple[int, str], torch.Tensor]:
    """The realized masks of the last forward as bool copies (read right after the call: CUDA-graph outputs are
    overwritten by the next replay)."""
    return {key: mask.detach().bool().clone() for key, mask in wide_compile.realized_masks(wide).items()}


def clear_masks(wide: nn.Module) -> None:
    state = get_state(wide)
    state.packed_masks = None
    for block in state.blocks:
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
