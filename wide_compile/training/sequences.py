"""Tokenized training / validation sequences and a deterministic, resumable batch order.

``packed``: each source's documents are tokenized, joined with EOS and cut into ``seq_len`` blocks
(remainder dropped). ``document``: one document per sequence, truncated to ``seq_len`` and right-padded,
with ``attention_mask`` 0 and ``labels`` -100 on the padding.

Each source's documents are shuffled with the seed and a fraction of them is held out for validation
before anything is tokenized; only as many documents are tokenized as the run needs, split evenly
between sources (a source with too little text gives what it has; the batch order repeats in new
shuffles, one per epoch).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice

import torch
from torch import Tensor

from .data_sources import DataSource

TOKENIZE_CHUNK = 32  # documents per tokenizer call


@dataclass
class SequenceSet:
    """Fixed-length token sequences ``[N, seq_len]`` (+ attention mask in document mode)."""

    input_ids: Tensor
    attention_mask: Tensor | None = None
    per_source: dict[str, int] = field(default_factory=dict)  # sequences contributed by each source

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum()) if self.attention_mask is not None else self.input_ids.numel()

    def batch(self, indices: Tensor) -> dict[str, Tensor]:
        """Model inputs for rows ``indices``: ``input_ids``, ``labels`` (+ ``attention_mask``)."""
        ids = self.input_ids[indices]
        if self.attention_mask is None:
            return {"input_ids": ids, "labels": ids}
        mask = self.attention_mask[indices]
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


class BatchOrder:
    """Which rows make batch number ``k``: a fresh seeded shuffle per epoch; ``position`` = rows consumed."""

    def __init__(self, size: int, batch_size: int, seed: int, position: int = 0):
        if size < 1:
            raise ValueError("no training sequences: the data is too short for one sequence of seq_len tokens")
        self.size, self.batch_size, self.seed, self.position = size, batch_size, seed, position
        self._perms: dict[int, Tensor] = {}

    def _perm(self, epoch: int) -> Tensor:
        if epoch not in self._perms:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms = {epoch: torch.randperm(self.size, generator=gen)}
        return self._perms[epoch]

    def next_indices(self) -> Tensor:
        positions = range(self.position, self.position + self.batch_size)
        rows = [self._perm(i // self.size)[i % self.size] for i in positions]
        self.position += self.batch_size
        return torch.stack(rows)


def split_documents(docs: list[str] | Iterator[str], val_fraction: float, seed: int
                    ) -> tuple[Iterator[str], list[str] | Iterator[str]]:
    """(train documents, validation documents) of one source.

    A list is shuffled with ``seed`` and its first ``val_fraction`` (at least one document when the
    fraction is > 0 and there are two or more) is held out; a lazy hub stream holds out every k-th document.
    """
    if isinstance(docs, list):
        order = torch.randperm(len(docs), generator=torch.Generator().manual_seed(seed)).tolist()
        n_val = max(1, round(val_fraction * len(docs))) if val_fraction > 0 and len(docs) >= 2 else 0
        return (docs[i] for i in order[n_val:]), [docs[i] for i in order[:n_val]]
    if val_fraction <= 0:
        return docs, []
    every = max(2, round(1 / val_fraction))
    val: list[str] = []

    def train_stream() -> Iterator[str]:
        for i, doc in enumerate(docs):
            if i % every == 0:
                val.append(doc)
            else:
                yield doc

    return train_stream(), val  # val fills as the stream is read (enough for a few eval batches)


def _token_lists(tokenizer, docs: Iterable[str]) -> Iterator[list[int]]:
    it = iter(docs)
    while chunk := list(islice(it, TOKENIZE_CHUNK)):
        yield from tokenizer(chunk, add_special_tokens=True, verbose=False)["input_ids"]


def _eos(tokenizer) -> int | None:
    return tokenizer.eos_token_id


def _pad(tokenizer) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


def tokenize_source(docs: Iterable[str], tokenizer, seq_len: int, mode: str, max_sequences: int
                    ) -> tuple[list[list[int]], list[int]]:
    """Up to ``max_sequences`` rows of ``seq_len`` ids (padded in document mode) and their real lengths."""
    rows: list[list[int]] = []
    lengths: list[int] = []
    if max_sequences <= 0:
        return rows, lengths
    if mode == "packed":
        eos, buffer = _eos(tokenizer), []
        for ids in _token_lists(tokenizer, docs):
            buffer.extend(ids)
            if eos is not None and (not ids or ids[-1] != eos):
                buffer.append(eos)
            while len(buffer) >= seq_len and len(rows) < max_sequences:
                rows.append(buffer[:seq_len])
                lengths.append(seq_len)
                buffer = buffer[seq_len:]
            if len(rows) >= max_sequences:
                break
        return rows, lengths
    pad = _pad(tokenizer)
    for ids in _token_lists(tokenizer, docs):
        ids = ids[:seq_len]
        if len(ids) < 2:
            continue  # nothing to predict
        rows.append(ids + [pad] * (seq_len - len(ids)))
        lengths.append(len(ids))
        if len(rows) >= max_sequences:
            break
    return rows, lengths


def _sequence_set(parts: list[tuple[str, list[list[int]], list[int]]], seq_len: int, mode: str) -> SequenceSet:
    rows = [row for _, r, _ in parts for row in r]
    if not rows:
        return SequenceSet(torch.empty(0, seq_len, dtype=torch.long), None if mode == "packed" else
                           torch.empty(0, seq_len, dtype=torch.long))
    ids = torch.tensor(rows, dtype=torch.long)
    mask = None
    if mode == "document":
        lengths = torch.tensor([n for _, _, ls in parts for n in ls])
        mask = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()
    return SequenceSet(ids, mask, {name: len(r) for name, r, _ in parts})


def build_sequences(sources: list[DataSource], tokenizer, *, seq_len: int, mode: str, train_sequences: int,
                    val_sequences: int, val_fraction: float, seed: int) -> tuple[SequenceSet, SequenceSet]:
    """Train and validation sequences mixed evenly from ``sources`` (deterministic given ``seed``)."""
    n = len(sources)
    train_quota, val_quota = math.ceil(train_sequences / n), math.ceil(val_sequences / n)
    train_parts, val_parts = [], []
    for index, source in enumerate(sources):
        train_docs, val_docs = split_documents(source.documents(), val_fraction, seed + index)
        train_parts.append((source.name, *tokenize_source(train_docs, tokenizer, seq_len, mode, train_quota)))
        val_parts.append((source.name, *tokenize_source(val_docs, tokenizer, seq_len, mode, val_quota)))
    train = _sequence_set(train_parts, seq_len, mode)
    if len(train) == 0:
        raise ValueError(
            f"the training data gives no sequence of {seq_len} tokens ({', '.join(s.name for s in sources)}); "
            "use more text, a smaller seq_len or data_mode='document'"
        )
    return train, _sequence_set(val_parts, seq_len, mode)
