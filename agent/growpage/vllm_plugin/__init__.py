"""GrowPage inside vLLM v1: a ``vllm.general_plugins`` entry point (and an endpoint plugin).

vLLM calls :func:`register` once in every process it starts (front-end, EngineCore, each worker; on
CPU each is spawned and re-imports). ``register`` only checks the vLLM version, overrides the
attention backends GrowPage observes (``CPU_ATTN``; on CUDA ``FLASH_ATTN``, ``FLASHINFER``, ``TRITON_ATTN``)
with subclasses from :mod:`~growpage.vllm_plugin.backend`, wraps the model runner, and wraps the scheduler's methods (inert unless a scheduler's deployment runs ``mode=enforce``);
everything per process (the observer, the runner hook, the metrics exporter) starts lazily on first
use in the worker that runs attention, keyed by pid, so a forked child never shares a parent's port
or thread. Modules, one way::

    versions.py   supported vLLM releases; the start-up check
    settings.py   GrowPageConfig + plugin settings from additional_config["growpage"] / GROWPAGE_*
    keys.py       any backend's paged KV layout, probed; reading keys and moving tokens on the device
    observer.py   per-worker Stage 1 monitor: summaries, boundary decisions, stats source
    backend.py    CPU_ATTN / FLASH_ATTN / FLASHINFER / TRITON_ATTN subclasses feeding the observer
    support.py    what a deployment needs to observe and enforce (cudagraph mode, parallelism), as reasons
    runner_hooks.py  wraps the model runner: request lifecycle, batch row -> req id, Stage 2 inputs
    compaction.py    Stage 2 arithmetic without vLLM: physical/logical lengths, keep sets, moving K/V
    enforcer.py      Stage 2 in the scheduler: boundary decisions, freeing blocks, compaction plans
    scheduler_hooks.py  wraps Scheduler/KVCacheManager methods for the enforcer (mode=enforce only)
    compactor.py     Stage 2 in the worker: applies plans, physical seq_lens and slot_mapping
    endpoint.py   vllm.endpoint_plugins: /metrics/growpage on the API server, ahead of /metrics
    namespaces.py ASGI middleware: x-growpage-namespace header / OpenAI user -> vllm_xargs
    metrics.py    growpage_vllm_decisions_degraded_total (decided vs enforced)
    serve.py      starting the OpenAI server on CPU with the plugin (for ``gpctl serve --engine vllm``)

See ``docs/VLLM_PLUGIN.md``.
"""

from __future__ import annotations

import logging
import os

from growpage.vllm_plugin.versions import SUPPORTED_VLLM_SPEC, check_vllm_version

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format

__all__ = ["SUPPORTED_VLLM_SPEC", "check_vllm_version", "register", "registered_pids"]

# pid -> number of register() calls seen in that process (idempotence is per process).
_REGISTERED: dict[int, int] = {}


def registered_pids() -> dict[int, int]:
    """Processes of this interpreter lineage that ran :func:`register` (for tests and diagnostics)."""
    return dict(_REGISTERED)


def register() -> None:
    """The ``vllm.general_plugins`` entry point. Idempotent per process.

    Raises:
        RuntimeError: the installed vLLM is not a supported release (set ``GROWPAGE_MODE=off`` or
            leave ``growpage`` out of ``VLLM_PLUGINS`` to start vLLM without GrowPage).
    """
    pid = os.getpid()
    first = pid not in _REGISTERED
    _REGISTERED[pid] = _REGISTERED.get(pid, 0) + 1
    if not first:
        return
    if os.environ.get("GROWPAGE_MODE", "").strip().lower() == "off":
        logger.info("growpage: GROWPAGE_MODE=off, the vLLM plugin stays inactive in pid %d", pid)
        return
    check_vllm_version()
    _install_backend()
    from growpage.vllm_plugin.scheduler_hooks import install_scheduler_hooks

    install_scheduler_hooks()  # inert unless the scheduler's deployment runs mode=enforce
    _mark_loaded(pid)


def _mark_loaded(pid: int) -> None:
    """Append ``pid`` to ``$GROWPAGE_VLLM_LOAD_LOG`` when set (tests count loads per process)."""
    path = os.environ.get("GROWPAGE_VLLM_LOAD_LOG")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"{pid}\n")
    except OSError:
        logger.warning("growpage: cannot write the load log %s", path)


def _install_backend() -> None:
    """Point vLLM's backends GrowPage observes at its subclasses (same names, same kernels).

    CPU: ``CPU_ATTN``. CUDA: ``FLASH_ATTN``, ``FLASHINFER``, ``TRITON_ATTN`` (whichever vLLM selects).
    Elsewhere, or when vLLM selects another backend, the worker's runner hook reports the observer
    inactive with ``reason="unsupported_backend"`` instead of running silently unobserved.
    """
    from vllm.platforms import current_platform

    from growpage.vllm_plugin.backend import CUDA_BACKENDS, class_path
    from growpage.vllm_plugin.runner_hooks import install_runner_hooks

    if current_platform.is_cpu():
        names: tuple[str, ...] = ("CPU_ATTN",)
    elif current_platform.is_cuda():
        names = CUDA_BACKENDS
    else:
        names = ()
        logger.warning("growpage: no observed attention backend for %s; the agent reports itself inactive "
                       "(reason unsupported_backend) and vLLM runs unchanged", current_platform.device_name)
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    for name in names:
        register_backend(AttentionBackendEnum[name], class_path(name))
    install_runner_hooks()  # also in workers whose backend is not observed: they say so
