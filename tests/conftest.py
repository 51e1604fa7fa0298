"""Shared test set-up: Triton kernels run under the interpreter when there is no GPU."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Must be set before any @triton.jit kernel is defined (see ../shared/notes/toolchain.md).
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run faster on one thread (and do not suffer from a busy 2-core machine)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
