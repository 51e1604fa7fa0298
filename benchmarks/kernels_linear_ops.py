"""The benchmark's ops (Llama-3-8B projections, their group sizes and paths) and mask kinds, shared by
``kernels_linear.py`` and the configuration grids of ``kernels_linear_sweeps.py``."""
from __future__ import annotations

HIDDEN, INTER = 4096, 14336
OPS = {
    "gate_up": dict(kind="gated", K=HIDDEN, N=INTER, gs=128),
    "down": dict(kind="input", K=INTER, N=HIDDEN, gs=128),
    "q_proj": dict(kind="output", K=HIDDEN, N=HIDDEN, gs=512),
    "o_proj": dict(kind="input", K=HIDDEN, N=HIDDEN, gs=512),
    # same ops when the caller promises x is already 0 outside each token's groups (x_is_masked=True),
    # as for h written by gated_up_groups (down) or attention outputs of skipped heads (o_proj)
    "down_pm": dict(kind="input", K=INTER, N=HIDDEN, gs=128, premasked=True),
    "o_proj_pm": dict(kind="input", K=HIDDEN, N=HIDDEN, gs=512, premasked=True),
    # the skipping input-group GEMM forced (path="gemm"; "auto" uses cuBLAS on the masked input for M > 16)
    "down_gemm": dict(kind="input", K=INTER, N=HIDDEN, gs=128, premasked=True, path="gemm", min_m=17),
    "o_proj_gemm": dict(kind="input", K=HIDDEN, N=HIDDEN, gs=512, premasked=True, path="gemm", min_m=17),
    "ffn": dict(kind="ffn", K=HIDDEN, N=INTER, gs=128),
}
MASKS = {"rand25": 0.75, "rand50": 0.5, "rand70": 0.3, "pattern50": None}
MS = [1, 2, 4, 8, 16, 64, 256, 1024, 4096, 16384]
