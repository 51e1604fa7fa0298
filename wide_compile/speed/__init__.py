"""Speed of a WIDE model against its dense self, both through ``torch.compile`` on static KV caches.

:func:`measure_speed` (and ``wide-compile bench``) times decode steps and time to first token; the pieces it is made
of (static caches, the timing clock, the weight-sharing twin, the decode / prefill runs) are what
``benchmarks/e2e.py`` builds its fuller benchmark (bounds, profiles, budgets) from.
"""

from .clock import Clock, summary
from .measure import SpeedReport, measure_speed
from .runs import DecodeRun, PrefillRun, time_decode, time_prefill
from .static_cache import (
    cache_argument, cache_bytes, fill_cache_random, forward_kwargs, new_static_cache, set_cache_length,
)
from .twin import dense_and_wide, weight_sharing_twin
from .variants import compile_variant

__all__ = [
    "Clock", "DecodeRun", "PrefillRun", "SpeedReport", "cache_argument", "cache_bytes", "compile_variant",
    "dense_and_wide",
    "fill_cache_random", "forward_kwargs", "measure_speed", "new_static_cache", "set_cache_length", "summary",
    "time_decode", "time_prefill", "weight_sharing_twin",
]
