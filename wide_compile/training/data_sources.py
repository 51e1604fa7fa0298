"""Where training text comes from: local jsonl / json / parquet / text files, or hub dataset names.

Every source is checked *before* any compute (:func:`resolve_sources`): a missing path, an empty file or
a record without a ``"text"`` field raises a clear error. Documents are then read with ``datasets``.

Default (``data=None``): every ``$WIDE_DATA_DIR/calibration/*.jsonl`` file plus
``$WIDE_DATA_DIR/c4/c4_train00000_first1000.jsonl``, each one source of the mix.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from wide_compile.data import DataNotFoundError, data_dir

LOCAL_KINDS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text", ".text": "text",
               ".raw": "text"}
DEFAULT_C4_FILE = Path("c4") / "c4_train00000_first1000.jsonl"
DEFAULT_CALIBRATION_GLOB = "calibration/*.jsonl"


@dataclass(frozen=True)
class DataSource:
    """One source of the mix: a local file (``kind`` json / parquet / text) or a hub dataset (``kind`` hub)."""

    name: str
    kind: str
    location: str  # file path, or hub dataset name
    hub_config: str | None = None

    def documents(self) -> list[str] | Iterator[str]:
        """The source's non-empty texts: a list for local files, a lazy iterator for hub datasets."""
        from datasets import load_dataset

        if self.kind == "hub":
            stream = load_dataset(self.location, self.hub_config, split="train", streaming=True)
            return (row["text"] for row in stream if isinstance(row.get("text"), str) and row["text"].strip())
        dataset = load_dataset(self.kind, data_files=self.location, split="train")
        if "text" not in dataset.column_names:
            raise ValueError(f"{self.location} has no 'text' field (columns: {dataset.column_names})")
        texts = [t for t in dataset["text"] if isinstance(t, str) and t.strip()]
        if not texts:
            raise ValueError(f"{self.location} has no non-empty 'text' values")
        return texts


def default_sources() -> list[str]:
    """The project's calibration mix inside :func:`wide_compile.data.data_dir`."""
    root = data_dir()
    if root is None or not root.is_dir():
        raise DataNotFoundError(
            "no training data given and no local data folder: pass data=[files or hub names] or set WIDE_DATA_DIR "
            f"to a folder holding {DEFAULT_CALIBRATION_GLOB} and {DEFAULT_C4_FILE}"
        )
    files = sorted(glob.glob(str(root / DEFAULT_CALIBRATION_GLOB)))
    if (root / DEFAULT_C4_FILE).is_file():
        files.append(str(root / DEFAULT_C4_FILE))
    if not files:
        raise DataNotFoundError(f"no {DEFAULT_CALIBRATION_GLOB} or {DEFAULT_C4_FILE} under data folder {root}")
    return files


def _looks_local(spec: str) -> bool:
    return (any(ch in spec for ch in "*?[") or spec.startswith(("/", ".", "~"))
            or Path(spec).suffix.lower() in LOCAL_KINDS)


def _expand(spec: str) -> list[Path]:
    path = Path(spec).expanduser()
    if any(ch in spec for ch in "*?["):
        return [Path(p) for p in sorted(glob.glob(str(path)))]
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in LOCAL_KINDS)
    return [path] if path.exists() else []


def _check_local_file(path: Path) -> str:
    """The ``datasets`` builder for ``path``; raises if it is empty or its records lack a ``text`` field."""
    kind = LOCAL_KINDS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(f"data file {path} has an unsupported type; use one of {sorted(LOCAL_KINDS)}")
    if path.stat().st_size == 0:
        raise ValueError(f"data file {path} is empty")
    if kind == "parquet":
        import pyarrow.parquet as pq

        names = pq.read_schema(path).names
        if "text" not in names:
            raise ValueError(f"data file {path} has no 'text' column (columns: {names})")
    elif kind == "json":
        _check_json_record(path)
    elif not path.read_text(encoding="utf-8", errors="replace").strip():
        raise ValueError(f"data file {path} holds only whitespace")
    return kind


def _check_json_record(path: Path) -> None:
    with path.open(encoding="utf-8") as handle:
        first = next((line for line in handle if line.strip()), None)
    if first is None:
        raise ValueError(f"data file {path} holds only whitespace")
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        record = None  # a pretty-printed .json file: datasets checks its columns when reading
        if path.suffix.lower() == ".jsonl":
            raise ValueError(f"data file {path}: first line is not valid JSON") from None
    if record is not None and not (isinstance(record, dict) and isinstance(record.get("text"), str)):
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"data file {path}: records need a string 'text' field, the first one has {keys}")


def resolve_sources(data: list[str] | str | None) -> list[DataSource]:
    """Check every data spec and return one :class:`DataSource` per file / hub dataset (no compute)."""
    specs = default_sources() if data is None else ([data] if isinstance(data, (str, Path)) else list(data))
    if not specs:
        raise ValueError("data is an empty list: give at least one file, folder, glob or hub dataset name")
    sources: list[DataSource] = []
    for spec in map(str, specs):
        if not Path(spec).expanduser().exists() and not _looks_local(spec):
            name, _, config = spec.partition(":")
            sources.append(DataSource(spec, "hub", name, config or None))
            continue
        files = _expand(spec)
        if not files:
            raise FileNotFoundError(f"training data {spec!r} does not exist (or matches no supported file)")
        for file in files:
            sources.append(DataSource(file.name, _check_local_file(file), str(file)))
    return sources
