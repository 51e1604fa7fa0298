"""Router decisions at inference: ``threshold_gate(router_logits(x, ...), None, tau)`` -> ``wide::router_mask``.

Pattern, on a Dynamo torch-level graph (``GroupRouter.forward`` + ``decisions.decide`` in eval mode):

    xc     = x.to(torch.float32)                          # optional cast (call_method "to" / "float")
    logits = wide::router_logits(xc, w_in, b_in, w_out, b_out)
    mask   = wide::threshold_gate(logits, None, tau)      # noise literally None (eval routers)

-> ``mask = wide::router_mask(x, w_in, b_in, w_out, b_out)`` (``wide_compile.router_mask_op``: one Triton launch on
CUDA instead of a cast, two GEMVs and a compare). The cast is folded into the op (it casts in registers; a cast to
fp32 is exact) only when the cast has no other user; otherwise the op reads ``xc``.

Lowered only where the result is the same, nothing needs a gradient and it pays:
- ``logits`` has no user besides the gate (the logits are not returned or reused);
- ``logits`` needs no gradient (its ``example_value.requires_grad`` is False: ``torch.no_grad()`` / inference mode,
  or routers and input without ``requires_grad``); the op has no gradient;
- router weights share one dtype and device with the logits (what ``router_logits`` computes in);
- ``fused_for(tokens, x dtype)`` (``wide_compile.router_mask_op``: where the kernel measured faster on the H200) or
  the token count is not static (dynamic shapes: the op decides per call); otherwise the gate is left as it is
  without a reason (a speed choice).
With ``one_token="reduction"`` a decision of exactly one token (static shapes) becomes
``router_mask_reduction(x, ...)`` instead (``templates/router_mask_reference.py``: broadcast multiplies and sums that
Inductor fuses into two reduction kernels, where the matmul form runs about five): the default, measured at 3.2 µs
against 9.8 µs for the compiled matmul form on the H200 (H=4096, G=8); ``"kernel"`` inserts ``wide::router_mask``,
whose CUDA implementation runs one token in one launch (``templates/router_one_token.py``, 4.2 µs); ``"unfused"``
keeps one token as it is.
Gates with Gumbel noise (training) or ``topk_gate`` are not this pattern and are left without a reason. Inside
autocast regions the rewrite is still exact: ``router_logits`` turns autocast off and the op ignores it.
"""
from __future__ import annotations

import torch
from torch import fx

from wide_compile.router_mask_op import fused_for  # (importing it registers wide::router_mask)
from wide_compile.templates.router_mask_reference import router_mask_reduction

from .torch_patterns import arg, example_value, static_tokens, wide_op_name

CAST_METHODS = ("to", "float")
X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ONE_TOKEN_FORMS = ("unfused", "reduction", "kernel")  # how a one-token decision is computed (see module docstring)
ROUTER_ARGS = ("x", "w_in", "b_in", "w_out", "b_out")  # wide::router_logits' schema


def _uncast_input(xc: fx.Node, compute_dtype: torch.dtype) -> fx.Node:
    """``x`` when ``xc`` is a dtype cast ``x.to(compute_dtype)`` used only by the router, else ``xc``."""
    if not (isinstance(xc, fx.Node) and xc.op == "call_method" and xc.target in CAST_METHODS and len(xc.users) == 1):
        return xc
    x = xc.args[0] if xc.args else None
    x_val, xc_val = example_value(x), example_value(xc)
    if x_val is None or xc_val is None:
        return xc
    if xc_val.dtype != compute_dtype or x_val.device != xc_val.device or x_val.dtype not in X_DTYPES:
        return xc
    return x  # (a dtype cast keeps the shape)


def _why_not(logits: fx.Node) -> str | None:
    """Why ``threshold_gate(logits, None, tau)`` may not be replaced by ``router_mask``, or None."""
    if not isinstance(logits, fx.Node) or wide_op_name(logits) != "router_logits":
        return "its logits do not come from wide::router_logits"
    if len(logits.users) != 1:
        return f"the router logits {logits.name} are also used outside the gate"
    value = example_value(logits)
    if value is None:
        return "the router logits have no known value (no example_value)"
    if value.requires_grad:
        return ("the router logits need a gradient (router training, or routers with requires_grad outside "
                "torch.no_grad()); wide::router_mask has none")
    xc, *weights = (arg(logits, i, name) for i, name in enumerate(ROUTER_ARGS))
    values = [example_value(n) for n in (xc, *weights)]
    if any(v is None for v in values):
        return "a router input or weight has no known tensor value"
    if any(v.dtype != value.dtype or v.device != value.device for v in values):
        return "router input and weights differ in dtype or device"
    if value.dtype not in X_DTYPES:
        return f"router dtype {value.dtype} is not supported (float32, float16 or bfloat16)"
    return None


def _pays(tokens: int | None, x: fx.Node) -> bool:
    """Whether the fused kernel measured faster for this graph's token count and the op's input dtype (always when the
    count is not static)."""
    return tokens is None or fused_for(tokens, example_value(x).dtype)


def lower_router_decisions(graph: fx.Graph, one_token: str = "reduction") -> tuple[dict[str, int], list[str]]:
    """Rewrite every noise-free ``threshold_gate(router_logits(...))`` of ``graph`` in place (see module docstring);
    returns ({"router_mask" / "router_reduction": number inserted}, ``"node: reason"`` for each noise-free gate
    kept)."""
    if one_token not in ONE_TOKEN_FORMS:
        raise ValueError(f"one-token router form must be one of {ONE_TOKEN_FORMS}, got {one_token!r}")
    lowered: dict[str, int] = {}
    reasons = []
    for gate in [n for n in graph.nodes if wide_op_name(n) == "threshold_gate"]:
        if arg(gate, 1, "noise") is not None:
            continue  # training: Gumbel noise and a straight-through gradient
        logits = arg(gate, 0, "logits")
        why = _why_not(logits)
        if why is not None:
            reasons.append(f"{gate.name}: router decision kept as router_logits + threshold_gate: {why}")
            continue
        xc, w_in, b_in, w_out, b_out = (arg(logits, i, name) for i, name in enumerate(ROUTER_ARGS))
        x = _uncast_input(xc, example_value(logits).dtype)
        tokens = static_tokens(example_value(logits), trailing=2)  # [..., G, 2] logits
        if one_token == "reduction" and tokens == 1:
            target, name = router_mask_reduction, "router_reduction"
        elif (one_token == "kernel" and tokens == 1) or _pays(tokens, x):
            target, name = torch.ops.wide.router_mask.default, "router_mask"
        else:
            continue  # a speed choice, not a fallback: the unfused ops are the faster path at this size
        with graph.inserting_before(gate):
            new = graph.call_function(target, (x, w_in, b_in, w_out, b_out))
        new.meta = dict(gate.meta)
        gate.replace_all_uses_with(new)
        graph.erase_node(gate)
        graph.erase_node(logits)
        if x is not xc and not xc.users:
            graph.erase_node(xc)
        lowered[name] = lowered.get(name, 0) + 1
    return lowered, reasons


__all__ = ["lower_router_decisions"]
