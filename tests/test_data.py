"""wide_compile.data: data folder resolution and the WikiText-2 text convention."""

from __future__ import annotations

from pathlib import Path

import pytest

from wide_compile import data
from wide_compile.data import DataNotFoundError, WIKITEXT2_TEST_FILE, data_dir, wikitext2_test_text

ROWS = ["", " = Heading = \n", "", " First paragraph . \n", " Second one . \n", ""]  # HF row layout


def write_crlf_copy(folder: Path) -> Path:
    """The local file layout: rows joined with no separator, stored with CRLF line ends."""
    path = folder / WIKITEXT2_TEST_FILE
    path.parent.mkdir(parents=True)
    path.write_bytes("".join(ROWS).replace("\n", "\r\n").encode("utf-8"))
    return folder


def test_data_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("WIDE_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path


def test_data_dir_default_is_shared_data_next_to_repo(monkeypatch):
    monkeypatch.delenv("WIDE_DATA_DIR", raising=False)
    expected = Path(data.__file__).resolve().parents[1].parent / "shared" / "data"
    assert data_dir() == (expected if expected.is_dir() else None)


def test_local_file_reads_as_hf_rows_joined_with_no_separator(tmp_path):
    text = wikitext2_test_text(write_crlf_copy(tmp_path), allow_download=False)
    assert text == "".join(ROWS)
    assert "\r" not in text


def test_env_folder_is_used(monkeypatch, tmp_path):
    monkeypatch.setenv("WIDE_DATA_DIR", str(write_crlf_copy(tmp_path)))
    assert wikitext2_test_text(allow_download=False) == "".join(ROWS)


def test_missing_data_is_a_clear_error(tmp_path):
    with pytest.raises(DataNotFoundError, match="wiki.test.raw.*missing.*WIDE_DATA_DIR"):
        wikitext2_test_text(tmp_path, allow_download=False)


def test_missing_data_and_unreachable_hub_is_a_clear_error(monkeypatch, tmp_path):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'wikitext' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataNotFoundError, match="ConnectionError: Couldn't reach"):
        wikitext2_test_text(tmp_path)


def test_hub_fallback_joins_rows_with_no_separator(monkeypatch, tmp_path):
    import datasets

    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return {"text": ROWS}

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert wikitext2_test_text(tmp_path) == "".join(ROWS)
    assert calls == [(("wikitext", "wikitext-2-raw-v1"), {"split": "test"})]


@pytest.mark.skipif(data_dir() is None or not (data_dir() / WIKITEXT2_TEST_FILE).is_file(),
                    reason="no local WikiText-2 copy (set WIDE_DATA_DIR)")
def test_real_local_wikitext2_test_split():
    text = wikitext2_test_text(allow_download=False)
    assert text.startswith(" = Robert Boulter = \n Robert Boulter is an English film")
    assert "\r" not in text
    assert text.count("\n") == 2891  # one per non-empty HF row
    assert len(text.encode("utf-8")) == 1290547 - 2891  # file size minus the dropped CR bytes
