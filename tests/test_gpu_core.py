"""The core transformation on a CUDA GPU in bf16 (skipped without CUDA)."""

import copy

import pytest
import torch

import wide_compile
from wide_compile.testing.tiny_models import tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("family", ["llama", "phi3", "gpt2", "gemma2", "falcon"])
def test_bf16_cuda_all_execute_and_generate(family):
    base = tiny_model(family, dtype=torch.bfloat16).cuda()
    wide = wide_compile.apply(copy.deepcopy(base), ffn_group_size=32)
    ids = torch.randint(3, 128, (2, 11), device="cuda")
    with torch.no_grad():
        ref = base(ids).logits
        with wide_compile.forced(wide, "execute"):
            out = wide(ids).logits
            gen = wide.generate(ids, max_new_tokens=6, do_sample=False)
        wide(ids)
    assert torch.equal(out, ref)
    assert torch.equal(gen, base.generate(ids, max_new_tokens=6, do_sample=False))
    masks = wide_compile.realized_masks(wide)
    assert all(m.is_cuda for m in masks.values())
    assert wide_compile.routers(wide)[0].w_in.is_cuda
