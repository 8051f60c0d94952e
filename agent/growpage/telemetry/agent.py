"""The telemetry agent: the single consumer of one engine's GrowPage stats.

Threading model. ``GrowPageManager`` is not thread-safe and ``make_stats()`` is get-and-reset, so
only the engine's thread calls into the manager. It hands the agent a snapshot by calling
:meth:`TelemetryAgent.on_step` after every engine step (a clock read; it polls at most every
``poll_interval_s``) and :meth:`TelemetryAgent.poll` when it goes idle. Scrapes, on any HTTP thread,
only read the last polled state, copied under the agent's lock (held for microseconds, never
across a call into the manager). A home whose engine thread holds a lock around every manager call
may pass it as ``engine_lock``: a scrape that finds the state older than ``poll_interval_s`` then
polls itself under that lock (waiting at most ``engine_lock_timeout_s``, else serving what it has),
so the gauges stay fresh while the engine is idle without an idle hook.

Staleness is bounded by ``poll_interval_s`` (gauges). Counters are the core's cumulative totals and
histograms accumulate here, so a slow scraper loses nothing; only a window holding more than the
core's ``MAX_SAMPLES`` samples per histogram drops the excess (logged once: poll more often).
With ``engine_lock``, call ``on_step``/``poll`` while holding it too.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client.registry import CollectorRegistry

from growpage import __version__, catalog
from growpage.core.controller import StatsSource
from growpage.core.faults import FaultGuard
from growpage.telemetry.collector import COLLECTOR_COMPONENT, GrowPageCollector
from growpage.telemetry.exporter import MetricsExporter, start_exporter
from growpage.telemetry.exposition import MetricsResponse, render_metrics
from growpage.telemetry.state import LinkedExemplar, MetricState, MetricView
from growpage.telemetry.tracing import RequestTracer, configure_tracing, tracer_for

logger = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL_S = 1.0


def build_info_labels(source: StatsSource, engine: str, engine_version: str) -> dict[str, str]:
    """``growpage_build_info`` label values, in the catalog's label order."""
    config = source.config
    values = {
        "version": __version__,
        "engine": engine,
        "engine_version": engine_version,
        "mode": config.mode.value,
        "block_size": str(config.block_size),
        "base_pages": str(config.base_pages),
        "device": source.device_name,
    }
    return {label: values[label] for label in catalog.BUILD_INFO.labels}


