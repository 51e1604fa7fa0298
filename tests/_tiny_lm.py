"""Tiny random causal LMs and a byte-level tokenizer for fast, hub-free tests."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_SIZE = 260  # 256 byte symbols + <eos> + spare rows


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level tokenizer (one token per UTF-8 byte, no merges): any text, no unknown tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={sym: i for i, sym in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


def tiny_llama(seed: int = 0, **config_overrides) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **config_overrides,
    )
    return LlamaForCausalLM(config).eval()


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB_SIZE, n_embd=32, n_layer=2, n_head=4, n_positions=256)
    return GPT2LMHeadModel(config).eval()


def save_tiny_llama(folder: Path, seed: int = 0) -> Path:
    """Write a tiny random Llama + byte tokenizer as a plain HF folder; returns ``folder``."""
    tiny_llama(seed).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


SAMPLE_TEXT = (
    " = Tiny Article = \n The quick brown fox jumps over the lazy dog . Pack my box with five dozen "
    "liquor jugs . How vexingly quick daft zebras jump ! \n"
)
