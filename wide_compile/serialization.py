"""Save / load a WIDE model: the base model as a normal HF folder plus ``wide_config.json`` and routers.

``wide_compile.save(model, path)`` writes the base weights with ``save_pretrained`` (so plain
``from_pretrained(path)`` still gives the dense model) and the routers to ``wide_routers.safetensors``.
``wide_compile.load(path)`` rebuilds the WIDE model: from_pretrained, apply() with the saved config, routers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from . import __version__
from .api import apply
from .config import WideConfig
from .state import ROUTERS_ATTR, get_state

CONFIG_FILE = "wide_config.json"
ROUTERS_FILE = "wide_routers.safetensors"


def router_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The routers' parameters, keyed by their names in ``model.state_dict()``."""
    get_state(model)
    return {k: v for k, v in model.state_dict().items() if f".{ROUTERS_ATTR}." in f".{k}"}


def _layout(model: nn.Module) -> dict:
    return {f"{b.layer_path}.{b.kind}": [b.groups, b.group_width] for b in get_state(model).blocks}


def write_routers(model: nn.Module, folder: str | Path) -> None:
    """Write ``wide_routers.safetensors`` and ``wide_config.json`` (config + group layout) into ``folder``."""
    folder = Path(folder)
    state = get_state(model)
    folder.mkdir(parents=True, exist_ok=True)
    routers = router_state_dict(state.root)
    save_file({k: v.detach().contiguous().cpu() for k, v in routers.items()}, str(folder / ROUTERS_FILE))
    meta = {"wide_compile_version": __version__, "config": state.config.to_dict(),
            "architecture": state.blueprint.architecture, "layout": _layout(state.root)}
    (folder / CONFIG_FILE).write_text(json.dumps(meta, indent=2))


def save(model: nn.Module, path: str | Path, **save_pretrained_kwargs) -> Path:
    """Write the base model (HF format), ``wide_config.json`` and ``wide_routers.safetensors`` to ``path``."""
    path = Path(path)
    routers = router_state_dict(model)
    base = {k: v for k, v in model.state_dict().items() if k not in routers}
    model.save_pretrained(path, state_dict=base, **save_pretrained_kwargs)
    write_routers(model, path)
    return path


def load_routers(model: nn.Module, path: str | Path) -> nn.Module:
    """Load routers saved by :func:`save` (or a training checkpoint) into a transformed model."""
    path = Path(path)
    file = path / ROUTERS_FILE if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(f"no {ROUTERS_FILE} in {path}")
    meta_file = file.parent / CONFIG_FILE
    if meta_file.exists():
        saved_layout = json.loads(meta_file.read_text()).get("layout")
        if saved_layout is not None and saved_layout != _layout(model):
            raise ValueError(
                f"routers in {file.parent} were saved for another model or group layout "
                f"({_describe_diff(saved_layout, _layout(model))})"
            )
    tensors = load_file(str(file))
    expected = router_state_dict(model)
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    bad_shape = [k for k in expected if k in tensors and tensors[k].shape != expected[k].shape]
    if missing or unexpected or bad_shape:
        raise ValueError(
            f"router checkpoint {file} does not fit this model: missing={missing[:3]} unexpected={unexpected[:3]} "
            f"shape mismatch={bad_shape[:3]} (another model or group layout?)"
        )
    model.load_state_dict(tensors, strict=False)
    return model


def _describe_diff(saved: dict, current: dict) -> str:
    for key in sorted(set(saved) | set(current)):
        if saved.get(key) != current.get(key):
            return f"{key}: saved groups/width {saved.get(key)}, model has {current.get(key)}"
    return "layouts differ"


def apply_saved(model: nn.Module, path: str | Path, **fallback_apply_kwargs) -> nn.Module:
    """:func:`apply` with the configuration saved beside the routers at ``path`` (a :func:`save` folder or a routers
    file), then :func:`load_routers`; where no configuration was saved, ``apply(model, **fallback_apply_kwargs)``."""
    path = Path(path)
    meta_file = (path if path.is_dir() else path.parent) / CONFIG_FILE
    if meta_file.exists():
        apply(model, config=WideConfig.from_dict(json.loads(meta_file.read_text())["config"]))
    else:
        apply(model, **fallback_apply_kwargs)
    return load_routers(model, path)


def load(path: str | Path, **from_pretrained_kwargs) -> nn.Module:
    """Rebuild a WIDE model saved with :func:`save`."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not (path / CONFIG_FILE).exists():
        raise FileNotFoundError(f"{path} has no {CONFIG_FILE}: it was not saved with wide_compile.save()")
    model = AutoModelForCausalLM.from_pretrained(path, **from_pretrained_kwargs)
    return apply_saved(model, path)
