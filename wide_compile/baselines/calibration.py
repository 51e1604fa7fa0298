"""Calibration batches for the static baselines: random token windows of C4 (as Wanda / FLAP use)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch

C4_FILE = "c4/c4_train00000_first1000.jsonl"


def calibration_batches(tokenizer: Any, samples: int = 128, seq_len: int = 512, batch_size: int = 8,
                        seed: int = 0, path: str | Path | None = None) -> list[torch.Tensor]:
    """``samples`` random windows of ``seq_len`` tokens from documents longer than that, in batches.

    Reads ``path`` (JSON lines with a ``text`` field; default ``<data_dir>/c4/c4_train00000_first1000.jsonl``,
    the C4 shard that Wanda / SparseGPT / FLAP calibrate on).  Returns input-id tensors ``[batch, seq_len]``.
    """
    if samples < 1 or seq_len < 2 or batch_size < 1:
        raise ValueError(f"need samples >= 1, seq_len >= 2, batch_size >= 1; got {samples}, {seq_len}, {batch_size}")
    if path is None:
        from wide_compile.data import data_dir

        root = data_dir()
        if root is None:
            raise FileNotFoundError(f"no data folder: set WIDE_DATA_DIR to a folder containing {C4_FILE}")
        path = root / C4_FILE
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"calibration text {path} not found")
    texts = [json.loads(line)["text"] for line in path.open(encoding="utf-8") if line.strip()]
    rng = random.Random(seed)
    windows: list[torch.Tensor] = []
    for _ in range(samples * 50):  # Wanda's sampler: pick a document, retry when it is too short
        if len(windows) == samples:
            break
        ids = tokenizer(rng.choice(texts), return_tensors="pt", verbose=False)["input_ids"][0]
        if ids.numel() > seq_len:
            start = rng.randint(0, ids.numel() - seq_len - 1)
            windows.append(ids[start:start + seq_len])
    if len(windows) < samples:
        raise ValueError(f"only {len(windows)} of {samples} documents in {path} are longer than {seq_len} tokens")
    return [torch.stack(windows[i:i + batch_size]) for i in range(0, samples, batch_size)]
