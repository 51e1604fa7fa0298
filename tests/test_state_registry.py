"""Hooks find their model's state through ``wide_compile.state_registry`` (by key, not by attribute)."""
from __future__ import annotations

import copy
import gc

import pytest
import torch

import wide_compile
from wide_compile.state import get_state
from wide_compile.state_registry import _LIVE_STATES, live_state
from wide_compile.testing.tiny_models import tiny_model


def _model():
    return wide_compile.apply(tiny_model("llama", dtype=torch.float32), sparsity=0.5, ffn_group_size=32).eval()


def test_hooks_reach_their_own_models_state():
    model = _model()
    state = get_state(model)
    assert live_state(state.registry_key) is state
    assert {entry.hook.state_key for entry in state.hooks} == {state.registry_key}


def test_a_deep_copy_gets_its_own_state_and_hooks_point_at_it():
    model = _model()
    clone = copy.deepcopy(model)
    state, cloned = get_state(model), get_state(clone)
    assert cloned is not state and cloned.registry_key != state.registry_key
    assert {entry.hook.state_key for entry in cloned.hooks} == {cloned.registry_key}
    assert all(entry.module is clone.get_submodule(entry.path) for entry in cloned.hooks)
    ids = torch.randint(3, 120, (2, 5))
    with torch.no_grad():
        model(ids, use_cache=False)
        assert cloned.packed_masks is None  # the original's forward wrote its own state only
        torch.testing.assert_close(clone(ids, use_cache=False).logits, model(ids, use_cache=False).logits)
    assert cloned.packed_masks is not None


def test_a_freed_model_leaves_the_registry():
    """Collection does not touch the registry's dict (Dynamo may be iterating over it while the collector runs); the
    freed entry answers with a clear error at once and is dropped by the next registration."""
    model = _model()
    key = get_state(model).registry_key
    size = len(_LIVE_STATES)
    del model
    gc.collect()
    assert len(_LIVE_STATES) == size
    with pytest.raises(RuntimeError, match="no longer exists"):
        live_state(key)
    other = _model()
    assert key not in _LIVE_STATES
    assert live_state(get_state(other).registry_key) is get_state(other)


def test_an_unpickled_model_gets_its_own_state():
    """``pickle`` (``torch.save`` of a whole model) re-registers the state: the copy's hooks do not reach back into
    the original's state (its key would name another model, or none, in a new process)."""
    import pickle

    model = _model()
    clone = pickle.loads(pickle.dumps(model))
    state, cloned = get_state(model), get_state(clone)
    assert cloned.registry_key != state.registry_key
    assert {entry.hook.state_key for entry in cloned.hooks} == {cloned.registry_key}
    ids = torch.randint(3, 120, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(clone(ids, use_cache=False).logits, model(ids, use_cache=False).logits)
    assert cloned.packed_masks is not None and cloned.blocks[0].router is clone.get_submodule(
        cloned.blocks[0].layer_path + ".wide_routers.attention")
