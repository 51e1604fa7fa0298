"""Programmatic dependent launch (sm_90+), opt-in with ``WIDE_PDL=1`` (slower in the whole decode step when every launch
uses it: stop 10, and stop 33's 8B batch-1 step, 3.170 / 3.173 against 3.160 / 3.158 ms,
``benchmarks/results/e2e_b1_pdl_*.json``), except between a split kernel and its reduction (:func:`paired_pdl_launch`,
the decode attention's: 0.1-0.9 µs less per call on the H200, ``benchmarks/results/decode_paired_pdl.json``).

A kernel launched with ``launch_pdl=True`` may be scheduled before its predecessor in the stream has finished (once
every program of the predecessor has released its dependents or exited), so launch latency and the first steps of
the next kernel overlap the previous kernel's tail; decode steps of a large model at batch 1 are chains of ~10 short
kernels per layer (``benchmarks/notes_e2e.md``). The contract kept by every template that takes ``USE_GDC``:

- ``if USE_GDC: tl.extra.cuda.gdc_wait()`` before the kernel's first global-memory access (it returns once the
  predecessor grid has completed and its writes are visible: reading anything before would race);
- ``if USE_GDC: tl.extra.cuda.gdc_launch_dependents()`` after its main loop (its dependents still wait for its
  completion before reading).

(Written inline in each kernel rather than as shared ``@triton.jit`` helpers: a helper defined before
``TRITON_INTERPRET=1`` was set could not be called from an interpreted kernel.)

Under ``TRITON_INTERPRET=1`` the instructions do not exist, so :func:`use_pdl` is False there; CUDA graphs capture
the launch attribute.
"""
from __future__ import annotations

import functools
import os

import torch

from ._triton_utils import interpreting

ENV = "WIDE_PDL"


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _pdl_capable(device: torch.device) -> bool:
    """Whether ``device`` can launch dependents programmatically (CUDA sm_90+, not under the interpreter)."""
    if device.type != "cuda" or interpreting():
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device())[0] >= 9


def use_pdl(device: torch.device) -> bool:
    """Whether launches on ``device`` use programmatic dependent launch (``WIDE_PDL=1``, CUDA sm_90+)."""
    return os.environ.get(ENV, "0") == "1" and _pdl_capable(device)


def pdl_launch(device: torch.device) -> dict:
    """Launch keyword arguments: ``USE_GDC`` for the kernel, ``launch_pdl`` for Triton's launcher."""
    return {"USE_GDC": True, "launch_pdl": True} if use_pdl(device) else {"USE_GDC": False}


def paired_pdl_launch(device: torch.device) -> tuple[dict, dict]:
    """Launch keyword arguments for a kernel and the one dependent launch that always follows it (a split kernel and
    its reduction), with programmatic dependent launch between the two whatever ``WIDE_PDL`` says (sm_90+): the
    second may start while the first's last programs run. The first waits for its own predecessor only with
    ``WIDE_PDL=1`` (its ``gdc_wait`` returns at once when it was not launched as a dependent)."""
    if not _pdl_capable(device):
        return {"USE_GDC": False}, {"USE_GDC": False}
    return {"USE_GDC": True, "launch_pdl": use_pdl(device)}, {"USE_GDC": True, "launch_pdl": True}
