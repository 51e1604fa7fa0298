"""Record the decisions of trained WIDE routers on held-out text, for the kernel benchmarks' ``trained`` masks.

    python3 benchmarks/trained_masks.py --model RUN/final --windows 16 --seq-len 512 \
        --out benchmarks/results/trained_masks_smollm2.npz

Loads a WIDE folder (``wide_compile.load``: a model with trained routers), runs inference forwards (argmax
decisions) over WikiText-2 **test** windows (text the routers were not trained on) and saves every layer's realized
masks, bit-packed: ``mlp`` ``[layers, tokens, ffn groups]`` and ``attention`` ``[layers, tokens, head groups]``, with
the model, the windows and the skip rates in ``meta`` (JSON). ``benchmarks/kernels_linear_ops.trained_mask`` lays
these masks out at Llama-3-8B's group counts (see there). CPU is enough for a 135M model.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

import numpy as np
import torch

import wide_compile
from wide_compile.data import wikitext2_test_text
from wide_compile.state import realized_masks


def record(model, ids: torch.Tensor, windows: int, seq_len: int) -> dict[str, np.ndarray]:
    """Per kind, ``[layers, windows * seq_len, groups]`` bool decisions of ``windows`` consecutive windows."""
    per_kind: dict[str, dict[int, list[np.ndarray]]] = {"attention": {}, "mlp": {}}
    with torch.no_grad():
        for w in range(windows):
            chunk = ids[w * seq_len:(w + 1) * seq_len][None]
            if chunk.shape[1] < seq_len:
                raise SystemExit(f"the text holds only {w} windows of {seq_len} tokens")
            model(chunk)
            for (layer, kind), mask in realized_masks(model).items():
                per_kind[kind].setdefault(layer, []).append(mask.reshape(-1, mask.shape[-1]).bool().cpu().numpy())
    return {kind: np.stack([np.concatenate(layers[i]) for i in sorted(layers)]) for kind, layers in per_kind.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a WIDE folder with trained routers")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--out", required=True, help=".npz file")
    ap.add_argument("--training", default="", help="how the routers were trained (stored in meta)")
    args = ap.parse_args()
    model = wide_compile.load(args.model).eval()
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.model)
    ids = tok(wikitext2_test_text(), return_tensors="pt").input_ids[0]
    masks = record(model, ids, args.windows, args.seq_len)
    meta = dict(model=args.model, training=args.training, text="WikiText-2 test, first windows",
                windows=args.windows, seq_len=args.seq_len, command=shlex.join(["python3", *sys.argv]),
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), torch=torch.__version__,
                skip_rate={kind: float(1 - m.mean()) for kind, m in masks.items()},
                shapes={kind: list(m.shape) for kind, m in masks.items()})
    np.savez_compressed(args.out, meta=np.array(json.dumps(meta)),
                        **{kind: np.packbits(m, axis=-1) for kind, m in masks.items()},
                        **{f"{kind}_groups": np.array(m.shape[-1]) for kind, m in masks.items()})
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
