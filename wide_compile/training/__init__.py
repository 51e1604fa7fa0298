"""Two-stage WIDE router training: ``wide_compile.train(model, tokenizer, TrainConfig(...))``.

Modules: ``config`` (TrainConfig), ``data_sources`` (files / hub names, checked before compute),
``sequences`` (tokenize, pack or pad, resumable batch order), ``schedules`` (temperature, LR),
``loss`` (CE + skip-rate penalty), ``lora`` (stage-2 adapters), ``checkpoint`` (exact resume),
``validation`` (held-out metrics), ``trainer`` (the loop).
"""

from .config import TrainConfig
from .trainer import TrainResult, train

__all__ = ["TrainConfig", "TrainResult", "train"]
