"""Stage 2: PEFT LoRA adapters on the projections the discovery pass found (any architecture)."""

from __future__ import annotations

from torch import nn

from wide_compile.state import get_state


def lora_target_modules(model: nn.Module) -> list[str]:
    """Leaf names of every attention q/k/v/o and MLP in/down projection in the model's blueprint.

    Fused projections (``qkv_proj``, ``gate_up_proj``, ``c_attn``, ...) appear once under their own name.
    """
    names: list[str] = []
    for layer in get_state(model).blueprint.layers:
        paths: list[str] = []
        if layer.attention is not None:
            a = layer.attention
            paths += [a.q_proj, a.k_proj, a.v_proj, a.o_proj]
        if layer.mlp is not None:
            paths += [*layer.mlp.in_projs, layer.mlp.down_proj]
        names += [p.rsplit(".", 1)[-1] for p in paths]
    return list(dict.fromkeys(names))


def add_lora(model: nn.Module, r: int, alpha: int, dropout: float) -> nn.Module:
    """Wrap ``model`` with LoRA adapters (a ``PeftModel``); its routers stay trainable and WIDE keeps working."""
    try:
        import peft
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("stage 2 needs the 'peft' package: pip install 'wide-compile[train]'") from exc
    config = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=lora_target_modules(model),
                             bias="none", task_type="CAUSAL_LM")
    return peft.get_peft_model(model, config)


def lora_state_dict(model: nn.Module) -> dict:
    """The adapter weights of a ``PeftModel`` (empty for a model without adapters)."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(model).items()}


def load_lora_state_dict(model: nn.Module, state: dict) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"LoRA checkpoint does not fit this model: unexpected keys {unexpected[:3]}")
