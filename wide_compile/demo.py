"""``wide-compile demo``: the whole WIDE story on one real model, in minutes on a laptop CPU.

fetch the model -> dense WikiText-2 perplexity -> ``apply(sparsity)`` -> perplexity with the untrained
routers -> short stage-1 router calibration -> WIDE perplexity (deterministic argmax routers) with the
realized skip rates -> table + JSON. Uses CUDA when present (longer calibration and windows); the CPU
defaults keep it to a few minutes, far too short for a good WIDE model at 50% sparsity: the
untrained-routers row shows how much the calibration already recovers.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

#: Per-device defaults: calibration tokens, WikiText-2 windows and their length, training sequence length and batch.
CPU_DEFAULTS = {"tokens": 16_384, "windows": 8, "seq_len": 256, "train_seq_len": 256, "batch_size": 2}
CUDA_DEFAULTS = {"tokens": 2_000_000, "windows": 40, "seq_len": 1024, "train_seq_len": 1024, "batch_size": 8}
#: Peak calibration LR of the demo: its few dozen CPU steps learn more with it than with the stage-1 default 2e-3
#: (SmolLM2, CPU defaults, same router initialisation: WIDE perplexity 2.7k with 1e-2 vs 5.0k with 2e-3).
DEMO_LR = 1e-2
#: Evaluation text is cut to ``windows * seq_len * CHARS_PER_TOKEN_BOUND`` characters before tokenizing: far more
#: than the scored windows need (English BPE averages ~4 characters per token), so the windows are unchanged.
CHARS_PER_TOKEN_BOUND = 32


@dataclass
class DemoResult:
    """Dense vs WIDE perplexity, realized skip rates and how long each part took."""

    model: str
    device: str
    sparsity: float
    seq_len: int  # evaluation window
    windows: int
    eval_tokens: int  # scored tokens per evaluation
    dense_ppl: float
    untrained_ppl: float  # WIDE with freshly initialised routers
    wide_ppl: float  # WIDE after the calibration
    untrained_skip_rates: dict
    skip_rates: dict  # {"attention", "mlp", "mean"} realized during the calibrated WIDE evaluation
    train: dict  # steps, tokens, seq_len, batch_size, lr, seconds, tokens_per_second, last step metrics
    seconds: dict = field(default_factory=dict)  # load, dense_eval, apply, untrained_eval, train, wide_eval, total
    versions: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        def wide_row(label, rates, ppl):
            return (label, *(f"{rates.get(k, float('nan')):.3f}" for k in ("attention", "mlp", "mean")), f"{ppl:.3f}")

        rows = [("dense", "-", "-", "-", f"{self.dense_ppl:.3f}"),
                wide_row(f"WIDE {self.sparsity:.2f} untrained routers", self.untrained_skip_rates, self.untrained_ppl),
                wide_row(f"WIDE {self.sparsity:.2f} calibrated", self.skip_rates, self.wide_ppl)]
        head = ("model", "skip attn", "skip mlp", "skip mean", f"WikiText-2 PPL ({self.windows}x{self.seq_len})")
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
        t = self.train
        lines.append(f"calibration: {t['tokens']} tokens, {t['steps']} steps of {t['batch_size']}x{t['seq_len']}, "
                     f"{t['tokens_per_second']:.0f} tok/s on {self.device}; total {self.seconds.get('total', 0):.0f} s")
        return "\n".join(lines)


def _versions() -> dict:
    import transformers

    import wide_compile

    return {"wide_compile": wide_compile.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def _skip_summary(meter) -> dict:
    by_kind: dict[str, list[float]] = {}
    for (_, kind), rate in meter.rates().items():
        by_kind.setdefault(kind, []).append(rate)
    rates = {kind: sum(v) / len(v) for kind, v in by_kind.items()}
    rates["mean"] = sum(rates.values()) / len(rates)
    return rates


def run_demo(model: str | nn.Module = "smollm2", tokenizer=None, *, sparsity: float = 0.5, tokens: int | None = None,
             windows: int | None = None, seq_len: int | None = None, train_seq_len: int | None = None,
             batch_size: int | None = None, lr: float = DEMO_LR, data: list[str] | None = None,
             device: str | None = None, out: str | Path | None = None, seed: int = 0, progress: bool = True,
             cache_dir: str | None = None, text: str | None = None, **wide_kwargs) -> DemoResult:
    """Run the demo and return (and optionally write to ``out`` as JSON) its :class:`DemoResult`.

    Args:
        model: a model-zoo alias / local folder / hub id, or an already loaded HF causal LM (then pass
            ``tokenizer``); the model is modified in place (routers added).
        sparsity: target skip rate given to ``wide_compile.apply`` and the calibration.
        tokens / windows / seq_len / train_seq_len / batch_size: calibration tokens, WikiText-2 windows
            evaluated, window length, training sequence length and batch; ``None`` = per-device defaults
            (:data:`CPU_DEFAULTS`, :data:`CUDA_DEFAULTS`).
        lr: peak calibration learning rate (see :data:`DEMO_LR`).
        data: calibration data (default: the ``$WIDE_DATA_DIR`` mix, see ``wide_compile.training``).
        text: evaluation text (default: the WikiText-2 raw test split).
        wide_kwargs: extra ``wide_compile.apply`` options (e.g. ``ffn_group_size``).
    """
    import wide_compile
    from wide_compile.data import wikitext2_test_text
    from wide_compile.evaluation import perplexity
    from wide_compile.model_zoo import load_model
    from wide_compile.training import TrainConfig, train
    from wide_compile.training.data_sources import resolve_sources

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    defaults = CUDA_DEFAULTS if torch.device(device).type == "cuda" else CPU_DEFAULTS
    tokens, windows = tokens or defaults["tokens"], windows or defaults["windows"]
    seq_len, batch_size = seq_len or defaults["seq_len"], batch_size or defaults["batch_size"]
    train_seq_len = train_seq_len or min(seq_len, defaults["train_seq_len"])
    config = TrainConfig(stage=1, target_sparsity=sparsity, tokens=tokens, seq_len=train_seq_len, lr=lr,
                         batch_size=batch_size, data=data, seed=seed, eval_batches=0, device=device,
                         progress=progress, history=False)
    resolve_sources(config.data)  # bad data fails before the model is fetched
    text = wikitext2_test_text() if text is None else text
    text = text[: windows * seq_len * CHARS_PER_TOKEN_BOUND]  # only the first windows are scored
    start = time.perf_counter()
    seconds: dict[str, float] = {}

    name = model if isinstance(model, str) else type(model).__name__
    if isinstance(model, str):
        model, tokenizer = load_model(model, device=device, cache_dir=cache_dir)
    elif tokenizer is None:
        raise ValueError("run_demo(model=<module>) needs its tokenizer")
    model.to(device).eval()
    seconds["load"] = time.perf_counter() - start

    def timed(key, fn):
        t0 = time.perf_counter()
        value = fn()
        seconds[key] = time.perf_counter() - t0
        return value

    def evaluate():
        with wide_compile.track_skip_rates(model) as meter:
            return perplexity(model, tokenizer, text, window=seq_len, max_windows=windows, progress=progress), meter

    dense = timed("dense_eval", lambda: perplexity(model, tokenizer, text, window=seq_len, max_windows=windows,
                                                   progress=progress))
    torch.manual_seed(seed)  # router initialisation: the demo gives the same numbers every run
    timed("apply", lambda: wide_compile.apply(model, sparsity=sparsity, **wide_kwargs))
    untrained, untrained_meter = timed("untrained_eval", evaluate)
    trained = timed("train", lambda: train(model, tokenizer, config))
    wide, meter = timed("wide_eval", evaluate)
    seconds["total"] = time.perf_counter() - start
    result = DemoResult(
        model=name, device=str(device), sparsity=sparsity, seq_len=seq_len, windows=dense.windows,
        eval_tokens=dense.tokens, dense_ppl=dense.ppl, untrained_ppl=untrained.ppl, wide_ppl=wide.ppl,
        untrained_skip_rates=_skip_summary(untrained_meter), skip_rates=_skip_summary(meter),
        train={"steps": trained.steps, "tokens": trained.tokens, "seq_len": train_seq_len, "batch_size": batch_size,
               "lr": config.peak_lr, "seconds": trained.seconds, "tokens_per_second": trained.tokens_per_second,
               "last": trained.last},
        seconds={k: round(v, 2) for k, v in seconds.items()}, versions=_versions(),
    )
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result.to_dict(), indent=2))
    return result
