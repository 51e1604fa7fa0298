"""Capture a HuggingFace causal LM as one aten-level FX graph (torch.export, non-strict).

``torch.fx.symbolic_trace`` cannot trace transformers-5 models (``**kwargs`` forwards), and Dynamo capture
pollutes the global compile caches; ``torch.export(strict=False)`` with ``use_cache=False`` traces every
architecture we support into a single graph whose nodes keep ``nn_module_stack`` (module paths) and whose
parameter placeholders map to fully-qualified parameter names. Parameters are fake during tracing, so
capture costs no real compute even for large models.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import fx

from .errors import DiscoveryError

CAPTURE_BATCH = 2
CAPTURE_TOKENS = 13  # a prime, so the sequence axis is never confused with heads or head_dim


@dataclass
class CapturedGraph:
    """An exported graph plus the names of the parameters behind its placeholders."""

    graph: fx.Graph
    param_of_placeholder: dict[str, str]  # placeholder node name -> parameter FQN
    params: dict[str, torch.nn.Parameter]  # parameter FQN -> parameter of the live model


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module):
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _dummy_input_ids(model: torch.nn.Module) -> torch.Tensor:
    vocab = getattr(model.config, "vocab_size", None) or model.get_input_embeddings().num_embeddings
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, int(vocab), (CAPTURE_BATCH, CAPTURE_TOKENS), generator=generator)
    return ids.to(device)


def capture(model: torch.nn.Module) -> CapturedGraph:
    """Export ``model`` (a causal LM) into one FX graph with ``use_cache=False``."""
    ids = _dummy_input_ids(model)
    try:
        with _eval_mode(model), torch.no_grad():
            program = torch.export.export(
                model, (), {"input_ids": ids, "use_cache": False}, strict=False
            )
    except Exception as exc:  # noqa: BLE001 - re-raised with context
        raise DiscoveryError(
            f"could not capture {type(model).__name__} with torch.export(strict=False, use_cache=False): "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    signature = program.graph_signature
    params = dict(model.named_parameters(remove_duplicate=False))
    return CapturedGraph(
        graph=program.graph,
        param_of_placeholder=dict(signature.inputs_to_parameters),
        params=params,
    )
