"""Opt-in programmatic dependent launch (``templates/dependent_launch.py``): when it is on, and that the kernels still
match their references with it off (the interpreter has no griddepcontrol; the GPU tests cover ``WIDE_PDL=1``)."""

import torch

from wide_compile.templates import dependent_launch


def test_pdl_only_when_asked_for_on_sm90_cuda(monkeypatch):
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(dependent_launch, "_capability", lambda index: (9, 0))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(dependent_launch.ENV, raising=False)
    assert not dependent_launch.use_pdl(cuda)  # off by default (not measured yet)
    monkeypatch.setenv(dependent_launch.ENV, "1")
    assert dependent_launch.use_pdl(cuda)
    assert dependent_launch.pdl_launch(cuda) == {"USE_GDC": True, "launch_pdl": True}
    assert dependent_launch.pdl_launch(torch.device("cpu")) == {"USE_GDC": False}
    monkeypatch.setattr(dependent_launch, "_capability", lambda index: (8, 0))
    assert not dependent_launch.use_pdl(cuda)  # no griddepcontrol before Hopper
    monkeypatch.setattr(dependent_launch, "_capability", lambda index: (9, 0))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not dependent_launch.use_pdl(cuda)  # the interpreter has no such instructions


def test_paired_launch_links_the_second_kernel_to_the_first_whatever_the_switch(monkeypatch):
    """A split kernel and its reduction: the reduction is always a programmatic dependent on sm_90+; the first kernel
    is one only with ``WIDE_PDL=1``, and carries ``USE_GDC`` so that it releases the reduction early."""
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(dependent_launch, "_capability", lambda index: (9, 0))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(dependent_launch.ENV, raising=False)
    first, second = dependent_launch.paired_pdl_launch(cuda)
    assert first == {"USE_GDC": True, "launch_pdl": False} and second == {"USE_GDC": True, "launch_pdl": True}
    monkeypatch.setenv(dependent_launch.ENV, "1")
    assert dependent_launch.paired_pdl_launch(cuda)[0] == {"USE_GDC": True, "launch_pdl": True}
    off = ({"USE_GDC": False}, {"USE_GDC": False})
    assert dependent_launch.paired_pdl_launch(torch.device("cpu")) == off
    monkeypatch.setattr(dependent_launch, "_capability", lambda index: (8, 0))
    assert dependent_launch.paired_pdl_launch(cuda) == off
    monkeypatch.setattr(dependent_launch, "_capability", lambda index: (9, 0))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert dependent_launch.paired_pdl_launch(cuda) == off
