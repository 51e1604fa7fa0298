"""Shared test set-up: Triton kernels run under the interpreter when there is no GPU."""

import os

import torch

if not torch.cuda.is_available():
    # Must be set before any @triton.jit kernel is defined (see ../shared/notes/toolchain.md).
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(min(2, torch.get_num_threads()))
