"""Probe (stop 31): the fused gate/up GEMV with the used groups' tiles first in the grid (``ACTIVE_FIRST``).

At one token about half of the 224 gate/up tiles are used, and one 147 KB program fits per SM: in grid order the first
wave of 132 programs holds about 66 used tiles and 66 unused ones, which exit after their mask load; the other ~46
used tiles start only then. With ``ACTIVE_FIRST`` each program ranks the groups from the mask row (a scan of the
union of the tokens' flags) and takes the t-th used one, so the used tiles fill the first wave. Default against
``ACTIVE_FIRST``, every mask kind at one token, 50% at 2 and 4 tokens, 5 interleaved rounds, a mask draw per
rotation copy. Run from the repo root:

    OUT=DIR python3 benchmarks/gate_up_active_first_probe.py   # writes DIR/kernels_linear_sweep_gate_up_active_first.json
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernels_linear as kl  # noqa: E402
from kernels_linear_ops import MASKS  # noqa: E402
from wide_compile.templates.gemv_decode import output_config  # noqa: E402

sweeps = []
for m, masks in ((1, list(MASKS)), (2, ["rand50"]), (4, ["rand50"])):
    default = dict(output_config(128, 4096, True, num_tokens=m), path="gemv")
    sweeps += [("gate_up", m, mask, [default, dict(default, ACTIVE_FIRST=True)]) for mask in masks]
rows = kl.run_sweep(torch.Generator(device="cuda").manual_seed(0), sweeps, repeat=5)
with open(os.path.join(os.environ["OUT"], "kernels_linear_sweep_gate_up_active_first.json"), "w") as f:
    json.dump({"command": "python3 benchmarks/gate_up_active_first_probe.py", "sweep": rows}, f, indent=1)
