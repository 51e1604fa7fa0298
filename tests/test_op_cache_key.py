"""The ``wide::`` ops' source hash in Inductor's cache key (``wide_compile/op_cache_key.py``)."""
from __future__ import annotations

import sys

import pytest
import torch

import wide_compile.backend
from wide_compile import op_cache_key


def test_key_is_a_stable_hash_of_the_op_modules():
    key = op_cache_key.op_source_key()
    assert len(key) == 16 and int(key, 16) >= 0
    op_cache_key.op_source_key.cache_clear()
    assert op_cache_key.op_source_key() == key


def test_key_changes_with_an_op_module_source(tmp_path, monkeypatch):
    (tmp_path / "fake_ops_module.py").write_text("def fake(x):\n    return x.new_empty(x.shape)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = op_cache_key.op_source_key(("fake_ops_module",))
    (tmp_path / "fake_ops_module.py").write_text("def fake(x):\n    return x.new_empty(x.shape).t()\n")
    op_cache_key.op_source_key.cache_clear()
    assert op_cache_key.op_source_key(("fake_ops_module",)) != before
    sys.modules.pop("fake_ops_module", None)
    with pytest.raises(ImportError, match="cannot find the source of no_such_wide_module"):
        op_cache_key.op_source_key(("no_such_wide_module",))


def test_backend_compiles_with_the_key_in_inductors_config():
    """The key reaches Inductor's config (hence its FX-graph cache key) through the backend's defaults."""
    if op_cache_key.CACHE_KEY_CONFIG not in torch._inductor.config.get_config_copy():
        assert op_cache_key.cache_key_options() == {}
        pytest.skip("this torch's Inductor has no config dict that keys custom functions")
    wanted = {"torch.ops.wide": op_cache_key.op_source_key()}
    assert wide_compile.backend.inductor_defaults()[op_cache_key.CACHE_KEY_CONFIG] == wanted
    settings = wide_compile.backend.parse_settings(None, {"combo_kernels": False})
    assert settings.inductor_options[op_cache_key.CACHE_KEY_CONFIG] == wanted
