"""Baselines the WIDE method is compared with, built on the same routed-block structure.

* :func:`apply_depth_skip`: dynamic depth (SkipGPT style): one group per attention / MLP block, so a
  router decides per token whether the whole block runs.
* :func:`apply_static_width`: static width (FLAP / Wanda-sp style): one fixed set of head groups and FFN
  channel groups per layer, for every token, chosen from calibration activations.
"""

from wide_compile.baselines.calibration import calibration_batches
from wide_compile.baselines.depth_skip import apply_depth_skip, block_sizes
from wide_compile.baselines.static_width import StaticMasks, apply_static_width, static_masks

__all__ = ["StaticMasks", "apply_depth_skip", "apply_static_width", "block_sizes", "calibration_batches",
           "static_masks"]
