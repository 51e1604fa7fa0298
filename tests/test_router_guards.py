"""Compiled WIDE inference does not guard the routers' temperature buffers on every call.

``decisions._temperature``: a noise-free decision without autograd does not depend on the Gumbel temperature, so
``decide`` passes a constant there instead of ``router.tau``. Reading the buffer would make it a graph input whose
tensor guard Dynamo keeps even with ``skip_guard_eval_unsafe`` (tensor guards of buffers are "diff" guards), reached
through each hook object: on an 8-layer model that took the diff-guard sources from 48 (the dense model's) to 235.
"""
from __future__ import annotations

import pytest
import torch

import wide_compile
from wide_compile.decisions import _temperature
from wide_compile.testing.tiny_models import tiny_model


def test_temperature_is_the_buffer_only_where_it_matters():
    model = wide_compile.apply(tiny_model("llama", dtype=torch.float32), sparsity=0.5, ffn_group_size=32)
    router = wide_compile.api.routers(model)[0]
    router.tau.fill_(3.0)
    logits = torch.randn(2, 5, router.groups, 2)
    assert _temperature(router, logits, torch.zeros_like(logits)) is router.tau  # Gumbel noise (training)
    assert _temperature(router, logits, None) is router.tau  # autograd on: the straight-through gradient uses it
    with torch.no_grad():
        constant = _temperature(router, logits, None)
    assert constant is not router.tau and constant.item() == 1.0 and constant.dtype == torch.float32


def test_compiled_inference_guards_no_router_buffer():
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    torch._dynamo.reset()
    model = wide_compile.apply(tiny_model("llama", dtype=torch.float32), sparsity=0.5, ffn_group_size=32).eval()
    compiled = torch.compile(model, backend="wide", options={"wide.inner": "eager"})
    ids = torch.randint(3, 120, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids, use_cache=False).logits, model(ids, use_cache=False).logits,
                                   rtol=0, atol=0)
    entries = []
    for fn in (type(model).forward, getattr(type(model).forward, "__wrapped__", None)):
        if fn is not None:
            entries += _debug_get_cache_entry_list(fn.__code__)
    sources = [str(s) for e in entries for s in getattr(e.guard_manager, "diff_guard_sources", ())]
    if not entries or not sources:
        pytest.skip("this torch version exposes no diff-guard sources on its cache entries")
    assert not [s for s in sources if "tau" in s or "_forward_pre_hooks" in s]
