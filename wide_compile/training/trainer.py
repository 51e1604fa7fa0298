"""``wide_compile.train``: the two-stage WIDE router training loop.

Stage 1 freezes every base weight and trains only the routers; stage 2 adds LoRA adapters on the
discovered projections and trains them with the routers, then merges them (``merge_and_unload``).
Each optimizer step: set the Gumbel temperature (linear ``tau_start -> tau_end``), run ``grad_accum``
micro-batches with hard Gumbel straight-through routers, loss = LM cross-entropy +
``skip_loss_weight * |target - realized skip rate|``, clip, AdamW, cosine LR with warm-up.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

import wide_compile
from wide_compile.state import find_state, get_state

from .checkpoint import (PREFIX, RESUME_KEYS, TrainerState, latest_checkpoint, load_checkpoint, read_trainer_file,
                         check_settings, save_checkpoint)
from .config import TrainConfig
from .data_sources import resolve_sources
from .loss import SkipTargets, realized_skip_rates, wide_loss
from .schedules import lr_multiplier, temperature_at
from .sequences import BatchOrder, build_sequences
from .validation import validation_metrics


@dataclass
class TrainResult:
    """What :func:`train` produced."""

    model: nn.Module  #: the trained WIDE model (stage 2: LoRA merged), in eval mode
    config: TrainConfig
    steps: int  #: optimizer steps done in total (including those before a resume)
    tokens: int  #: training tokens seen in total (padding excluded)
    seconds: float  #: wall time of the steps run by this call
    tokens_per_second: float  #: training throughput of this call
    last: dict  #: metrics of the last step (loss, ce, skip rates, tau, lr)
    validation: dict | None  #: held-out CE / perplexity / skip rates with argmax routers (None: no data)
    history: list[dict] = field(default_factory=list)
    saved_to: Path | None = None  #: ``output_dir/final`` (``wide_compile.load`` reads it)
    checkpoints: list[Path] = field(default_factory=list)


def _targets(model: nn.Module, cfg: TrainConfig) -> SkipTargets:
    mean = cfg.target_sparsity if cfg.target_sparsity is not None else get_state(model).config.sparsity
    if cfg.attn_target is not None:
        mean = (cfg.attn_target + cfg.mlp_target) / 2
    return SkipTargets(float(mean), cfg.attn_target, cfg.mlp_target)


def _settings(cfg: TrainConfig) -> dict:
    values = cfg.to_dict() | {"total_steps": cfg.total_steps}
    return {k: values[k] for k in RESUME_KEYS}


def _resume_folder(cfg: TrainConfig) -> Path | None:
    if cfg.resume_from is None:
        return None
    if cfg.resume_from == "latest":
        if cfg.output_dir is None:
            raise ValueError("resume_from='latest' needs output_dir")
        return latest_checkpoint(cfg.output_dir)  # None: nothing to resume, start fresh
    folder = Path(cfg.resume_from)
    if not folder.is_dir():
        raise FileNotFoundError(f"checkpoint folder {folder} does not exist")
    return folder


def _optimizer(params: list[tuple[str, nn.Parameter]], cfg: TrainConfig) -> torch.optim.AdamW:
    decay = [p for _, p in params if p.ndim >= 2]
    no_decay = [p for _, p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.peak_lr)


def _prepare_model(model: nn.Module, cfg: TrainConfig, device: torch.device) -> nn.Module:
    """Freeze the base, add LoRA in stage 2, make routers trainable; returns the model to train."""
    model.to(device)
    for p in model.parameters():
        p.requires_grad_(False)
    if cfg.stage == 2:
        from .lora import add_lora

        model = add_lora(model, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout)
    for p in wide_compile.router_parameters(model):
        p.requires_grad_(True)
    return model


def _step_metrics(step, loss, ce, rates, tau, lr) -> dict:
    row = {"step": step, "loss": loss, "ce": ce, "tau": tau, "lr": lr}
    row.update({f"skip_{kind}": value for kind, value in rates.items()})
    return row


def train(model: nn.Module, tokenizer, config: TrainConfig | None = None, **kwargs) -> TrainResult:
    """Train the routers of a WIDE model (``wide_compile.apply`` is called with the target if not yet done).

    Args:
        model: a HuggingFace causal LM, usually already transformed with :func:`wide_compile.apply`.
        tokenizer: its tokenizer.
        config: a :class:`TrainConfig`; ``kwargs`` override its fields (or build one), e.g.
            ``train(model, tok, stage=1, tokens=200_000, seq_len=256)``.

    Returns:
        :class:`TrainResult` (``result.model`` is the trained model; in stage 2 a new object with merged LoRA).
    """
    cfg = TrainConfig.from_kwargs(config, **kwargs)
    sources = resolve_sources(cfg.data)  # bad data paths fail here, before any compute
    resume = _resume_folder(cfg)
    if resume is not None:
        check_settings(read_trainer_file(resume)["settings"], _settings(cfg), resume)
    total = cfg.total_steps
    train_set, val_set = build_sequences(  # tokenized before the model is touched: data errors leave it as it was
        sources, tokenizer, seq_len=cfg.seq_len, mode=cfg.data_mode,
        train_sequences=total * cfg.batch_size * cfg.grad_accum, val_sequences=cfg.eval_batches * cfg.batch_size,
        val_fraction=cfg.val_fraction, seed=cfg.seed,
    )
    if find_state(model) is None:
        wide_compile.apply(model, sparsity=cfg.target_sparsity if cfg.target_sparsity is not None else 0.5)
    targets = _targets(model, cfg)
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    autocast = cfg.bf16 and device.type == "cuda"

    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    trainable_before = {p: p.requires_grad for p in model.parameters()}
    model = _prepare_model(model, cfg, device)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    optimizer = _optimizer(params, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, total, cfg.warmup_frac))
    state = TrainerState(0, 0, 0, _settings(cfg))
    if resume is not None:
        state = load_checkpoint(resume, model, optimizer, scheduler, state.settings)
    order = BatchOrder(len(train_set), cfg.batch_size, cfg.seed, position=state.data_position)

    result = _run_steps(model, cfg, targets, optimizer, scheduler, train_set, order, state, device, autocast)
    history, checkpoints, seconds, new_tokens = result

    lora_merged = cfg.stage == 2
    if cfg.output_dir is not None and state.step > 0:
        checkpoints.append(_checkpoint(cfg, model, optimizer, scheduler, state))
    if lora_merged:
        model = model.merge_and_unload()
    for p in model.parameters():  # give the caller back its requires_grad flags (routers stay trainable)
        p.requires_grad_(trainable_before.get(p, p.requires_grad))
    model.eval()
    validation = validation_metrics(model, val_set, cfg.batch_size, cfg.eval_batches, device, autocast)
    saved_to = None
    if cfg.output_dir is not None:
        saved_to = wide_compile.save(model, Path(cfg.output_dir) / "final")
        if hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(saved_to)  # the folder is then a complete model for load_model / CLI
    return TrainResult(
        model=model, config=cfg, steps=state.step, tokens=state.tokens, seconds=seconds,
        tokens_per_second=new_tokens / seconds if seconds > 0 else 0.0,
        last=history[-1] if history else {}, validation=validation, history=history if cfg.history else [],
        saved_to=saved_to, checkpoints=checkpoints,
    )


def _checkpoint(cfg, model, optimizer, scheduler, state: TrainerState) -> Path:
    lora = None
    if cfg.stage == 2:
        from .lora import lora_state_dict

        lora = lora_state_dict(model)
    return save_checkpoint(Path(cfg.output_dir) / f"{PREFIX}{state.step}", model, optimizer, scheduler, state, lora)


def _run_steps(model, cfg, targets, optimizer, scheduler, train_set, order, state, device, autocast):
    from tqdm.auto import tqdm

    total = cfg.total_steps
    params = [p for group in optimizer.param_groups for p in group["params"]]
    history, checkpoints = [], []
    new_tokens, start_time = 0, time.perf_counter()
    bar = tqdm(total=total, initial=state.step, desc=f"wide stage {cfg.stage}", unit="step", disable=not cfg.progress)
    model.train()
    try:
        while state.step < total:
            tau = temperature_at(state.step, total, cfg.tau_start, cfg.tau_end)
            wide_compile.set_temperature(model, tau)
            lr = optimizer.param_groups[0]["lr"]
            loss_sum, ce_sum, rate_sums = 0.0, 0.0, {}
            for _ in range(cfg.grad_accum):
                indices = order.next_indices()
                batch = {k: v.to(device) for k, v in train_set.batch(indices).items()}
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                    out = model(**batch, use_cache=False)
                rates = realized_skip_rates(model, batch.get("attention_mask"))
                loss = wide_loss(out.loss.float(), rates, targets, cfg.skip_loss_weight)
                (loss / cfg.grad_accum).backward()
                mask = batch.get("attention_mask")
                tokens = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
                state.tokens, new_tokens = state.tokens + tokens, new_tokens + tokens
                loss_sum, ce_sum = loss_sum + loss.item(), ce_sum + out.loss.item()
                for kind, value in rates.items():
                    rate_sums[kind] = rate_sums.get(kind, 0.0) + value.item()
            if cfg.clip is not None:
                torch.nn.utils.clip_grad_norm_(params, cfg.clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            state.step, state.data_position = state.step + 1, order.position
            n = cfg.grad_accum
            row = _step_metrics(state.step, loss_sum / n, ce_sum / n, {k: v / n for k, v in rate_sums.items()}, tau, lr)
            history.append(row)
            elapsed = time.perf_counter() - start_time
            bar.set_postfix(loss=f"{row['loss']:.3f}", ce=f"{row['ce']:.3f}",
                            attn=f"{row.get('skip_attention', float('nan')):.2f}",
                            mlp=f"{row.get('skip_mlp', float('nan')):.2f}", tok_s=f"{new_tokens / elapsed:.0f}")
            bar.update(1)
            if cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0 and state.step < total:
                checkpoints.append(_checkpoint(cfg, model, optimizer, scheduler, state))
    finally:
        bar.close()
    return history, checkpoints, time.perf_counter() - start_time, new_tokens
