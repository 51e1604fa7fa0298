"""templates/group_bits.py: the rotated walk over a union held as two 64-bit words (``rotate_words``, then
``pop_group`` with ``r`` added back mod 128) visits every set group exactly once, from the first set group at or after
``r`` upwards, then wraps to the lowest; checked against Python on random words, both words, every rotation edge
(interpreter on CPU)."""
from __future__ import annotations

import random

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from wide_compile.templates.group_bits import pop_group, rotate_words  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _walk(words_ptr, r, out_ptr, STEPS: tl.constexpr):
    lo, hi = rotate_words(tl.load(words_ptr), tl.load(words_ptr + 1), r)
    for j in range(STEPS):
        g, lo, hi = pop_group(lo, hi)
        tl.store(out_ptr + j, (g + r) % 128)


def _words(groups: list[int]) -> torch.Tensor:
    bits = sum(1 << g for g in groups)
    lo, hi = bits & (2 ** 64 - 1), bits >> 64
    signed = [v - 2 ** 64 if v >= 2 ** 63 else v for v in (lo, hi)]  # int64 bit patterns
    return torch.tensor(signed, dtype=torch.int64, device=DEVICE)


@pytest.mark.parametrize("r", [0, 1, 2, 37, 63, 64, 65, 100, 127])
@pytest.mark.parametrize("case", ["random", "one word", "full", "single"])
def test_rotated_walk_visits_each_group_once_from_r(r, case):
    rng = random.Random(f"{case}-{r}")
    groups = {"random": sorted(rng.sample(range(128), 50)), "one word": sorted(rng.sample(range(64), 20)),
              "full": list(range(128)), "single": [rng.randrange(128)]}[case]
    out = torch.full((len(groups),), -1, dtype=torch.int32, device=DEVICE)
    _walk[(1,)](_words(groups), r, out, STEPS=len(groups))
    expected = [g for g in groups if g >= r] + [g for g in groups if g < r]
    assert out.tolist() == expected
