"""Compiled WIDE inference does not guard the routers' temperature buffers on every call.

``decisions._temperature``: a noise-free decision without autograd does not depend on the Gumbel temperature, so
``decide`` passes a constant there instead of ``router.tau``. Reading the buffer would make it a graph input whose
tensor guard Dynamo keeps even with ``skip_guard_eval_unsafe`` (tensor guards of buffers are "diff" guards), reached
through each hook object: on an 8-layer model that took the diff-guard sources from 48 (the dense model's) to 235.

``wide_compile.state_registry``: hooks reach the shared state through one global, so Dynamo adds no "these two
attribute chains are the same object" guards (which ``skip_guard_eval_unsafe`` evaluates in Python on every call).
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


def _compiled_entries(model):
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    entries = []
    for fn in (type(model).forward, getattr(type(model).forward, "__wrapped__", None)):
        if fn is not None:
            entries += _debug_get_cache_entry_list(fn.__code__)
    return entries


def test_compiled_inference_guards_no_router_buffer():
    torch._dynamo.reset()
    model = wide_compile.apply(tiny_model("llama", dtype=torch.float32), sparsity=0.5, ffn_group_size=32).eval()
    compiled = torch.compile(model, backend="wide", options={"wide.inner": "eager"})
    ids = torch.randint(3, 120, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids, use_cache=False).logits, model(ids, use_cache=False).logits,
                                   rtol=0, atol=0)
    entries = _compiled_entries(model)
    sources = [str(s) for e in entries for s in getattr(e.guard_manager, "diff_guard_sources", ())]
    if not entries or not sources:
        pytest.skip("this torch version exposes no diff-guard sources on its cache entries")
    assert not [s for s in sources if "tau" in s or "_forward_pre_hooks" in s]


def test_hooks_add_no_identity_guards_between_attribute_chains():
    """The guards ``skip_guard_eval_unsafe`` keeps (the diff-guard tree) hold no ``a is b`` check that walks into a
    hook: with a ``state`` attribute on every hook there was one per hook and per routed block."""
    torch._dynamo.reset()
    model = wide_compile.apply(tiny_model("llama", dtype=torch.float32), sparsity=0.5, ffn_group_size=32).eval()
    compiled = torch.compile(model, backend="wide", options={"wide.inner": "eager"})
    ids = torch.randint(3, 120, (1, 6))
    with torch.no_grad():
        compiled(ids, use_cache=False)
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            torch.testing.assert_close(compiled(ids, use_cache=False).logits, model(ids, use_cache=False).logits,
                                       rtol=0, atol=0)
    entries = _compiled_entries(model)
    managers = [e.guard_manager for e in entries if getattr(e.guard_manager, "diff_guard_root", None) is not None]
    if not managers:
        pytest.skip("this torch version exposes no diff-guard tree on its cache entries")
    for manager in managers:
        root = manager.root
        try:
            manager.root = manager.diff_guard_root  # the printer walks ``root``
            text = str(manager)
        finally:
            manager.root = root
        hook_identity = [line for line in text.splitlines() if " is " in line and "_forward_pre_hooks" in line]
        assert not hook_identity, hook_identity[:2]
