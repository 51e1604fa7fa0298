"""Router weights split once per forward: ``W_in``'s two 16-bit parts for every prefill-sized ``wide::router_mask``.

On CUDA, with a 16-bit ``x`` and more than ``DECODE_TOKENS`` tokens, the router kernel multiplies ``x`` with ``W_in``
(fp32) on the tensor cores as two 16-bit parts, ``hi = W_in.to(dtype)`` and ``mid = (W_in - hi).to(dtype)``, which it
used to make in registers at every K step of every token tile. This pass computes them once per forward:

    parts_i = split_router_weights(w_in_i, x_i.dtype)           # [2, R, H], all of them together at the top
    mask_i  = wide::router_mask(x_i, w_in_i, ..., w_parts=parts_i)

The kernel then reads two 16-bit tiles and keeps two accumulators (``templates/router_mask.py``, ``PRESPLIT_TILES``:
4096 tokens, H = 4096, 21.3 -> 16.8 µs per router on the H200). The parts are recomputed in the graph every forward,
never cached: a cache would go stale under CUDA graphs when the router weights change in place (training steps,
``load_state_dict``). The splits sit together after the last weight they read, so Inductor can run them as a few
combo kernels (``combo_kernels``, a backend default) instead of one launch per router.

Only where the kernel would split (``x`` bf16 / fp16, ``W_in`` fp32, a CUDA device) and the split was measured to pay:
a static token count of at least ``MIN_TOKENS`` (measured at 1024, 4096 and 16384 tokens; smaller graphs, batched
decode steps among them, keep the in-register split: the per-forward split of every router was not priced against
them). ``wide::router_mask`` checks that ``w_parts`` fits ``W_in`` and ``x`` (shape, dtype, device) and otherwise
raises; its result does not depend on them.
"""
from __future__ import annotations

import torch
from torch import fx

from wide_compile.router_mask_op import SPLIT_DTYPES  # x dtypes the kernel multiplies as 16-bit W_in parts
from wide_compile.templates.router_mask import split_router_weights

from .torch_patterns import example_value, static_tokens

MIN_TOKENS = 1024  # (see module docstring)
DEVICES = ("cuda",)  # device types whose router kernel splits W_in (tests add "cpu": the op there checks the parts)


def _wants_parts(node: fx.Node, devices: tuple[str, ...]) -> bool:
    """Whether ``node`` (a ``wide::router_mask`` call) runs the in-register split that ``w_parts`` replaces."""
    if node.kwargs.get("w_parts") is not None or len(node.args) < 5:
        return False
    x, w_in = example_value(node.args[0]), example_value(node.args[1])
    if x is None or w_in is None or x.dim() < 1:
        return False
    tokens = static_tokens(x)
    if tokens is None or tokens < MIN_TOKENS:
        return False
    return (x.dtype in SPLIT_DTYPES and w_in.dtype == torch.float32 and w_in.dim() == 2
            and x.device.type in devices and w_in.device == x.device)


def split_router_weights_once(graph: fx.Graph, devices: tuple[str, ...] | None = None) -> int:
    """Give every prefill-sized ``wide::router_mask`` of ``graph`` on ``devices`` (default ``DEVICES``) its
    ``w_parts`` (see module docstring); returns how many routers got them."""
    devices = DEVICES if devices is None else devices
    order = {node: i for i, node in enumerate(graph.nodes)}
    routers = [n for n in graph.nodes if n.op == "call_function"
               and n.target is torch.ops.wide.router_mask.default and _wants_parts(n, devices)]
    if not routers:
        return 0
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    last_weight = max([n.args[1] for n in routers] + placeholders[-1:], key=order.__getitem__)  # (after the inputs)
    together = order[last_weight] < min(order[n] for n in routers)
    anchor = last_weight
    for router in routers:
        w_in, dtype = router.args[1], example_value(router.args[0]).dtype
        if together:
            with graph.inserting_after(anchor):
                parts = graph.call_function(split_router_weights, (w_in, dtype))
            anchor = parts
        else:  # a weight computed inside the graph after some router: split each right before its router
            with graph.inserting_before(router):
                parts = graph.call_function(split_router_weights, (w_in, dtype))
        router.kwargs = {**router.kwargs, "w_parts": parts}
    return len(routers)


__all__ = ["split_router_weights_once"]
