"""GrowPage inside vLLM v1: a ``vllm.general_plugins`` entry point (and an endpoint plugin).

vLLM calls :func:`register` once in every process it starts (front-end, EngineCore, each worker; on
CPU each is spawned and re-imports). ``register`` checks the vLLM version and wraps the scheduler
in every mode, ``off`` included (the scheduler agent and its exporter start with the scheduler, so a
pod switched off still says so); unless ``GROWPAGE_MODE=off``, it also overrides the attention
backends GrowPage observes (``CPU_ATTN``; on CUDA ``FLASH_ATTN``, ``FLASHINFER``, ``TRITON_ATTN``)
with subclasses from :mod:`~growpage.vllm_plugin.backend` and wraps the worker. To run vLLM with no
GrowPage code at all, leave ``growpage`` out of ``VLLM_PLUGINS``.
Per-process state (the observer) starts lazily, keyed by pid. Modules, one way (scheduler side and
worker side share only ``wire``)::

    versions.py      supported vLLM releases; the start-up check
    settings.py      GrowPageConfig + plugin settings from additional_config["growpage"] / GROWPAGE_*
    resolve.py       the settings as vLLM's processes read them: never raising (invalid_config)
    support.py       what a deployment needs to observe and enforce (graph mode, runner, parallelism)
    wire.py          what crosses between scheduler and workers (payloads, reports, attribute names)
    own_time.py      what GrowPage costs vLLM: its own seconds against the vLLM calls it hooks, per side
    -- scheduler side (EngineCore) --
    startup.py          the exporter from process start (before the model loads), handed to the agent
    scheduler_agent.py  lifecycle, grants, monitored boundaries, pool gauges, telemetry from start-up
    scheduler_requests.py  the one owner of requests (admission, preemption, end) and enforce over it:
                        boundary decisions, freeing blocks, compaction plans
    scheduler_hooks.py  wraps Scheduler/KVCacheManager methods for the agent
    trace_join.py       GrowPage's spans as children of vLLM's llm_request span (both sides derive its id)
    metrics.py          series only the vLLM home has (degraded decisions, observed steps, own time)
    -- worker side --
    keys.py          any backend's paged KV layout, probed; reading keys, moving tokens in capped chunks
    scoring.py       the observed queries against the cached keys, in bounded chunks
    observer.py      per-worker attention observation and summaries; the step's batch (V1 or V2
                     runner); the worker's report
    compaction.py    a compaction without vLLM: token scores, keep sets, physical/logical lengths
    compactor.py     enforce in the worker: applies plans, physical seq_lens and slot_mapping
    worker_hooks.py  the observer registry; wraps the worker and the runners
    backend.py       CPU_ATTN / FLASH_ATTN / FLASHINFER / TRITON_ATTN subclasses feeding the observer
    -- API server --
    endpoint.py      vllm.endpoint_plugins: /metrics/growpage on the API server, ahead of /metrics
    namespaces.py    ASGI middleware: x-growpage-namespace header / OpenAI user -> vllm_xargs
    serve.py         starting the OpenAI server with the plugin (for ``gpctl serve --engine vllm``)

See ``docs/VLLM_PLUGIN.md``.
"""

from __future__ import annotations

import logging
import os

from growpage.vllm_plugin.versions import SUPPORTED_VLLM_SPEC, check_vllm_version
from growpage.vllm_plugin.wire import append_log_line

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
        RuntimeError: the installed vLLM is not a supported release (leave ``growpage`` out of
            ``VLLM_PLUGINS`` to start vLLM without GrowPage; with ``GROWPAGE_MODE=off`` the plugin
            stays inactive on an unsupported vLLM instead of failing).
    """
    pid = os.getpid()
    first = pid not in _REGISTERED
    _REGISTERED[pid] = _REGISTERED.get(pid, 0) + 1
    if not first:
        return
    mode_off = os.environ.get("GROWPAGE_MODE", "").strip().lower() == "off"
    try:
        check_vllm_version()
    except RuntimeError:
        if not mode_off:
            raise
        logger.warning("growpage: this vLLM is not one GrowPage supports and GROWPAGE_MODE=off: the plugin "
                       "stays inactive in pid %d (no /metrics/growpage)", pid)
        return
    # deferred: vLLM loads this entry point in every process; the hooks (and torch) load when it registers
    from growpage.vllm_plugin.scheduler_hooks import install_scheduler_hooks

    install_scheduler_hooks()  # the scheduler agent: metrics from start-up, in every mode
    if mode_off:  # mode off keeps the exporter (the pod says what it runs); attention is not wrapped
        logger.info("growpage: GROWPAGE_MODE=off: attention is not observed in pid %d", pid)
    else:
        _install_backend()
        try:  # the front-end's llm_request span gets the id GrowPage's spans name as their parent
            # deferred: like the hooks above, loaded when the plugin registers
            from growpage.vllm_plugin.trace_join import install_front_end_hook

            install_front_end_hook()
        except Exception:
            logger.warning("growpage: cannot join vLLM's request spans; GrowPage's spans stay roots", exc_info=True)
    _mark_loaded(pid)


def _mark_loaded(pid: int) -> None:
    """Append ``pid`` to ``$GROWPAGE_VLLM_LOAD_LOG`` when set (tests count loads per process)."""
    append_log_line(os.environ.get("GROWPAGE_VLLM_LOAD_LOG"), str(pid))


def _install_backend() -> None:
    """Point vLLM's backends GrowPage observes at its subclasses (same names, same kernels).

    CPU: ``CPU_ATTN``. CUDA: ``FLASH_ATTN``, ``FLASHINFER``, ``TRITON_ATTN`` (whichever vLLM selects).
    Elsewhere, or when vLLM selects another backend, the worker's runner hook reports the observer
    inactive with ``reason="unsupported_backend"`` instead of running silently unobserved.
    """
    # deferred: vLLM's modules and the backend (torch) load when the plugin registers, not with this entry point
    from vllm.platforms import current_platform

    from growpage.vllm_plugin.backend import CUDA_BACKENDS, class_path
    from growpage.vllm_plugin.worker_hooks import install_worker_hooks

    if current_platform.is_cpu():
        names: tuple[str, ...] = ("CPU_ATTN",)
    elif current_platform.is_cuda():
        names = CUDA_BACKENDS
    else:
        names = ()
        logger.warning("growpage: no observed attention backend for %s; the agent reports itself inactive "
                       "(reason unsupported_backend) and vLLM runs unchanged", current_platform.device_name)
    # deferred: vLLM's registry loads when the plugin registers, not with this entry point
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    for name in names:
        register_backend(AttentionBackendEnum[name], class_path(name))
    install_worker_hooks()  # also in workers whose backend is not observed: they say so
