"""The engine core's exporter from process start, before vLLM loads the model.

vLLM builds its ``Scheduler`` (and with it GrowPage's scheduler agent, which owns the series) only
after the executor has loaded the model, profiled the KV cache and, on CUDA, captured graphs:
minutes for a large model, during which a scrape would find nothing. ``EngineCore.__init__`` loads
the plugins and then constructs the executor first of all, so the wrapped ``Executor.__init__``
(:func:`start_early`, installed with the scheduler hooks) binds the process's exporter there and
serves ``growpage_build_info`` and ``growpage_agent_active`` with reason ``starting`` (or a reason
already final: ``mode_off``, ``invalid_config``) from one registry. When the scheduler agent starts
it takes that registry and exporter over (:func:`take_over`): the port is bound once per process,
and a scrape never sees it closed between the two.

A bind failure here is not logged: the agent tries the port again when it starts, and counts and
logs a failure there (``growpage_agent_errors_total{component="plugin"}``). Nothing here raises.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any, cast

from growpage.config import GrowPageConfig, Mode
from growpage.vllm_plugin.metrics import StartupCollector
from growpage.vllm_plugin.resolve import ResolvedSettings, settings_from_vllm_config
from growpage.vllm_plugin.support import ACTIVE, start_up_states
from growpage.vllm_plugin.versions import check_vllm_version

if TYPE_CHECKING:  # for annotations only: each is imported where it is used (the exporter only when enabled)
    from prometheus_client.registry import CollectorRegistry

    from growpage.telemetry.exporter import MetricsExporter
    from growpage.vllm_plugin.vllm_types import VllmConfig

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format

STARTING = "starting"


@dataclasses.dataclass
class EarlyExporter:
    """One process's exporter started before its scheduler agent.

    Attributes:
        registry: what the exporter serves (the start-up collector, then the agent's collectors).
        collector: the start-up collector, unregistered when the agent takes over.
        exporter: the running exporter (``growpage.telemetry.exporter.MetricsExporter``).
        port: the port it was asked for (:func:`rank_exporter_port`).
        host: the address it was asked for.
    """

    registry: CollectorRegistry
    collector: StartupCollector
    exporter: MetricsExporter
    port: int
    host: str


# pid -> this process's early exporter (per pid: a forked child must not serve its parent's)
_EARLY: dict[int, EarlyExporter] = {}


def starting_states(resolved: ResolvedSettings, compilation_config: object) -> dict[str, str]:
    """``{component: reason}`` before the scheduler exists: the reasons already final from the settings
    and the graph mode (``mode_off``, ``invalid_config``, ``full_cudagraph``), ``starting`` for every
    component that will run (the enforcer's blockers are known only once the KV cache is)."""
    states = start_up_states(resolved.config.mode is Mode.OFF, compilation_config,
                             invalid_config=resolved.problem is not None,
                             enforce_requested=resolved.requested_mode == Mode.ENFORCE.value)
    if resolved.config.mode is Mode.ENFORCE:
        states["enforcer"] = ACTIVE
    return {component: STARTING if state == ACTIVE else state for component, state in states.items()}


def start_early(vllm_config: VllmConfig) -> EarlyExporter | None:
    """Serve the start-up series on this engine core's exporter port (once per process); None when
    the exporter is disabled, or its port cannot be bound now (the agent tries again)."""
    pid = os.getpid()
    if pid in _EARLY:
        return _EARLY[pid]
    try:
        early = _start(vllm_config)
    except Exception:  # vLLM must start whatever happens here; the agent retries the port
        logger.debug("growpage: the start-up exporter did not start in pid %d", pid, exc_info=True)
        return None
    if early is not None:
        _EARLY[pid] = early
    return early


def _start(vllm_config: VllmConfig) -> EarlyExporter | None:
    # deferred: prometheus_client and growpage.telemetry (OpenTelemetry) load when the exporter starts
    from prometheus_client.registry import CollectorRegistry

    from growpage.telemetry.agent import build_info_labels
    from growpage.telemetry.exporter import start_exporter

    resolved = settings_from_vllm_config(vllm_config)
    settings = resolved.settings
    if not settings.exporter_enabled:
        return None
    port = rank_exporter_port(settings.exporter_port, getattr(vllm_config, "parallel_config", None))
    deployment = _Deployment(resolved.config, deployment_device(vllm_config))
    # NOTE: build_info_labels reads only .config and .device_name of its source
    labels = build_info_labels(cast(Any, deployment), "vllm", check_vllm_version())
    states = starting_states(resolved, getattr(vllm_config, "compilation_config", None))
    registry = CollectorRegistry()
    collector = StartupCollector(labels, served_model(vllm_config), states)
    registry.register(collector)
    exporter = start_exporter(registry, port, settings.exporter_host)
    logger.info("growpage: /metrics/growpage served from start-up at %s (pid %d)", exporter.url, os.getpid())
    return EarlyExporter(registry, collector, exporter, port, settings.exporter_host)


def rank_exporter_port(port: int, parallel_config: object) -> int:
    """The exporter port of this engine core: ``port`` plus its local data-parallel rank.

    With data parallelism every rank runs its own engine core, each with its own scheduler agent
    and exporter; on one host they would all bind ``port``. Rank ``r`` (local to its host) binds
    ``port + r`` instead. 0 (a free port) and -1 (disabled) stay as they are.

    NOTE: the rank is ``data_parallel_rank_local`` alone, whatever ``data_parallel_size`` says:
    vLLM runs a dense model's ranks as independent engines and sets each engine core's
    ``data_parallel_size`` to 1 (``ParallelConfig.reconfigure_for_independent_dp_rank``), keeping
    the local rank; without data parallelism the local rank is 0 or None.
    """
    if port <= 0:
        return port
    return port + int(getattr(parallel_config, "data_parallel_rank_local", 0) or 0)


@dataclasses.dataclass(frozen=True)
class _Deployment:
    config: GrowPageConfig
    device_name: str


def served_model(vllm_config: VllmConfig) -> str:
    """The ``model_name`` label: vLLM's served model name, else its model."""
    model_config = vllm_config.model_config
    return str(model_config.served_model_name or model_config.model)


def deployment_device(vllm_config: object) -> str:
    """The device KV lives on (``growpage_build_info{device}``)."""
    return str(getattr(getattr(vllm_config, "device_config", None), "device_type", "") or "unknown")


def take_over(port: int, host: str) -> EarlyExporter | None:
    """This process's early exporter, its start-up collector unregistered, for the scheduler agent to
    serve its own collectors on (None when there is none for ``port`` and ``host``: the agent binds
    its own). Each early exporter is taken over once."""
    early = _EARLY.get(os.getpid())
    if early is None or (early.port, early.host) != (port, host):
        return None
    del _EARLY[os.getpid()]
    try:
        early.registry.unregister(early.collector)
    except KeyError:  # never registered: nothing to remove
        pass
    return early


def close_early() -> None:
    """Stop this process's early exporter when no agent will take it over (its agent failed to
    start): a pod must not say ``starting`` for ever; without an exporter GrowPageAgentDown says
    what is true, that vLLM serves and GrowPage does not."""
    early = _EARLY.pop(os.getpid(), None)
    if early is not None:
        try:
            early.exporter.close()
        except Exception:  # called where vLLM builds its scheduler: never raise there
            logger.debug("growpage: closing the start-up exporter failed", exc_info=True)
