"""Where evaluation data comes from: a local data folder first, the HuggingFace ``datasets`` hub second.

The local folder is ``$WIDE_DATA_DIR`` when set, else ``<repo>/../shared/data`` when that exists (the
project's shared data checkout).  Nothing is downloaded into the repository.

WikiText-2 convention
---------------------
:func:`wikitext2_test_text` returns the HF ``wikitext-2-raw-v1`` **test** split with its rows joined by
the empty string, ``"".join(rows)``.  Every non-empty row already ends in ``"\\n"`` and the blank rows are
``""``, so this is the raw article text with one line per paragraph/heading.  The local copy
``wikitext-2-raw/wiki.test.raw`` is exactly that text, stored with CRLF line ends; it is read with
universal newlines so both sources give the same string.

Other conventions exist and give slightly different perplexities: GPTQ / SparseGPT / Wanda and the HF
perplexity guide tokenize ``"\\n\\n".join(rows)`` (extra blank lines, which the local file cannot
reproduce because it has no blank rows), and lm-eval's ``wikitext`` task reports *word* perplexity on
document-level rolling windows.  Numbers from this module compare with the project's other numbers, which
all use ``"".join(rows)``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DataNotFoundError", "data_dir", "wikitext2_test_text", "WIKITEXT2_TEST_FILE"]

#: Path of the WikiText-2 raw test split inside :func:`data_dir`.
WIKITEXT2_TEST_FILE = Path("wikitext-2-raw") / "wiki.test.raw"


class DataNotFoundError(FileNotFoundError):
    """Neither the local data folder nor the ``datasets`` hub could provide the requested data."""


def data_dir() -> Path | None:
    """The local data folder: ``$WIDE_DATA_DIR`` if set, else ``<repo>/../shared/data`` if it exists, else None."""
    env = os.environ.get("WIDE_DATA_DIR")
    if env:
        return Path(env).expanduser()
    default = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    return default if default.is_dir() else None


def wikitext2_test_text(local_dir: str | os.PathLike | None = None, allow_download: bool = True) -> str:
    """WikiText-2 raw test split as one string, ``"".join(rows)`` (see the module docstring).

    Args:
        local_dir: data folder to read ``wikitext-2-raw/wiki.test.raw`` from; defaults to :func:`data_dir`.
        allow_download: when the local file is missing, try ``datasets.load_dataset("wikitext",
            "wikitext-2-raw-v1", split="test")``.

    Raises:
        DataNotFoundError: no local file and the ``datasets`` hub is unreachable (or not allowed).
    """
    folder = Path(local_dir).expanduser() if local_dir is not None else data_dir()
    tried: list[str] = []
    if folder is not None:
        path = folder / WIKITEXT2_TEST_FILE
        if path.is_file():
            # Universal newlines turn the file's CRLF line ends into "\n", matching the HF rows.
            return path.read_text(encoding="utf-8")
        tried.append(f"local file {path} (missing)")
    else:
        tried.append("local data folder (none: WIDE_DATA_DIR unset and <repo>/../shared/data absent)")
    if allow_download:
        try:
            from datasets import load_dataset

            rows = load_dataset("wikitext", "wikitext-2-raw-v1", split="test")["text"]
            return "".join(rows)
        except Exception as exc:  # offline hub, missing package, ...
            tried.append(f'datasets.load_dataset("wikitext", "wikitext-2-raw-v1", split="test") '
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
    else:
        tried.append("download (disabled: allow_download=False)")
    raise DataNotFoundError(
        "WikiText-2 test text not available; tried: " + "; ".join(tried)
        + ". Set WIDE_DATA_DIR to a folder containing wikitext-2-raw/wiki.test.raw."
    )
