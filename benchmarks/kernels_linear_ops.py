"""The benchmark's ops (Llama-3-8B projections, their group sizes and paths) and mask kinds, shared by
``kernels_linear.py`` and the configuration grids of ``kernels_linear_sweeps.py``."""
from __future__ import annotations

import functools
import json
import os

import numpy as np
import torch

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
# Decisions of trained routers (benchmarks/trained_masks.py), laid out at the 8B group counts by trained_mask.
TRAINED = "trained"
TRAINED_MASKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "trained_masks_smollm2.npz")
# Up to this many tokens a batch's tokens are drawn at random positions (a decode batch of unrelated sequences);
# more tokens are one consecutive run of text (a prefill).
TRAINED_RANDOM_TOKENS = 256
MS = [1, 2, 4, 8, 16, 64, 256, 1024, 4096, 16384]


def mask_family(op: str) -> str:
    """Which routers' decisions an op's groups take: head groups (512 channels) or FFN groups."""
    return "attention" if OPS[op]["gs"] == 512 else "mlp"


def group_count(op: str) -> int:
    """Groups of an op's mask: output groups over N (gate/up, the query projection, the whole FFN's intermediate),
    input groups over K (down, the output projection)."""
    cfg = OPS[op]
    return (cfg["N"] if cfg["kind"] in ("gated", "output", "ffn") else cfg["K"]) // cfg["gs"]


def make_mask(name: str, m: int, g: int, gen: torch.Generator, family: str = "mlp",
              device: str = "cuda") -> torch.Tensor:
    """``[m, g]`` bool mask of kind ``name``: i.i.d. random with ``MASKS[name]`` active, ``pattern50`` (each token one
    of 8 random patterns of 50%), or ``trained`` (:func:`trained_mask` of ``family``)."""
    if name == TRAINED:
        return trained_mask(m, g, gen, family, device=device)
    p = MASKS[name]
    if p is not None:
        return torch.rand(m, g, generator=gen, device=device) < p
    patterns = torch.rand(8, g, generator=gen, device=device) < 0.5
    return patterns[torch.randint(0, 8, (m,), generator=gen, device=device)]


@functools.lru_cache(maxsize=4)
def load_trained_masks(path: str = TRAINED_MASKS) -> tuple[dict, dict]:
    """``(masks, meta)``: per family a bool array ``[layers, tokens, groups]`` recorded by trained_masks.py."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no recorded router decisions (write them with benchmarks/trained_masks.py)")
    data = np.load(path)
    masks = {fam: np.unpackbits(data[fam], axis=-1, count=int(data[f"{fam}_groups"])).astype(bool)
             for fam in ("attention", "mlp")}
    return masks, json.loads(str(data["meta"]))


def trained_mask(m: int, g: int, gen: torch.Generator, family: str, path: str = TRAINED_MASKS,
                 device: str = "cuda") -> torch.Tensor:
    """``[m, g]`` decisions of trained routers at a wider model's group count ``g``.

    The recorded model has fewer groups per layer (SmolLM2-135M: 12 FFN groups, 3 head groups) than ``g`` (Llama-3-8B:
    112 / 8), so the groups of ``ceil(g / groups)`` consecutive layers (from a random one, wrapping) are laid side by
    side and cut to ``g``: each group keeps a trained router's decisions over the same tokens, which is what decides the
    union of a batch (a group's bytes are read if any token uses it). Tokens: ``m`` random positions up to
    ``TRAINED_RANDOM_TOKENS`` (a decode batch of unrelated sequences), else ``m`` consecutive ones from a random start
    (wrapping; a prefill)."""
    masks, _ = load_trained_masks(path)
    rec = masks[family]
    layers, tokens, per_layer = rec.shape
    pick = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen, device=gen.device)))
    first = int(torch.randint(0, layers, (1,), generator=pick))
    span = -(-g // per_layer)
    if span > layers:
        raise ValueError(f"trained_mask: {g} groups need {span} layers of {per_layer}; the recording has {layers}")
    rows = [(first + i) % layers for i in range(span)]
    if m <= TRAINED_RANDOM_TOKENS:
        idx = (torch.randperm(tokens, generator=pick)[:m] if m <= tokens
               else torch.randint(0, tokens, (m,), generator=pick))
    else:
        idx = (int(torch.randint(0, tokens, (1,), generator=pick)) + torch.arange(m)) % tokens
    wide = np.concatenate([rec[r][idx.numpy()] for r in rows], axis=1)[:, :g]
    return torch.from_numpy(np.ascontiguousarray(wide)).to(device)
