"""Baselines the WIDE method is compared with, built on the same routed-block structure.

* :func:`apply_depth_skip`: dynamic depth (SkipGPT style): one group per attention / MLP block, so a
  router decides per token whether the whole block runs.
* :func:`apply_static_width`: static width (FLAP / Wanda-sp style): one fixed set of head groups and FFN
  channel groups per layer, for every token, chosen from calibration activations.
* :func:`apply_teal`: TEAL style, training-free magnitude sparsity of every projection's input activations
  (per token and channel; no routers).
"""

from wide_compile.baselines.calibration import calibration_batches
from wide_compile.baselines.depth_skip import apply_depth_skip, block_sizes
from wide_compile.baselines.static_width import StaticMasks, apply_static_width, static_masks
from wide_compile.baselines.teal import TealState, apply_teal, remove_teal, teal_state

__all__ = ["StaticMasks", "TealState", "apply_depth_skip", "apply_static_width", "apply_teal", "block_sizes",
           "calibration_batches", "remove_teal", "static_masks", "teal_state"]
