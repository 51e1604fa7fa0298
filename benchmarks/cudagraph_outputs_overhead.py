"""Diagnostic: host time per call of a CUDA-graphed (``mode="reduce-overhead"``) function against the number of
tensors it leaves behind.

A WIDE model stores each routed block's mask on a Python object during the forward (``block.mask``); under
``torch.compile`` every stored mask becomes an output of the compiled graph that Dynamo's side-effect code assigns
after each call. This times a chain of 30 small "layers" whose two masks per layer (as WIDE's attention and MLP
masks) stay local, are left on Python objects, or are left there only during the call, so the host cost of those
outputs per call can be read off. Calls are issued back to back and
synchronised once at the end: with kernels this small the loop is host-bound, so time per call = host time.

Usage: ``python3 benchmarks/cudagraph_outputs_overhead.py`` (prints one line per variant; needs a CUDA GPU)
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

LAYERS = 30


class Holder:
    def __init__(self):
        self.mask = None


MODES = {"local": "masks only inside the graph", "store": "2 masks per layer left on objects",
         "store_then_clear": "stored, then set to None"}


class Chain(nn.Module):
    """30 layers; each computes two masks from its input and scales its output with them, the masks living in a
    local (``local``), on Python objects after the call (``store``, as WIDE's hooks), or on the objects only during
    the call (``store_then_clear``)."""

    def __init__(self, mode: str, hidden: int = 576):
        super().__init__()
        self.lins = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(LAYERS))
        self.holders = [(Holder(), Holder()) for _ in range(LAYERS)]
        self.mode = mode

    def forward(self, x):
        for lin, (a, m) in zip(self.lins, self.holders):
            attn, mlp = (x[..., :3] > 0).float(), (x[..., :12] > 0).float()
            if self.mode != "local":
                a.mask, m.mask = attn, mlp
                attn, mlp = a.mask, m.mask
            x = torch.relu(lin(x)) * (1 + attn.mean(-1, keepdim=True) + mlp.mean(-1, keepdim=True))
            if self.mode == "store_then_clear":
                a.mask = m.mask = None
        return x


def host_ms_per_call(fn, x, calls: int = 300) -> float:
    for _ in range(5):
        fn(x)
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn(x)
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - start) * 1e3 / calls)
    return statistics.median(runs)


def main() -> None:
    x = torch.randn(8, 1, 576, device="cuda")
    for mode, what in MODES.items():
        model = Chain(mode).cuda()
        compiled = torch.compile(model, mode="reduce-overhead")
        with torch.no_grad():
            ms = host_ms_per_call(compiled, x)
        print(f"{mode:17s} ({what}): {ms * 1e3:8.1f} us per call ({LAYERS} layers)", flush=True)
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
