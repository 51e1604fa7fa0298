"""The learned router of one (layer, sublayer): low-rank, hidden -> rank -> 2 logits per group."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from wide_compile.ops import router_logits


class GroupRouter(nn.Module):
    """``logits = (x W_in^T + b_in) W_out^T + b_out`` as ``[..., groups, 2]`` (skip, execute); no activation.

    Weights are plain parameters (not ``nn.Linear`` children) so that PEFT's "all-linear" never wraps
    them. ``tau`` is the Gumbel temperature, a non-persistent buffer so that annealing it never
    recompiles a compiled graph.
    """

    def __init__(self, hidden: int, groups: int, rank: int = 32, dtype=None, device=None,
                 generator: torch.Generator | None = None):
        super().__init__()
        if groups < 1 or rank < 1:
            raise ValueError(f"router needs groups >= 1 and rank >= 1, got groups={groups}, rank={rank}")
        factory = {"dtype": dtype, "device": device}
        self.hidden, self.groups, self.rank = hidden, groups, rank
        self.w_in = nn.Parameter(torch.empty(rank, hidden, **factory))
        self.b_in = nn.Parameter(torch.zeros(rank, **factory))
        self.w_out = nn.Parameter(torch.empty(2 * groups, rank, **factory))
        self.b_out = nn.Parameter(torch.zeros(2 * groups, **factory))
        self.register_buffer("tau", torch.ones((), dtype=torch.float32, device=device), persistent=False)
        self.reset_parameters(generator)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Random projections (``generator`` on the CPU makes them reproducible on any device), zero biases."""
        for weight, fan_in in ((self.w_in, self.hidden), (self.w_out, self.rank)):
            init = torch.randn(weight.shape, generator=generator, dtype=torch.float32) / math.sqrt(fan_in)
            with torch.no_grad():
                weight.copy_(init.to(weight.device, weight.dtype))
        nn.init.zeros_(self.b_in)
        nn.init.zeros_(self.b_out)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.hidden:
            raise ValueError(f"router expects hidden size {self.hidden}, got input of shape {tuple(x.shape)}")
        return router_logits(x.to(self.w_in.dtype), self.w_in, self.b_in, self.w_out, self.b_out)

    def extra_repr(self) -> str:
        return f"hidden={self.hidden}, rank={self.rank}, groups={self.groups}"
