"""Public API: ``apply``, ``describe``, forced decisions, temperatures and skip-rate introspection."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from .config import WideConfig
from .state import Forced, SkipRateMeter, find_state, get_state


class WideError(ValueError):
    """A model or argument that ``wide_compile`` cannot work with (the message says why)."""


def _check_causal_lm(model) -> None:
    from transformers import PreTrainedModel
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if not isinstance(model, PreTrainedModel):
        raise WideError(f"apply() needs a HuggingFace PreTrainedModel causal LM, got {type(model).__name__}")
    causal_names = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    name = type(model).__name__
    if getattr(model.config, "is_encoder_decoder", False) or (
        name not in causal_names and not name.endswith(("ForCausalLM", "LMHeadModel"))
    ):
        raise WideError(
            f"apply() needs a decoder-only causal LM (an AutoModelForCausalLM class); got {name}"
        )


def apply(model: nn.Module, sparsity: float = 0.5, *, attn_group_size: int | None = None,
          ffn_group_size: int = 128, router_rank: int = 32, budget: str = "learned",
          blocks: tuple[str, ...] = ("attention", "mlp"), allow_partial: bool = False,
          router_dtype: torch.dtype = torch.float32, seed: int | None = None,
          config: WideConfig | None = None) -> nn.Module:
    """Make ``model`` a WIDE model: per-token routers choose which head / channel groups run.

    Finds every decoder layer's attention and MLP blocks from the model's captured graph (no
    per-architecture code), adds one low-rank router per layer and sublayer, and masks the input of each
    output / down projection per token and group. Returns the same model object, still a normal HF model.
    ``seed`` makes the router initialisation reproducible (otherwise it draws from torch's global RNG).

    Raises ``ValueError``/``WideError`` (model left unchanged) for a bad sparsity or group size, a model that is
    not a causal LM, a graph with an unrecognised block, or a model that was already transformed.
    """
    from wide_compile.passes.discovery import discover
    from wide_compile.passes.router_insertion import install

    config = config or WideConfig(sparsity=sparsity, attn_group_size=attn_group_size, ffn_group_size=ffn_group_size,
                                  router_rank=router_rank, budget=budget, blocks=blocks, allow_partial=allow_partial)
    _check_causal_lm(model)
    if find_state(model) is not None:
        raise WideError("wide_compile.apply() was already applied to this model; call wide_compile.remove() first")
    blueprint = discover(model, allow_partial=config.allow_partial)
    install(model, blueprint, config, router_dtype=router_dtype, seed=seed)
    return model


def remove(model: nn.Module) -> nn.Module:
    """Undo :func:`apply`: drop routers and hooks (the base weights were never touched)."""
    from wide_compile.passes.router_insertion import uninstall

    uninstall(model, get_state(model))
    return model


def is_applied(model: nn.Module) -> bool:
    return find_state(model) is not None


def config_of(model: nn.Module) -> WideConfig:
    return get_state(model).config


def describe(model: nn.Module, print_table: bool = True) -> list[dict]:
    """One row per layer and block: kind, module paths, heads, channels, groups (discovers if needed)."""
    from wide_compile.passes.discovery import discover
    from wide_compile.passes.routing_plan import plan_blocks

    state = find_state(model)
    if state is not None:
        blueprint, config = state.blueprint, state.config
    else:
        blueprint, config = discover(model), WideConfig()
    specs = {(s.layer_index, s.kind): s for s in plan_blocks(blueprint, ("attention", "mlp"),
                                                              config.attn_group_size, config.ffn_group_size)}
    rows = []
    for layer in blueprint.layers:
        if layer.attention is not None:
            a, spec = layer.attention, specs.get((layer.index, "attention"))
            rows.append({
                "layer": layer.index, "block": "attention", "path": layer.path,
                "modules": f"q={a.q_proj} k={a.k_proj} v={a.v_proj} o={a.o_proj}",
                "router_input": a.router_source, "heads": f"{a.num_heads}q/{a.num_kv_heads}kv x {a.head_dim}",
                "channels": a.width, "groups": spec.groups if spec else None,
                "group_width": spec.group_width if spec else None, "parallel": layer.parallel,
            })
        if layer.mlp is not None:
            m, spec = layer.mlp, specs.get((layer.index, "mlp"))
            kind = ("gated" if m.gated else "plain") + f"-{m.activation}" + ("-fused" if m.fused_gate_up else "")
            rows.append({
                "layer": layer.index, "block": "mlp", "path": layer.path,
                "modules": f"in={','.join(m.in_projs)} down={m.down_proj} ({kind})",
                "router_input": m.router_source, "heads": "", "channels": m.intermediate,
                "groups": spec.groups if spec else None, "group_width": spec.group_width if spec else None,
                "parallel": layer.parallel,
            })
    if print_table:
        print(format_table(rows, blueprint.architecture))
    return rows


def format_table(rows: list[dict], title: str) -> str:
    cols = ["layer", "block", "heads", "channels", "groups", "group_width", "router_input", "modules"]
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = [title, "  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


@contextlib.contextmanager
def forced(model: nn.Module, decisions: Forced) -> Iterator[None]:
    """Force decisions inside the block: ``"execute"``, ``"skip"``, ``{(layer, kind): mask}`` or a callable
    ``fn(block, mask_shape) -> mask``. Routers do not run while forced."""
    state = get_state(model)
    previous = state.forced
    set_forced(model, decisions)
    try:
        yield
    finally:
        state.forced = previous


def set_forced(model: nn.Module, decisions: Forced | None) -> None:
    """Like :func:`forced`, without a context (``None`` gives control back to the routers)."""
    if isinstance(decisions, str) and decisions not in ("execute", "skip"):
        raise ValueError(f"forced decisions must be 'execute', 'skip', a dict of masks or a callable, got {decisions!r}")
    get_state(model).forced = decisions


def set_temperature(model: nn.Module, tau: float) -> None:
    """Gumbel-softmax temperature used by the routers in training mode."""
    if not tau > 0:
        raise ValueError(f"temperature must be > 0, got {tau}")
    for block in get_state(model).blocks:
        block.router.tau.fill_(float(tau))


def routers(model: nn.Module) -> list[nn.Module]:
    return [b.router for b in get_state(model).blocks]


def router_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for r in routers(model) for p in r.parameters()]


def router_parameter_fraction(model: nn.Module) -> float:
    """Router parameters as a fraction of the base model's parameters."""
    routers_n = sum(p.numel() for p in router_parameters(model))
    total = sum(p.numel() for p in model.parameters())
    return routers_n / max(1, total - routers_n)


def skip_rates(model: nn.Module) -> dict:
    """Realized skip rates of the last forward: per ``(layer, kind)``, per kind and overall mean."""
    from .state import realized_masks

    per_block = {k: float(1.0 - m.float().mean()) for k, m in realized_masks(model).items()}
    by_kind: dict[str, list[float]] = {}
    for (_, kind), rate in per_block.items():
        by_kind.setdefault(kind, []).append(rate)
    summary = {kind: sum(v) / len(v) for kind, v in by_kind.items()}
    summary["mean"] = sum(summary.values()) / len(summary) if summary else float("nan")
    return {"blocks": per_block, **summary}


@contextlib.contextmanager
def track_skip_rates(model: nn.Module) -> Iterator[SkipRateMeter]:
    """Accumulate realized skip rates over every forward inside the block (e.g. a whole evaluation)."""
    state = get_state(model)
    meter, previous = SkipRateMeter(), state.meter
    state.meter = meter
    try:
        yield meter
    finally:
        state.meter = previous
