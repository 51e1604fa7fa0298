"""A block's residual add, RMSNorm and router decision -> one ``wide::router_rms_norm`` (prefill-sized graphs).

Pattern, on a Dynamo torch-level graph after ``router_lowering`` (a decoder layer's ``residual + out`` feeding the next
block's router and its Llama-style RMSNorm)::

    x    = a + b                                          # operator.add / torch.add / Tensor.add, two tensors
    mask = wide::router_mask(x, w_in, b_in, w_out, b_out)
    xf   = x.to(torch.float32)                            # or x.float()
    var  = xf.pow(2).mean(-1, keepdim=True)
    y    = weight * (xf * torch.rsqrt(var + eps)).to(x.dtype)   # either operand order of both products

-> ``x, y, mask = wide::router_rms_norm(a, b, weight, eps, w_in, b_in, w_out, b_out)``. Other users of ``x`` (the
next residual add) read the op's ``x``. On the GPU one launch then reads ``a`` and ``b`` once, where Inductor's add +
norm kernel and the router launch read ``x`` twice (``templates/router_rms_norm.py``).

Rewritten only where it is the same computation and it pays:
- the chain's intermediates have no other users, ``weight`` is ``[H]`` in ``x``'s dtype, ``eps`` a number;
- ``a`` and ``b`` share shape, dtype (bf16 / fp16 / fp32) and device with ``x`` (no broadcasting, no promotion);
- the graph's token count is static and at least ``MIN_TOKENS``: a prefill. Decode steps keep their router paths
  (``router_mask``'s small-token kernels), which this fusion was not measured against.
Other norms (LayerNorm, Gemma's ``1 + weight``, norms without an add before them: the first layer's) are left alone,
without a reason: the unfused ops are correct, only slower.
"""
from __future__ import annotations

import math
import operator

import torch
from torch import fx

import wide_compile.router_rms_norm_op  # noqa: F401  (registers wide::router_rms_norm)

from .torch_patterns import arg, example_value, is_mul, wide_op_name

MIN_TOKENS = 512
ADD_TARGETS = {operator.add, torch.add}
RSQRT_TARGETS = {torch.rsqrt}
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _single_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _is_method(node, name: str) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_method" and node.target == name


def _is_add(node) -> bool:
    """A plain two-tensor add (no ``alpha``)."""
    if not isinstance(node, fx.Node) or node.kwargs:
        return False
    return ((node.op == "call_function" and node.target in ADD_TARGETS) or _is_method(node, "add")) \
        and len(node.args) == 2


def _cast_dtype(node) -> torch.dtype | None:
    """The dtype of an ``x.to(dtype)`` / ``x.float()`` call (positional or ``dtype=``), else None."""
    if _is_method(node, "float") and len(node.args) == 1 and not node.kwargs:
        return torch.float32
    if _is_method(node, "to") and len(node.args) <= 2 and set(node.kwargs) <= {"dtype"}:
        dtype = node.args[1] if len(node.args) == 2 else node.kwargs.get("dtype")
        return dtype if isinstance(dtype, torch.dtype) else None
    return None


def _other(node: fx.Node, one) -> object:
    """The operand of a binary ``node`` that is not ``one`` (None when ``one`` is not an operand)."""
    first, second = node.args[0], node.args[1]
    return second if first is one else first if second is one else None


