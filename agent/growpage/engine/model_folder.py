"""Checks that a folder holds a loadable Hugging Face Llama-family model, without loading it.

Only metadata is read (``config.json``, safetensors headers, tokenizer JSON), so a check costs
milliseconds and imports neither torch nor transformers: ``gpctl model prepare`` can answer "already
prepared" quickly, and the engine can fail with a one-line fix before it spends seconds loading.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from growpage.errors import GrowPageError

# Architectures whose checkpoints LlamaModel reads as they are: the same tensor names, RMSNorm,
# RoPE, GQA and SwiGLU. Mistral differs only by an optional sliding window, refused below.
SUPPORTED_MODEL_TYPES = ("llama", "mistral")

_SAFETENSORS_HEADER_LENGTH_BYTES = 8  # little-endian u64 that precedes the JSON header
_MAX_SAFETENSORS_HEADER_BYTES = 100 * 1024 * 1024  # the format's own limit; more means a corrupt file
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


def weight_files(folder: Path) -> list[Path]:
    """The folder's weight files: every ``*.safetensors``, else every ``pytorch_model*.bin``."""
    safetensors = sorted(folder.glob("*.safetensors"))
    return safetensors or sorted(folder.glob("pytorch_model*.bin"))


def read_config(folder: Path) -> dict:
    """``config.json`` as a dict; raises :class:`GrowPageError` if it is missing or not JSON."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GrowPageError(f"{folder} has no config.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise GrowPageError(f"{path} is not readable JSON ({error})") from None
    if not isinstance(config, dict):
        raise GrowPageError(f"{path} is not a JSON object")
    return config


def find_problem(folder: Path, require_chat_template: bool = False) -> str | None:
    """Why ``folder`` is not a usable Llama-family model folder, or None when it is.

    Args:
        folder: a local Hugging Face model folder.
        require_chat_template: also require a chat template (the prepared cache always has one).

    Returns:
        A short reason ("config.json: model_type 'gpt2' is not Llama-family"), or None.
    """
    if not folder.is_dir():
        return "not a folder" if folder.exists() else "does not exist"
    try:
        config = read_config(folder)
    except GrowPageError as error:
        return str(error)
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        return (f"config.json: model_type {model_type!r} is not Llama-family "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    if config.get("sliding_window") is not None and config.get("use_sliding_window", True):
        return "config.json: sliding-window attention is not supported"
    files = weight_files(folder)
    if not files:
        return "no weights (*.safetensors or pytorch_model*.bin)"
    for path in files:
        problem = _safetensors_problem(path) if path.suffix == ".safetensors" else _bin_problem(path)
        if problem is not None:
            return f"{path.name}: {problem}"
    return _tokenizer_problem(folder, require_chat_template)


def require_model_folder(folder: Path, fix: str) -> Path:
    """``folder`` resolved, or :class:`GrowPageError` naming the problem and ``fix``."""
    problem = find_problem(folder)
    if problem is not None:
        raise GrowPageError(f"{folder} is not a usable Llama-family model folder: {problem}. {fix}")
    return folder.resolve()


def _safetensors_problem(path: Path) -> str | None:
    # The header lists every tensor's byte range; a file shorter than the last range was truncated
    # (an interrupted copy or conversion), which loading would otherwise report deep inside torch.
    try:
        size_bytes = path.stat().st_size
        with path.open("rb") as file:
            prefix = file.read(_SAFETENSORS_HEADER_LENGTH_BYTES)
            if len(prefix) < _SAFETENSORS_HEADER_LENGTH_BYTES:
                return "truncated (no header)"
            (header_bytes,) = struct.unpack("<Q", prefix)
            if header_bytes > min(_MAX_SAFETENSORS_HEADER_BYTES, size_bytes):
                return "corrupt header length"
            header = json.loads(file.read(header_bytes))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"unreadable header ({error})"
    tensors = {name: info for name, info in header.items() if name != "__metadata__"}
    if not tensors:
        return "holds no tensors"
    try:
        data_bytes = max(int(info["data_offsets"][1]) for info in tensors.values())
    except (TypeError, KeyError, IndexError, ValueError):
        return "corrupt header (no data_offsets)"
    expected_bytes = _SAFETENSORS_HEADER_LENGTH_BYTES + header_bytes + data_bytes
    if size_bytes != expected_bytes:
        return f"truncated or padded: {size_bytes:,} bytes, header describes {expected_bytes:,}"
    return None


def _bin_problem(path: Path) -> str | None:
    # A pickle can't be checked without loading it; an empty file is the common failure.
    return "empty file" if path.stat().st_size == 0 else None


def _tokenizer_problem(folder: Path, require_chat_template: bool) -> str | None:
    present = [name for name in _TOKENIZER_FILES if (folder / name).is_file()]
    if not present:
        return f"no tokenizer ({' or '.join(_TOKENIZER_FILES)})"
    if present[0] == "tokenizer.json":
        try:
            json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            return f"tokenizer.json is not readable JSON ({error})"
    if require_chat_template and not _has_chat_template(folder):
        return "no chat template (chat_template.jinja or tokenizer_config.json)"
    return None


def _has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file():
        return True
    try:
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return bool(isinstance(tokenizer_config, dict) and tokenizer_config.get("chat_template"))
