"""wide-compile: token-level dynamic width pruning (WIDE) for HuggingFace causal LMs.

    import wide_compile
    model = wide_compile.apply(model, sparsity=0.5)   # routers + dynamic-width ops, still an HF model
    wide_compile.describe(model)                      # what was found, per layer and block
"""

__version__ = "0.1.0"

from . import ops  # noqa: F401  (registers the wide:: custom ops)
from .backend import compile_report, wide_backend  # noqa: F401  (registers the "wide" torch.compile backend)
from .api import (
    WideError,
    apply,
    config_of,
    describe,
    forced,
    is_applied,
    remove,
    router_parameter_fraction,
    router_parameters,
    routers,
    set_forced,
    set_temperature,
    skip_rates,
    track_skip_rates,
)
from .config import WideConfig
from .evaluation.harness import evaluate
from .serialization import load, load_routers, save
from .state import realized_masks, skip_rate_tensors
from .training import TrainConfig, TrainResult, train

__all__ = [
    "WideConfig", "WideError", "apply", "evaluate", "load", "load_routers", "save", "config_of", "describe", "forced", "is_applied", "realized_masks",
    "remove", "router_parameter_fraction", "router_parameters", "routers", "set_forced", "set_temperature", "skip_rate_tensors", "skip_rates",
    "track_skip_rates", "train", "TrainConfig", "TrainResult",
]
