"""Tiny random-weight configs of many HF causal-LM families, for tests and quick checks (CPU, seconds)."""

from __future__ import annotations

import torch

_COMMON = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)

# family -> (model_type, overrides). Chosen to cover MHA/GQA/MQA, fused qkv, fused gate_up, Conv1D,
# parallel residuals, post-norms, q/k norms, eager and SDPA attention.
FAMILIES: dict[str, tuple[str, dict]] = {
    "llama": ("llama", dict(intermediate_size=128, num_key_value_heads=2)),
    "mistral": ("mistral", dict(intermediate_size=128, num_key_value_heads=2)),
    "qwen2": ("qwen2", dict(intermediate_size=128, num_key_value_heads=2)),
    "qwen3": ("qwen3", dict(intermediate_size=128, num_key_value_heads=2, head_dim=16)),
    "gemma": ("gemma", dict(intermediate_size=128, num_key_value_heads=1, head_dim=16)),
    "gemma2": ("gemma2", dict(intermediate_size=128, num_key_value_heads=2, head_dim=16)),
    "gemma3": ("gemma3_text", dict(intermediate_size=128, num_key_value_heads=2, head_dim=16)),
    "phi3": ("phi3", dict(intermediate_size=128, num_key_value_heads=2)),
    "gpt2": ("gpt2", dict(n_embd=64, n_layer=2, n_head=4, n_positions=128)),
    "gpt_neox": ("gpt_neox", dict(intermediate_size=128)),
    "opt": ("opt", dict(ffn_dim=128, word_embed_proj_dim=64)),
    "falcon": ("falcon", dict(new_decoder_architecture=False, multi_query=True, parallel_attn=True)),
    "stablelm": ("stablelm", dict(intermediate_size=128, num_key_value_heads=2)),
    "olmo2": ("olmo2", dict(intermediate_size=128, num_key_value_heads=2)),
    "granite": ("granite", dict(intermediate_size=128, num_key_value_heads=2)),
    "phi": ("phi", dict(intermediate_size=128)),
    "gptj": ("gptj", dict(n_embd=64, n_layer=2, n_head=4, n_positions=128, rotary_dim=8)),
    "cohere": ("cohere", dict(intermediate_size=128, num_key_value_heads=2)),
}

# More families, checked for discovery + all-execute exactness only (keeps the suite fast).
EXTRA_FAMILIES: dict[str, tuple[str, dict]] = {
    "starcoder2": ("starcoder2", dict(intermediate_size=128, num_key_value_heads=2)),
    "gpt_bigcode": ("gpt_bigcode", dict(n_embd=64, n_layer=2, n_head=4, multi_query=True)),
    "codegen": ("codegen", dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8)),
    "mpt": ("mpt", dict(d_model=64, n_layers=2, n_heads=4)),
    "persimmon": ("persimmon", dict(intermediate_size=128)),
    "nemotron": ("nemotron", dict(intermediate_size=128, num_key_value_heads=2)),
    "olmo": ("olmo", dict(intermediate_size=128, num_key_value_heads=2)),
    "smollm3": ("smollm3", dict(intermediate_size=128, num_key_value_heads=2)),
    "glm": ("glm", dict(intermediate_size=128, num_key_value_heads=2)),
    "helium": ("helium", dict(intermediate_size=128, num_key_value_heads=2, head_dim=16)),
}

# Families whose blocks discovery must refuse with a clear error (mixture-of-experts MLPs).
UNSUPPORTED_FAMILIES: dict[str, tuple[str, dict]] = {
    "mixtral": ("mixtral", dict(intermediate_size=128, num_key_value_heads=2, num_local_experts=4,
                                num_experts_per_tok=2)),
}


def tiny_config(family: str):
    """A tiny config of ``family`` (see :data:`FAMILIES`)."""
    from transformers import AutoConfig

    known = {**FAMILIES, **EXTRA_FAMILIES, **UNSUPPORTED_FAMILIES}
    if family not in known:
        raise KeyError(f"unknown family {family!r}; known: {sorted(known)}")
    model_type, overrides = known[family]
    config = AutoConfig.for_model(model_type, **{**_COMMON, **overrides})
    for attr in ("attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout",
                 "dropout", "activation_dropout", "summary_first_dropout"):
        if hasattr(config, attr):
            setattr(config, attr, 0.0)
    return config


def tiny_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float32):
    """A tiny random-weight causal LM of ``family`` in eval mode (dropout off)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family), dtype=dtype)
    return model.eval()
