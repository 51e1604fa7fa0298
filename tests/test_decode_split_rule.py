"""The decode kernel's chunk-count rule (H200 numbers: 132 SMs), without a GPU: masked (static-cache) decode uses
short chunks where few (batch, KV head) pairs leave SMs idle; unmasked decode keeps few long programs."""
from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")


@pytest.fixture
def decode(monkeypatch):
    from wide_compile.templates import attention_decode

    monkeypatch.setattr(attention_decode, "_device_sm_count", lambda device: 132)
    monkeypatch.setattr(attention_decode, "interpreting", lambda: False)
    return attention_decode


CUDA = torch.device("cuda")


@pytest.mark.parametrize("batch, splits, chunk", [(1, 16, 128), (8, 16, 128), (32, 4, 512)])
def test_masked_static_cache_rule_matches_the_sweep_optimum(decode, batch, splits, chunk):
    """2048 slots with an explicit mask: the (splits, chunk) that the H200 sweep found fastest
    (benchmarks/results/kernels_attention_static.json)."""
    assert decode.choose_num_splits(8 * batch, 2048, CUDA, masked=True) == (splits, chunk)


@pytest.mark.parametrize("batch_kv, kv_len, expected", [(8, 2048, (4, 512)), (8, 1024, (4, 256)),
                                                         (128, 1024, (1, 1024)), (8, 32768, (32, 1024)),
                                                         (32, 4096, (8, 512)), (32, 16384, (8, 2048)),
                                                         (128, 4096, (2, 2048)), (128, 32768, (2, 16384)),
                                                         (256, 4096, (1, 4096))])
def test_unmasked_rule_keeps_at_most_two_programs_per_sm(decode, batch_kv, kv_len, expected):
    """Without a mask: at most 2 x 132 programs over all pairs (the H200 sweep's optimum at 50%: one long program
    per SM), chunks of at least 512 keys; short caches keep their own rule."""
    splits, chunk = decode.choose_num_splits(batch_kv, kv_len, CUDA)
    assert (splits, chunk) == expected
    assert splits == 1 or batch_kv * splits <= 2 * 132
    assert splits * chunk >= kv_len > (splits - 1) * chunk


def test_explicit_arguments_override_the_masked_defaults(decode):
    assert decode.choose_num_splits(8, 2048, CUDA, min_chunk=512, masked=True) == (4, 512)
    assert decode.choose_num_splits(64, 2048, CUDA, programs_per_sm=1, masked=True) == (3, 768)
