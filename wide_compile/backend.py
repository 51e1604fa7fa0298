"""The ``wide`` torch.compile backend: WIDE patterns -> group-skipping ops, everything else -> Inductor.

    import torch, wide_compile
    model = wide_compile.apply(model)
    compiled = torch.compile(model, backend="wide")                     # or mode="max-autotune-no-cudagraphs", ...
    print(wide_compile.compile_report(model))                           # graphs, lowered ops, recompiles, breaks

Per Dynamo graph: the masked projections (``linear(wide::group_mask(x, m, gs), W, b)``) and gated MLPs
(``group_mask(act(x Wg^T) * (x Wu^T), m, gs)`` -> down projection) are rewritten by ``wide_compile.passes.lowering``
into ``wide::masked_input_linear`` / ``wide::gated_up_groups`` (``wide_compile.kernel_ops``: Triton templates on
CUDA, the same PyTorch math elsewhere; autograd through both, dense backward), then the graph goes to
``torch._inductor.compile_fx.compile_fx``. Routers (``wide::router_logits``, ``threshold_gate``, ``topk_gate``) stay
custom ops that Inductor calls as they are.

What is lowered (tiny models of all 18 test families compile and match eager exactly on CPU):
- gated MLPs with silu / gelu / gelu-tanh and separate gate / up projections (Llama, Mistral, Qwen2/3, Gemma 1-3,
  StableLM, OLMo2, Granite, Cohere): ``gated_up_groups`` + down ``masked_input_linear(x_is_masked=True)`` (the
  down kernel skips re-masking; each op builds only the part of the group plan it needs, so nothing is built twice);
- every other ``linear`` fed by a ``group_mask``: attention output projections, down projections of fused
  gate_up (Phi-3) and plain MLPs (GPT-NeoX, OPT, Phi, GPT-J), LoRA-wrapped projections.
- the query projection of a routed attention (``passes/attention_lowering.py``): ``wide::output_group_linear``
  computes only the active heads' queries, when dataflow proves each output element reaches the masked attention
  output only through its own token and group (separate q projections; fused qkv, q-norms over all heads and
  graphs where the router needs gradients keep it dense, with the reason reported);
- the attention core after a lowered query (``passes/attention_core_lowering.py``): SDPA with no explicit mask
  (causal with as many queries as keys, or one-token decode) -> ``wide::group_attention`` (head-group-skipping
  templates). A static cache or transformers 5.17 passes an explicit mask, so the core then stays SDPA.
- left on the generic path (``group_mask`` + dense op, reason in ``compile_report``): GPT-2 Conv1D (``addmm``),
  Falcon (``matmul`` with ``W.T``), biased gate / up, other activations, patterns inside autocast regions.

Arguments that reach the backend:
- ``mode``: any Inductor mode (``"default"``, ``"reduce-overhead"``, ``"max-autotune"``,
  ``"max-autotune-no-cudagraphs"``); it becomes the same Inductor config patches ``torch.compile`` would use
  (``torch._inductor.list_mode_options``). CUDA graphs (``reduce-overhead``) are Inductor's own; the templates
  build their group plans on the device without host synchronisation. Use a static KV cache with CUDA graphs
  (``tests/test_static_cache_generate.py``); a DynamicCache's K/V are overwritten by the next replay.
- ``options``: Inductor config keys (e.g. ``{"fallback_random": True}``), plus the backend's own keys:
  ``"wide.rewrite"`` (bool, default True: run the rewrites), ``"wide.inner"`` (``"inductor"`` default,
  ``"aot_eager"`` or ``"eager"``: what compiles the rewritten graph; the last two are for debugging / fast tests)
  and ``"wide.fuse_routers"`` (bool, default True: lower inference router decisions to the one-launch
  ``wide::router_mask`` kernel where it measured faster on the H200: 2-64 tokens, and more for a bf16 / fp16
  residual; False keeps them unfused) and ``"wide.one_token_routers"`` (``"reduction"`` default: a one-token
  decision becomes broadcast multiplies and sums that Inductor fuses into two kernels, 3.2 µs compiled on the H200
  at Llama-3-8B's attention router, against 9.8 µs for the compiled matmul form and for the best configuration of
  the generic fused kernel (``benchmarks/results/kernels_router.md``); ``"kernel"``: ``wide::router_mask``, whose
  one-token CUDA path is one launch (``templates/router_one_token.py``, 4.2 µs); ``"unfused"`` keeps the matmul form:
  cuBLAS GEMVs) and
  ``"wide.fuse_dense_siblings"`` (bool, default True: each lowered query projection and the dense linears of its
  input, the key and value projections, become one op, one GEMV launch at decode; ``passes/dense_siblings.py``) and
  ``"wide.fuse_query_rope"`` (bool, default True: in prefill-sized inference graphs that op also applies the
  query's rotary embedding, inside its GEMM; ``passes/query_rope_epilogue.py``) and ``"wide.presplit_routers"``
  (bool, default True: prefill-sized router kernels on CUDA read ``W_in``'s two 16-bit parts, made once per forward
  at the top of the graph, instead of splitting ``W_in`` at every K step; ``passes/router_weight_split.py``) and
  ``"wide.fuse_residual_adds"`` (bool, default True: a residual connection after a prefill-sized output / down
  projection on CUDA is added by that projection's GEMM, in place; ``passes/residual_add_fusion.py``).
  ``torch.compile`` accepts ``mode`` or ``options``, not both; to combine them pass the mode's settings as
  options (``torch._inductor.list_mode_options(mode)``).
- Inductor defaults the backend changes (``inductor_defaults()``, overridden by ``options``): ``combo_kernels=True``
  (Inductor launches independent small kernels as one: a decode step's RoPE and cache writes, the RMSNorms beside
  the routers' first sums). On the H200 it took the Llama-3-8B shape's batch-1 step from 3.530 to 3.356 ms
  (``benchmarks/results/e2e.md``, runs H and I); it only acts on GPU (Triton) kernels. And a hash of the ``wide::``
  ops' source in Inductor's cache key (``op_cache_key``: Inductor does not key cached graphs on a custom op's
  implementation, so a graph cached by an older wide_compile could assert an op's old output layout).
- ``dynamic=`` of ``torch.compile`` acts in Dynamo and needs nothing here.

A graph without any ``wide::`` op (a model that was not ``apply``-ed, or code outside the routed layers, e.g.
after a graph break) is compiled with plain Inductor; the first such graph of the process raises a
``WideBackendWarning`` saying so.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import fx

from .compile_report import GraphRecord, add_record, compile_report, input_storages, reset_compile_report
from .op_cache_key import cache_key_options

__all__ = ["BACKEND_NAME", "WideBackendWarning", "compile_report", "reset_compile_report", "wide_backend"]

BACKEND_NAME = "wide"
INNER_COMPILERS = ("inductor", "aot_eager", "eager")
INDUCTOR_DEFAULTS = {"combo_kernels": True}


def inductor_defaults() -> dict:
    """``INDUCTOR_DEFAULTS`` plus the ``wide::`` ops' cache key (``op_cache_key``; computed when first compiling, so
    that importing wide_compile loads neither Inductor nor Triton)."""
    return {**INDUCTOR_DEFAULTS, **cache_key_options()}
_OWN_OPTIONS = ("wide.rewrite", "wide.inner", "wide.fuse_routers", "wide.one_token_routers", "wide.fuse_dense_siblings",
                "wide.fuse_query_rope", "wide.presplit_routers", "wide.fuse_residual_adds")


class WideBackendWarning(UserWarning):
    """Something about a graph compiled by the ``wide`` backend that the user should know."""


@dataclass(frozen=True)
class BackendSettings:
    rewrite: bool = True
    inner: str = "inductor"
    inductor_options: dict = field(default_factory=dict)
    fuse_routers: bool = True
    one_token_routers: str = "reduction"
    fuse_dense_siblings: bool = True
    fuse_query_rope: bool = True
    presplit_routers: bool = True
    fuse_residual_adds: bool = True


def parse_settings(mode: str | None, options: dict | None) -> BackendSettings:
    """Validate ``mode`` / ``options`` (see module docstring); clear errors for unknown values."""
    from torch._inductor import list_mode_options

    options = dict(options or {})
    own = {k: options.pop(k) for k in list(options) if k.startswith("wide.")}
    unknown = sorted(set(own) - set(_OWN_OPTIONS))
    if unknown:
        raise ValueError(f"wide backend: unknown option(s) {unknown}; known: {list(_OWN_OPTIONS)}")
    rewrite, inner = own.get("wide.rewrite", True), own.get("wide.inner", "inductor")
    fuse_routers = own.get("wide.fuse_routers", True)
    siblings = own.get("wide.fuse_dense_siblings", True)
    query_rope = own.get("wide.fuse_query_rope", True)
    presplit = own.get("wide.presplit_routers", True)
    residual_adds = own.get("wide.fuse_residual_adds", True)
    for name, value in (("wide.rewrite", rewrite), ("wide.fuse_routers", fuse_routers),
                        ("wide.fuse_dense_siblings", siblings), ("wide.fuse_query_rope", query_rope),
                        ("wide.presplit_routers", presplit), ("wide.fuse_residual_adds", residual_adds)):
        if not isinstance(value, bool):
            raise ValueError(f"wide backend: option {name!r} must be a bool, got {value!r}")
    from wide_compile.passes.router_lowering import ONE_TOKEN_FORMS

    one_token = own.get("wide.one_token_routers", "reduction")
    if one_token not in ONE_TOKEN_FORMS:
        raise ValueError(f"wide backend: option 'wide.one_token_routers' must be one of {ONE_TOKEN_FORMS}, got "
                         f"{one_token!r}")
    if inner not in INNER_COMPILERS:
        raise ValueError(f"wide backend: option 'wide.inner' must be one of {INNER_COMPILERS}, got {inner!r}")
    modes = list_mode_options()
    if mode is not None and mode not in modes:
        raise ValueError(f"wide backend: unknown mode {mode!r}; known: {sorted(modes)}")
    if inner != "inductor" and (options or mode not in (None, "default")):
        raise ValueError(f"wide backend: mode / Inductor options need 'wide.inner' = 'inductor', not {inner!r}")
    known = torch._inductor.config.get_config_copy()
    bad = sorted(k for k in options if k not in known)
    if bad:
        raise ValueError(f"wide backend: unknown Inductor option(s) {bad} (see torch._inductor.config)")
    inductor_options = {**inductor_defaults(), **list_mode_options(mode or "default"), **options}
    return BackendSettings(rewrite, inner, inductor_options, fuse_routers, one_token, siblings, query_rope, presplit,
                           residual_adds)


_warned_plain = False


def _warn_plain_once() -> None:
    global _warned_plain
    if not _warned_plain:
        _warned_plain = True
        warnings.warn(
            "wide backend: a graph has no wide:: ops (the model was not transformed with wide_compile.apply(), or "
            "this graph is outside its routed layers); it is compiled with plain Inductor. "
            "Shown once per process.", WideBackendWarning, stacklevel=2)


def _inner_compile(gm: fx.GraphModule, example_inputs: Sequence, settings: BackendSettings) -> Callable:
    if settings.inner == "eager":
        return gm.forward
    if settings.inner == "aot_eager":
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend("aot_eager")(gm, example_inputs)
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs, config_patches=settings.inductor_options or None)


def _where(gm: fx.GraphModule) -> tuple[str, str | None]:
    reason = getattr(gm, "compile_subgraph_reason", None)
    stack = getattr(reason, "user_stack", None) or []
    code = f"{stack[0].filename}:{stack[0].lineno} in {stack[0].name}" if stack else "?"
    return code, (reason.reason if reason is not None and reason.graph_break else None)


def wide_backend(gm: fx.GraphModule, example_inputs: Sequence, mode: str | None = None,
                 options: dict | None = None) -> Callable:
    """Dynamo backend (registered as ``"wide"``): lower WIDE patterns in ``gm``, then compile it (Inductor)."""
    from wide_compile.passes.lowering import LoweringResult, lower_wide_patterns
    from wide_compile.passes.torch_patterns import wide_op_names

    settings = parse_settings(mode, options)
    wide_ops = wide_op_names(gm.graph)
    if not wide_ops:
        _warn_plain_once()
    rewrite = settings.rewrite and wide_ops
    result = (lower_wide_patterns(gm, fuse_routers=settings.fuse_routers, one_token_routers=settings.one_token_routers,
                                  dense_siblings=settings.fuse_dense_siblings, query_rope=settings.fuse_query_rope,
                                  presplit_routers=settings.presplit_routers,
                                  residual_adds=settings.fuse_residual_adds)
              if rewrite else LoweringResult())
    compiled = _inner_compile(gm, example_inputs, settings)
    compile_id = torch._guards.CompileContext.current_compile_id()
    code, graph_break = _where(gm)
    add_record(GraphRecord(  # after the inner compile: a Dynamo restart (exception) leaves no record
        compile_id=str(compile_id) if compile_id is not None else "?/0", code=code,
        nodes=sum(n.op in ("call_function", "call_method", "call_module") for n in gm.graph.nodes),
        wide_ops=wide_ops, lowered=result.lowered, generic=result.generic, graph_break=graph_break,
        inner=settings.inner, options=settings.inductor_options, graph_module=gm,
        storages=input_storages(example_inputs),
        is_recompile=bool(getattr(compile_id, "frame_compile_id", 0)), stored=dict(result.stored),
    ))
    return compiled


class _LazyEntry:
    """Stands in for an entry point in Dynamo's backend table, so that both ``import wide_compile`` and the
    ``torch_dynamo_backends`` entry point register ``"wide"`` once (Dynamo loads entries on first lookup)."""

    name, value = BACKEND_NAME, "wide_compile.backend:wide_backend"

    def load(self) -> Callable:
        return wide_backend


def _entry_point_installed() -> bool:
    from importlib.metadata import entry_points

    return any(ep.name == BACKEND_NAME and ep.value == _LazyEntry.value
               for ep in entry_points(group="torch_dynamo_backends"))


def _register() -> None:
    """Make ``"wide"`` known to Dynamo, importing Dynamo only when needed.

    Importing ``torch._dynamo`` imports Triton, which must not happen before ``TRITON_INTERPRET`` is set (CPU
    tests), and ``import wide_compile`` runs early (pytest plugin). With the package installed, Dynamo finds the
    ``torch_dynamo_backends`` entry point by itself on the first lookup of ``"wide"``; otherwise, or when Dynamo
    is already loaded, the backend is put in Dynamo's table now.
    """
    if "torch._dynamo" not in sys.modules and _entry_point_installed():
        return
    from torch._dynamo.backends import registry

    if BACKEND_NAME in getattr(registry, "_COMPILER_FNS", {}):
        return
    table = getattr(registry, "_BACKENDS", None)
    if isinstance(table, dict):
        table.setdefault(BACKEND_NAME, _LazyEntry())
    else:  # registry layout changed: fall back to the public decorator
        registry.register_backend(compiler_fn=wide_backend, name=BACKEND_NAME)


_register()