def _match_rms_norm(x: fx.Node) -> tuple[fx.Node, float, list[fx.Node]] | None:
    """``(weight, eps, chain nodes from the cast to the output)`` of the Llama RMSNorm of ``x``, or None."""
    for xf in x.users:
        if _cast_dtype(xf) != torch.float32 or len(xf.users) != 2:
            continue
        users = list(xf.users)
        square = next((u for u in users if _is_method(u, "pow") and u.args[1:] == (2,) and not u.kwargs), None)
        scale = next((u for u in users if is_mul(u) and u is not square), None)
        if square is None or scale is None:
            continue
        mean = _single_user(square)
        if not (_is_method(mean, "mean") and arg(mean, 1, "dim") in (-1, [-1], (-1,))
                and arg(mean, 2, "keepdim", False) is True):
            continue
        add_eps = _single_user(mean)
        if not _is_add(add_eps) or add_eps.args[0] is not mean or not isinstance(add_eps.args[1], (int, float)):
            continue
        rsqrt = _single_user(add_eps)
        if not (isinstance(rsqrt, fx.Node) and ((rsqrt.op == "call_function" and rsqrt.target in RSQRT_TARGETS)
                                                 or _is_method(rsqrt, "rsqrt")) and len(rsqrt.args) == 1):
            continue
        if _single_user(rsqrt) is not scale or _other(scale, rsqrt) is not xf:
            continue
        back = _single_user(scale)
        x_value = example_value(x)
        if _cast_dtype(back) != x_value.dtype:
            continue
        out = _single_user(back)
        if not is_mul(out):
            continue
        weight = _other(out, back)
        w_value = example_value(weight)
        if w_value is None or w_value.shape != x_value.shape[-1:] or w_value.dtype != x_value.dtype \
                or w_value.device != x_value.device:
            continue
        return weight, float(add_eps.args[1]), [xf, square, mean, add_eps, rsqrt, scale, back, out]
    return None


def _addends(x: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """``(a, b)`` of ``x = a + b`` when both are tensors of ``x``'s shape, dtype and device."""
    if not _is_add(x):
        return None
    a, b = x.args
    x_value = example_value(x)
    values = [example_value(a), example_value(b)]
    if x_value is None or x_value.dtype not in FLOAT_DTYPES or any(v is None for v in values):
        return None
    if any(v.shape != x_value.shape or v.dtype != x_value.dtype or v.device != x_value.device for v in values):
        return None
    return a, b


def _static_tokens(x: fx.Node) -> int | None:
    sizes = example_value(x).shape[:-1]
    return math.prod(sizes) if all(isinstance(d, int) for d in sizes) else None


def fuse_router_norms(graph: fx.Graph, min_tokens: int = MIN_TOKENS) -> int:
    """Rewrite every matching add + router_mask + RMSNorm of ``graph`` in place (see module docstring); returns how
    many ``router_rms_norm`` calls were inserted."""
    fused = 0
    order = {node: i for i, node in enumerate(graph.nodes)}  # inserted nodes take the position of their x
    for router in [n for n in graph.nodes if wide_op_name(n) == "router_mask"]:
        x = router.args[0]
        if not isinstance(x, fx.Node) or example_value(x) is None:
            continue
        addends = _addends(x)
        norm = _match_rms_norm(x)
        tokens = _static_tokens(x)
        if addends is None or norm is None or tokens is None or tokens < min_tokens:
            continue
        weight, eps, chain = norm
        inputs = (*addends, weight, *router.args[1:])
        first_use = min(order[u] for u in x.users)
        if any(isinstance(n, fx.Node) and order[n] >= first_use for n in inputs):
            continue  # an input (a computed norm weight) is defined after x is first used: no place for the call
        with graph.inserting_after(x):
            call = graph.call_function(torch.ops.wide.router_rms_norm.default,
                                       (*addends, weight, eps, *router.args[1:]))
        with graph.inserting_after(call):
            outs = [graph.call_function(operator.getitem, (call, i)) for i in range(3)]
        for out, old in zip(outs, (x, chain[-1], router)):
            out.meta = dict(old.meta)
        order.update({node: order[x] for node in (call, *outs)})
        chain[-1].replace_all_uses_with(outs[1])
        router.replace_all_uses_with(outs[2])
        graph.erase_node(router)
        for node in reversed(chain):
            graph.erase_node(node)
        x.replace_all_uses_with(outs[0])
        graph.erase_node(x)
        call.meta["example_value"] = tuple(o.meta.get("example_value") for o in outs)
        fused += 1
    return fused


__all__ = ["fuse_router_norms", "MIN_TOKENS"]
