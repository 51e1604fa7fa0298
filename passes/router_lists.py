"""The FFN router's decision and its per-group token lists from one launch (``wide::router_mask_lists``).

A lowered gate/up op (``wide::gated_up_groups``) walks, for every group, the tokens the group is active for; it built
those lists itself from the router's mask, read through a reshape (``templates/group_plan.py``: one scan launch per
routed MLP, 32 launches and about 0.29 ms per 4096-token prefill of the Llama-3-8B shape, run AG). This pass has the router build them while
it writes the mask: ``wide::router_mask(...)`` whose mask a gate/up op reads becomes ``wide::router_mask_lists(...)``,
its mask goes wherever the old one went, and the lists go to the gate/up op (``group_tokens=`` / ``group_counts=``).

Applied where the gate/up op runs its GEMM (a static token count above ``GEMV_MAX_TOKENS["gated_up_groups"]``;
decode steps use no lists), in inference graphs (``wide::router_mask`` appears only there). Off by default
(``wide.router_lists``): tested on CPU (the kernel under the interpreter, the sm_90a compile), not yet run on a GPU.
"""
from __future__ import annotations

import operator

import torch
from torch import fx

import wide_compile.kernel_ops  # noqa: F401  (registers wide::gated_up_groups)
import wide_compile.router_mask_op  # noqa: F401  (registers wide::router_mask, wide::router_mask_lists)

from ..templates.group_linear import GEMV_MAX_TOKENS
from .torch_patterns import example_value

MIN_TOKENS = GEMV_MAX_TOKENS["gated_up_groups"] + 1
_ROUTER = torch.ops.wide.router_mask.default
_LISTS = torch.ops.wide.router_mask_lists.default
_GATED = torch.ops.wide.gated_up_groups.default
_GATED_DEFAULTS = ("silu",)  # after (x, w_gate, w_up, mask, group_size): activation, then the lists


def _takes_lists(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is _GATED and not node.kwargs and 5 <= len(node.args) <= 6


def _worth_it(mask: fx.Node) -> bool:
    value = example_value(mask)
    if value is None or value.requires_grad or value.shape[-1] == 0:
        return False
    tokens = value.numel() // value.shape[-1]
    return isinstance(tokens, int) and tokens >= MIN_TOKENS


_VIEWS = ("reshape", "view")


def _router_of(mask) -> fx.Node | None:
    """The ``wide::router_mask`` node behind a gate/up op's mask, through reshapes that keep the groups' last dim
    (token order and count unchanged); None when there is none."""
    value = example_value(mask)
    groups = value.shape[-1] if value is not None else None
    while isinstance(mask, fx.Node) and mask.op == "call_method" and mask.target in _VIEWS and not mask.kwargs:
        mask = mask.args[0]
        value = example_value(mask)
        if value is None or value.shape[-1] != groups:
            return None
    if isinstance(mask, fx.Node) and mask.target is _ROUTER and not mask.kwargs and _worth_it(mask):
        return mask
    return None


def share_router_lists(graph: fx.Graph) -> int:
    """Rewrite every router whose mask one lowered gate/up op reads (see module docstring); returns how many."""
    gated_ops = [n for n in graph.nodes if _takes_lists(n)]
    routers = [_router_of(n.args[3]) for n in gated_ops]
    shared = 0
    for gated, router in zip(gated_ops, routers):
        if router is None or routers.count(router) != 1:
            continue
        with graph.inserting_after(router):
            both = graph.call_function(_LISTS, router.args)
        with graph.inserting_after(both):
            mask = graph.call_function(operator.getitem, (both, 0))
        with graph.inserting_after(mask):
            tokens = graph.call_function(operator.getitem, (both, 1))
        with graph.inserting_after(tokens):
            counts = graph.call_function(operator.getitem, (both, 2))
        mask.meta.update(router.meta)
        router.replace_all_uses_with(mask)
        graph.erase_node(router)
        gated.args = (*gated.args, *_GATED_DEFAULTS[len(gated.args) - 5:], tokens, counts)
        shared += 1
    return shared


__all__ = ["MIN_TOKENS", "share_router_lists"]
