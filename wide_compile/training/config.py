"""``TrainConfig``: every knob of the two-stage router training (stage 1: routers; stage 2: routers + LoRA)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

DATA_MODES = ("packed", "document")
#: Default learning rate per stage (stage 1 trains only routers, stage 2 also LoRA adapters).
STAGE_LR = {1: 2e-3, 2: 2e-4}


@dataclass
class TrainConfig:
    """How :func:`wide_compile.train` trains a WIDE model.

    Length: give ``steps`` (optimizer steps) or ``tokens`` (training tokens; converted to
    ``ceil(tokens / (seq_len * batch_size * grad_accum))`` steps).

    Attributes:
        stage: 1 = freeze the base model, train only routers; 2 = LoRA adapters + routers.
        target_sparsity: target mean skip rate (None: the sparsity given to ``wide_compile.apply``).
        attn_target / mlp_target: optional separate targets for attention and MLP blocks (both or neither).
        lr: peak learning rate (None: 2e-3 in stage 1, 2e-4 in stage 2); cosine decay after a linear warm-up
            over ``warmup_frac`` of the steps.
        tau_start / tau_end: Gumbel temperature, linear from start (first step) to end (last step).
        skip_loss_weight: weight of ``|target - skip rate|`` added to the LM cross-entropy.
        bf16: bf16 autocast when training on CUDA (ignored on CPU).
        lora_*: LoRA adapters of stage 2 on the discovered q/k/v/o/gate/up/down projections.
        checkpoint_every: write a resumable checkpoint every N steps (0: only at the end); needs ``output_dir``.
        output_dir: checkpoints go to ``output_dir/checkpoint-<step>``, the trained model to ``output_dir/final``.
            None: nothing is written.
        resume_from: a checkpoint folder to continue from, or ``"latest"`` (newest in ``output_dir``).
        data: local files / folders / globs (jsonl, json, parquet, txt) or hub dataset names
            (``name`` or ``name:config``); None = the project's calibration mix (see ``training.data``).
        data_mode: ``"packed"`` (documents joined with EOS, cut into ``seq_len`` blocks) or ``"document"``
            (one document per sequence, truncated / padded, padding ignored in loss and skip rate).
        val_fraction: fraction of each source's documents held out for validation.
        eval_batches: validation batches evaluated at the end (0: no validation).
    """

    stage: int = 1
    target_sparsity: float | None = None
    attn_target: float | None = None
    mlp_target: float | None = None
    steps: int | None = None
    tokens: int | None = None
    seq_len: int = 512
    batch_size: int = 8
    grad_accum: int = 1
    lr: float | None = None
    weight_decay: float = 0.01
    warmup_frac: float = 0.1
    clip: float = 1.0
    tau_start: float = 5.0
    tau_end: float = 0.5
    skip_loss_weight: float = 20.0
    seed: int = 0
    bf16: bool = True
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.1
    checkpoint_every: int = 0
    output_dir: str | None = None
    resume_from: str | None = None
    data: list[str] | None = None
    data_mode: str = "packed"
    val_fraction: float = 0.02
    eval_batches: int = 4
    device: str | None = None
    progress: bool = True
    history: bool = True  # keep per-step metrics in TrainResult.history

    def __post_init__(self):
        if self.stage not in (1, 2):
            raise ValueError(f"stage must be 1 (routers only) or 2 (LoRA + routers), got {self.stage!r}")
        if isinstance(self.data, (str, Path)):
            self.data = [str(self.data)]
        for name in ("target_sparsity", "attn_target", "mlp_target"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= float(value) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        if (self.attn_target is None) != (self.mlp_target is None):
            raise ValueError("give both attn_target and mlp_target, or neither (then target_sparsity is used)")
        if (self.steps is None) == (self.tokens is None):
            raise ValueError("give exactly one of steps (optimizer steps) or tokens (training tokens)")
        for name in ("steps", "tokens", "seq_len", "batch_size", "grad_accum"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.seq_len < 2:
            raise ValueError(f"seq_len must be >= 2 (a token and its successor), got {self.seq_len}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0.0 <= self.warmup_frac < 1.0:
            raise ValueError(f"warmup_frac must be in [0, 1), got {self.warmup_frac}")
        if not (self.tau_start > 0 and self.tau_end > 0):
            raise ValueError(f"temperatures must be > 0, got tau_start={self.tau_start}, tau_end={self.tau_end}")
        if self.clip is not None and not self.clip > 0:
            raise ValueError(f"clip must be > 0 or None, got {self.clip}")
        if self.data_mode not in DATA_MODES:
            raise ValueError(f"data_mode must be one of {DATA_MODES}, got {self.data_mode!r}")
        if not 0.0 <= self.val_fraction < 0.5:
            raise ValueError(f"val_fraction must be in [0, 0.5), got {self.val_fraction}")
        if self.checkpoint_every < 0 or self.eval_batches < 0:
            raise ValueError("checkpoint_every and eval_batches must be >= 0")
        if self.checkpoint_every and self.output_dir is None:
            raise ValueError("checkpoint_every needs output_dir (where checkpoints are written)")
        if self.lora_r < 1 or self.lora_alpha <= 0 or not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"bad LoRA settings r={self.lora_r} alpha={self.lora_alpha} dropout={self.lora_dropout}")

    @property
    def peak_lr(self) -> float:
        return self.lr if self.lr is not None else STAGE_LR[self.stage]

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.batch_size * self.grad_accum

    @property
    def total_steps(self) -> int:
        return self.steps if self.steps is not None else max(1, math.ceil(self.tokens / self.tokens_per_step))

    def with_updates(self, **changes) -> "TrainConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_kwargs(cls, config: "TrainConfig | None" = None, **kwargs) -> "TrainConfig":
        """``config`` updated with ``kwargs`` (unknown names raise a ``TypeError`` listing the known ones)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown TrainConfig field(s) {unknown}; known: {sorted(known)}")
        if config is None:
            return cls(**kwargs)
        return replace(config, **kwargs) if kwargs else config
