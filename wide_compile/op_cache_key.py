"""The ``wide::`` custom ops' part of Inductor's cache key.

Inductor's FX-graph cache and the AOTAutograd cache treat a custom op (an ``OpOverload``) as cacheable and key a
compiled graph on the op's name and schema, not on its implementation. When a wide_compile update changes what an op's
fake returns (its output layout, for example ``wide::group_attention``'s token-major output since stop 13), a graph
compiled by the previous version and found in the on-disk cache asserts the old layout at run time ("expected size
..., stride ... Error in op: torch.ops.wide.group_attention.default"). The backend therefore compiles with a hash of
the op modules' source in Inductor's config, through ``unsafe_marked_cacheable_functions``: a config dict that is part
of the cache key, documented for keying custom functions. Any change to those modules compiles afresh.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

OP_MODULES = ("wide_compile.ops", "wide_compile.kernel_ops", "wide_compile.group_attention_op",
              "wide_compile.mask_extents_op", "wide_compile.router_mask_op", "wide_compile.dense_siblings_op",
              "wide_compile.realize_op", "wide_compile.group_rows_op")
CACHE_KEY_CONFIG = "unsafe_marked_cacheable_functions"


@functools.lru_cache(maxsize=None)
def op_source_key(modules: tuple[str, ...] = OP_MODULES) -> str:
    """16 hex digits of a SHA-256 over the source files of ``modules`` (default: where the ops and their fakes
    live)."""
    digest = hashlib.sha256()
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ImportError(f"op_cache_key: cannot find the source of {name}")
        digest.update(name.encode())
        digest.update(Path(spec.origin).read_bytes())
    return digest.hexdigest()[:16]


def cache_key_options() -> dict:
    """``{CACHE_KEY_CONFIG: {"torch.ops.wide": op_source_key()}}``, or ``{}`` on a torch whose Inductor lacks it."""
    from torch._inductor import config

    if CACHE_KEY_CONFIG not in config.get_config_copy():
        return {}
    return {CACHE_KEY_CONFIG: {"torch.ops.wide": op_source_key()}}


__all__ = ["CACHE_KEY_CONFIG", "OP_MODULES", "cache_key_options", "op_source_key"]