class TelemetryAgent:
    """Owns one engine's metric state, its Prometheus collector and (optionally) its request tracer.

    Construct it on the engine's thread (it polls once, so the first scrape has gauges). See the
    module docstring for the threading model.

    Args:
        manager: the engine's GrowPage manager; the agent becomes the only caller of ``make_stats``.
        model: the served model, the ``model`` label of every series.
        engine: the home (``reference``, ``vllm``), for ``growpage_build_info``.
        engine_version: the home's version, for ``growpage_build_info``.
        registry: where the collector is registered; a fresh private registry by default, so the
            engine's own metrics (e.g. vLLM's global registry) and ours never collide.
        poll_interval_s: seconds between polls driven by ``on_step`` (and the staleness a scrape
            tolerates before refreshing under ``engine_lock``).
        engine_lock: a lock the engine holds around every manager call, or None.
        engine_lock_timeout_s: how long a scrape waits for ``engine_lock`` before serving the last
            polled state.
        tracer_provider: an OpenTelemetry ``TracerProvider`` to trace requests into, or None (no
            tracing; see :func:`growpage.telemetry.tracing.configure_tracing`).
        parent_context: maps a request id to the OpenTelemetry context its span continues, or None.
        clock: seconds, monotonic; paces polling (injected for tests).
    """

    def __init__(self, manager: StatsSource, *, model: str, engine: str = "reference",
                 engine_version: str = "", registry: CollectorRegistry | None = None,
                 poll_interval_s: float = DEFAULT_POLL_INTERVAL_S, engine_lock: Any = None,
                 engine_lock_timeout_s: float = 0.05, tracer_provider: Any = None,
                 parent_context: Callable[[str], Any] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.manager = manager
        self.model = model
        self.poll_interval_s = poll_interval_s
        self._engine_lock = engine_lock
        self._engine_lock_timeout_s = engine_lock_timeout_s
        self._clock = clock
        self._lock = threading.Lock()  # guards _state; never held across a manager call
        self._poll_lock = threading.Lock()  # one make_stats at a time (engine step vs. scrape refresh)
        self._errors_lock = threading.Lock()
        self._own_errors: collections.Counter[str] = collections.Counter()
        self._faults = FaultGuard(self.count_error, logger, suffix="telemetry carries on; further faults are "
                                                                   "counted in growpage_agent_errors_total, not logged")
        self._state = MetricState(build_info_labels(manager, engine, engine_version))
        self._last_poll_s = -float("inf")
        self._warned_dropped = False
        self._exporter: MetricsExporter | None = None
        self._owns_tracer_provider = False
        self.tracer_provider = tracer_provider
        self.request_tracer: RequestTracer | None = None
        if tracer_provider is not None:
            self._start_tracing(parent_context)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.collector = GrowPageCollector(self, model)
        self.registry.register(self.collector)
        self.poll()

    @classmethod
    def from_env(cls, manager: StatsSource, **kwargs: Any) -> TelemetryAgent:
        """An agent with tracing configured from the ``OTEL_*`` / ``GROWPAGE_TRACING`` variables
        (off unless asked; see ``docs/TELEMETRY.md``). The agent owns that provider and shuts it
        down on ``close``.

        Raises:
            ConfigError: the tracing variables ask for something GrowPage cannot do.
        """
        provider = configure_tracing()
        try:
            agent = cls(manager, tracer_provider=provider, **kwargs)
        except Exception:
            if provider is not None:
                provider.shutdown()
            raise
        agent._owns_tracer_provider = provider is not None
        return agent

    def _start_tracing(self, parent_context: Callable[[str], Any] | None) -> None:
        self.request_tracer = RequestTracer(
            tracer_for(self.tracer_provider), model=self.model, clock=self.manager.clock,
            on_error=self.count_error, on_exemplar=self._offer_exemplar, parent_context=parent_context)
        self.manager.stats.add_listener(self.request_tracer)

    # ---- engine thread ------------------------------------------------------------------------
    def on_step(self) -> None:
        """Call after every engine step: polls when ``poll_interval_s`` has passed (cheap otherwise;
        skipped when a scrape is refreshing under ``engine_lock`` right now)."""
        if self._clock() - self._last_poll_s < self.poll_interval_s:
            return
        if self._poll_lock.acquire(blocking=False):
            try:
                self._poll_locked()
            finally:
                self._poll_lock.release()

    def poll(self) -> None:
        """Drain the manager's stats into the metric state. Engine thread only (or under
        ``engine_lock``): it calls ``make_stats``. Never raises; a fault is counted (collector)."""
        with self._poll_lock:
            self._poll_locked()

    def _poll_locked(self) -> None:
        self._last_poll_s = self._clock()
        try:
            snapshot = self.manager.make_stats()
        except Exception:
            self._fault("make_stats failed; serving the previous state")
            return
        with self._lock:
            try:
                self._state.fold(snapshot, now_s=self._clock())
            except Exception:
                self._fault("folding a stats snapshot failed; its samples are lost")
        if snapshot.samples_dropped and not self._warned_dropped:
            self._warned_dropped = True
            logger.warning("growpage telemetry: %d histogram samples overflowed one stats window; "
                           "call on_step() every step or lower poll_interval_s (now %.3g s)",
                           snapshot.samples_dropped, self.poll_interval_s)

    # ---- any thread -----------------------------------------------------------------------------
    def count_error(self, component: str) -> None:
        """Count a fault telemetry caught (``collector``, ``tracing``) in growpage_agent_errors_total."""
        with self._errors_lock:
            self._own_errors[component] += 1

    def metric_view(self) -> MetricView:
        """A copy of the state for one scrape (MetricSource for the collector)."""
        self._refresh_if_stale()
        with self._lock:
            return self._state.view()

    def agent_errors(self) -> dict[str, int]:
        """Faults by component, the core's and telemetry's (MetricSource for the collector)."""
        with self._errors_lock:
            own = dict(self._own_errors)
        with self._lock:
            return self._state.agent_errors(own)

    def render(self, accept_header: str | None = None) -> MetricsResponse:
        """``/metrics/growpage`` for a host route: body and content type for ``accept_header``."""
        return render_metrics(self.registry, accept_header)

    def serve(self, port: int = 0, host: str = "0.0.0.0") -> MetricsExporter:
        """Start the standalone exporter (``/metrics/growpage`` on ``host:port``); ``close`` stops it.

        Raises:
            OSError: the port is taken.
        """
        if self._exporter is None:
            self._exporter = start_exporter(self.registry, port, host)
        return self._exporter

    def close(self) -> None:
        """Stop serving and tracing: unregister the collector, end open spans, flush the exporter.
        Idempotent."""
        if self._exporter is not None:
            self._exporter.close()
            self._exporter = None
        try:
            self.registry.unregister(self.collector)
        except KeyError:  # already closed
            pass
        request_tracer, self.request_tracer = self.request_tracer, None
        if request_tracer is not None:
            listeners = self.manager.stats.listeners
            if request_tracer in listeners:
                listeners.remove(request_tracer)
            request_tracer.close()
            if self._owns_tracer_provider:
                self.tracer_provider.shutdown()
            else:
                self.tracer_provider.force_flush()

    # ---- internals ----------------------------------------------------------------------------
    def _refresh_if_stale(self) -> None:
        if self._engine_lock is None or self._clock() - self._last_poll_s < self.poll_interval_s:
            return
        if self._engine_lock.acquire(timeout=self._engine_lock_timeout_s):
            try:
                self.poll()
            finally:
                self._engine_lock.release()

    def _offer_exemplar(self, value_s: float, trace_id: str, span_id: str) -> None:
        exemplar = LinkedExemplar(trace_id, span_id, value_s, time.time())
        with self._lock:
            for name in catalog.EXEMPLAR_METRICS:
                self._state.add_exemplar(name, exemplar)

    def _fault(self, message: str) -> None:
        self._faults.fault(COLLECTOR_COMPONENT, message)
