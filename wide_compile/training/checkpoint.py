"""Resumable training checkpoints: routers, LoRA adapters, optimizer, scheduler, step, RNG, data position.

Layout of ``<output_dir>/checkpoint-<step>/``:

* ``wide_routers.safetensors`` + ``wide_config.json``: the routers in the format of
  :func:`wide_compile.save` (``wide_compile.load_routers(model, folder)`` reads them, and refuses a model
  with another group layout);
* ``lora.safetensors`` (stage 2): the adapter weights;
* ``trainer_state.pt``: optimizer, scheduler, step, RNG states, data position and the settings that must
  match for an exact resume.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from wide_compile.serialization import load_routers, write_routers
from wide_compile.state import get_state

TRAINER_FILE = "trainer_state.pt"
LORA_FILE = "lora.safetensors"
PREFIX = "checkpoint-"
#: Settings that fix the data order and schedules: a checkpoint resumes only with the same values.
RESUME_KEYS = ("stage", "seq_len", "batch_size", "grad_accum", "data_mode", "seed", "total_steps", "data",
               "val_fraction", "tau_start", "tau_end", "warmup_frac")


@dataclass
class TrainerState:
    step: int  # optimizer steps done
    data_position: int  # training sequences consumed
    tokens: int  # training tokens consumed (padding excluded)
    settings: dict  # RESUME_KEYS values of the run that wrote it


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(folder: Path, model: nn.Module, optimizer, scheduler, trainer: TrainerState,
                    lora: dict | None = None) -> Path:
    """Write a checkpoint atomically (temporary sibling folder, then rename)."""
    folder = Path(folder)
    tmp = folder.with_name(f".tmp-{folder.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_routers(model, tmp)
    if lora:
        save_file(lora, str(tmp / LORA_FILE))
    torch.save({"step": trainer.step, "data_position": trainer.data_position, "tokens": trainer.tokens,
                "settings": trainer.settings, "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "rng": rng_state()}, tmp / TRAINER_FILE)
    if folder.exists():
        shutil.rmtree(folder)
    os.rename(tmp, folder)
    return folder


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The checkpoint with the highest step in ``output_dir`` (None when there is none)."""
    folders = [p for p in Path(output_dir).glob(f"{PREFIX}*") if (p / TRAINER_FILE).is_file()]
    steps = {p: int(p.name[len(PREFIX):]) for p in folders if p.name[len(PREFIX):].isdigit()}
    return max(steps, key=steps.get) if steps else None


def read_trainer_file(folder: Path) -> dict:
    file = Path(folder) / TRAINER_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{folder} is not a training checkpoint (no {TRAINER_FILE})")
    return torch.load(file, map_location="cpu", weights_only=True)


def check_settings(saved: dict, current: dict, folder: Path) -> None:
    """Refuse to resume with settings that change the data order or the schedules."""
    diffs = [f"{k}: checkpoint {saved.get(k)!r}, now {current.get(k)!r}" for k in RESUME_KEYS
             if saved.get(k) != current.get(k)]
    if diffs:
        raise ValueError(f"cannot resume exactly from {folder}: settings differ ({'; '.join(diffs)})")


def load_checkpoint(folder: Path, model: nn.Module, optimizer, scheduler, settings: dict) -> TrainerState:
    """Restore routers (layout checked), LoRA adapters, optimizer, scheduler and RNG from ``folder``."""
    folder = Path(folder)
    saved = read_trainer_file(folder)
    check_settings(saved["settings"], settings, folder)
    load_routers(get_state(model).root, folder)
    lora_file = folder / LORA_FILE
    if settings["stage"] == 2:
        if not lora_file.is_file():
            raise ValueError(f"stage-2 checkpoint {folder} has no {LORA_FILE}")
        from .lora import load_lora_state_dict

        device = next(model.parameters()).device
        load_lora_state_dict(model, {k: v.to(device) for k, v in load_file(str(lora_file)).items()})
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    set_rng_state(saved["rng"])
    return TrainerState(saved["step"], saved["data_position"], saved["tokens"], saved["settings"])
