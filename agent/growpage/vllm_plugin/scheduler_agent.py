"""GrowPage's home in vLLM's scheduler (EngineCore): one agent per ``Scheduler``, whatever the runner.

The scheduler side runs the same code on CPU and GPU, with either model runner, any CUDA-graph mode
and any executor, so everything that can be known there is known there:

- **lifecycle**: a request is admitted when it first runs, released when it finishes or is
  preempted (vLLM's preemption is counted in ``growpage_oom_events_total``);
- **grants**: every block vLLM's ``KVCacheManager.allocate_slots`` hands out, with the call's
  duration as its latency (``growpage_page_allocation_latency_seconds``);
- **boundaries**: in ``monitor``, each block a request takes beyond its grant runs the contract
  and the decision GrowPage *would* take is recorded; in ``enforce`` the
  :class:`~growpage.vllm_plugin.scheduler_requests.SchedulerEnforcer` decides and acts on the same controller;
- **the pool**: free, used and live slots read from vLLM's block pool and block lists, blocks
  shared through the prefix cache counted once (in the compression ratio too: only GrowPage's
  compactions count as compression, :func:`live_and_logical_tokens`);
- **telemetry**: the exporter (``/metrics/growpage`` on ``exporter_port``, plus the local
  data-parallel rank) serves from process start, before the model loads
  (:mod:`~growpage.vllm_plugin.startup`), and the agent takes it over when the scheduler is
  built, before any request and in every mode (``off`` included: ``growpage_build_info`` and
  ``growpage_agent_active{reason="mode_off"}``), so a scrape never depends on the workers.

The workers only observe attention and move tokens; their :class:`~growpage.vllm_plugin.wire.WorkerReport`
arrives with each step's output (summary readings, observer state, counts). This module imports no
vLLM: :mod:`~growpage.vllm_plugin.scheduler_hooks` wires it in, and tests drive it with stand-ins.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from growpage.config import GrowPageConfig, Mode
from growpage.core.controller import GrowthController, Reading
from growpage.core.headroom import Headroom
from growpage.core.methods import build_method
from growpage.core.stats import PoolGauges, StatsSnapshot
from growpage.core.step_control import RequestView, protected_tokens
from growpage.vllm_plugin.admission import LIMIT_ATTRIBUTE, AdmissionCollector, AdmissionGate, StepMeter
from growpage.vllm_plugin.blocks import blocks_by_request, physical_tokens, room_for_all
from growpage.vllm_plugin.exporter_retry import RETRY_INTERVAL_S, ExporterRetry
from growpage.vllm_plugin.forecast import EnforceForecast, ForecastCollector, WaitingRequest, step_requests
from growpage.vllm_plugin.headroom import HeadroomCollector, idle_headroom, read_headroom
from growpage.vllm_plugin.metrics import DegradedDecisionsCollector, ObservationCollector
from growpage.vllm_plugin.own_time import SCHEDULER_SIDE, WORKER_SIDE, OwnTime
from growpage.vllm_plugin.rank_faults import RankFaultReader
from growpage.vllm_plugin.scheduler_requests import SchedulerEnforcer, SchedulerRequests
from growpage.vllm_plugin.settings import PluginSettings, honours
from growpage.vllm_plugin.startup import take_over
from growpage.vllm_plugin.trace_join import parent_context_for, vllm_tracer_provider
from growpage.vllm_plugin.vllm_types import KVBlock, Request, Scheduler
from growpage.vllm_plugin.wire import (
    PAYLOAD_ATTRIBUTE,
    PLUGIN_COMPONENT,
    REPORT_ATTRIBUTE,
    WorkerReport,
    enforce_log_path,
    step_payload,
)

_Params = ParamSpec("_Params")
_Result = TypeVar("_Result")
logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format

# waiting requests the forecast reads a step: enforce admits a few more than vLLM, never the whole queue
FORECAST_WAITING_READ = 8
ACTIVE = "active"
MODE_OFF = "mode_off"


@dataclasses.dataclass
class SchedulerView:
    """What the agent reads of one deployment at start-up (plain values, so tests need no vLLM).

    Attributes:
        model: the served model name (the ``model_name`` label).
        engine_version: vLLM's version (``growpage_build_info``).
        device: the device KV lives on (``growpage_build_info``).
        num_pages: usable blocks in vLLM's pool (its null block excluded).
        token_bytes: KV bytes of one token across the layers of the KV cache group.
        component_states: ``{component: "active" or reason}`` known from the configuration.
        otlp_traces_endpoint: where vLLM exports its traces (``--otlp-traces-endpoint``), or None;
            GrowPage's spans then go there too, as children of vLLM's ``llm_request`` spans.
        cpu_kind: the host CPU's widest vector unit (:func:`growpage.provenance.cpu_kind`; ""
            unknown): measured admission's prior where KV lives on the CPU.
    """

    model: str
    engine_version: str
    device: str
    num_pages: int
    token_bytes: int
    component_states: dict[str, str]
    otlp_traces_endpoint: str | None = None
    cpu_kind: str = ""


@dataclasses.dataclass
class ObservedWork:
    """Totals of the work the workers saw: engine steps with a tracked request, and those observed;
    finished requests GrowPage tracked, and those observed at least once; the seconds of GrowPage's
    own work and of the steps it hooks, by side (the scheduler's read live from its meter, the
    worker's as its reports bring them)."""

    steps: int = 0
    steps_observed: int = 0
    steps_with_room: int = 0  # steps whose pool held every request at its full length (scheduler side)
    steps_compression_idle: int = 0  # steps enforce left decode-time compression idle (the compression gate)
    requests: int = 0
    requests_observed: int = 0
    scheduler_time: OwnTime = dataclasses.field(default_factory=OwnTime)
    worker_own_seconds: float = 0.0
    worker_step_seconds: float = 0.0

    def own_seconds(self) -> dict[str, float]:
        """GrowPage's own seconds by side (``growpage_vllm_own_seconds_total``)."""
        return {SCHEDULER_SIDE: self.scheduler_time.own_seconds, WORKER_SIDE: self.worker_own_seconds}

    def step_seconds(self) -> dict[str, float]:
        """The hooked vLLM calls' seconds by side (``growpage_vllm_step_seconds_total``)."""
        return {SCHEDULER_SIDE: self.scheduler_time.step_seconds, WORKER_SIDE: self.worker_step_seconds}


class SchedulerAgent:
    """The scheduler's GrowPage agent (see the module docstring).

    Args:
        config: GrowPage's config (``block_size`` = vLLM's).
        settings: the plugin's settings.
        view: the deployment as read at start-up.
        enforcer_blocker: why a deployment that runs ``enforce`` cannot (None: it can, or does not enforce).
        clock: monotonic seconds (growth throttle, telemetry pacing).
        rank_faults: under tensor parallelism, the faults the ranks whose reports never come back
            caught (:mod:`~growpage.vllm_plugin.rank_faults`; None: one rank).
    """

    def __init__(self, config: GrowPageConfig, settings: PluginSettings, view: SchedulerView, *,
                 enforcer_blocker: str | None = None, clock: Callable[[], float] = time.monotonic,
                 rank_faults: RankFaultReader | None = None):
        self.controller = GrowthController(config, num_layers=None, clock=clock, logger=logger,
                                           method=build_method(settings.method))
        self.config = self.controller.config
        self.settings = settings
        self.view = view
        self.stats = self.controller.stats
        self._clock = clock
        for component, state in view.component_states.items():
            self.stats.set_component_state(component, state)
        admission = settings.admission_on(view.device)
        enforcing = config.mode is Mode.ENFORCE and enforcer_blocker is None
        # what this engine's steps cost (measured admission weighs a recompute against a wider batch by it)
        self.steps = StepMeter(clock)

        def gate() -> AdmissionGate:
            return AdmissionGate(config.block_size, view.num_pages,
                                 policy="projected" if admission == "vllm" else admission,
                                 step_costs=self.steps.fit,
                                 prior_costs=settings.prior_step_costs(view.device, view.cpu_kind))

        # every request this side knows, one entry each, and what happens to each as a whole; growth-aware
        # admission where GrowPage enforces with it
        self.requests = SchedulerRequests(self.controller, gate() if enforcing and admission != "vllm" else None,
                                          log_path=enforce_log_path())
        self.enforcer: SchedulerEnforcer | None = None
        if enforcing:
            self.enforcer = SchedulerEnforcer(self.controller, requests=self.requests,
                                              grow_with_room_for_all=settings.grow_with_room_for_all,
                                              step_costs=self.steps.fit, compression_gate=settings.compression_gate)
            self.stats.set_component_state("enforcer", "waiting_for_worker")
        elif enforcer_blocker is not None and config.mode is Mode.ENFORCE:
            self.stats.set_component_state("enforcer", enforcer_blocker)
        # monitor's forecast of enforce, over the requests GrowPage monitors: none where no request can
        # be monitored (off, or enforce for every namespace with clients unable to ask for less), so an
        # enforcing deployment's steps carry no forecast work
        self.forecast: EnforceForecast | None = (
            # admission is always forecast (as configured, or as projected where enforce admits as vLLM)
            EnforceForecast(self.controller, gate(), enforce_admits_so=admission != "vllm",
                            compression_gate=settings.compression_gate)
            if may_monitor(config, settings) else None)
        self.scheduler: Scheduler | None = None
        self._allocations: dict[str, tuple[int, float]] = {}  # this step's new blocks and call time
        self.observed = ObservedWork()  # how much of the work the workers observed (ObservationCollector)
        self.telemetry: Any = None
        self.exporter: Any = None
        self._adopted_exporter: Any = None  # the start-up exporter this agent serves on, if any
        self._exporter_retry: ExporterRetry | None = None  # binding again while the port is taken
        # the router's view (growpage.core.headroom), replaced whole on the engine thread, read by scrapes
        self.headroom: Headroom = idle_headroom(view.num_pages, self.config)
        self.rank_faults = rank_faults

    @property
    def admission(self) -> AdmissionGate | None:
        """Growth-aware admission (None: vLLM admits on its own); the table of requests owns it."""
        return self.requests.admission

    # ---- StatsSource ----------------------------------------------------------------------------
    @property
    def device_name(self) -> str:
        return self.view.device

    def clock(self) -> float:
        return self._clock()

    @property
    def degraded_total(self) -> dict[tuple[str, str], int]:
        return dict(self.enforcer.degraded_total) if self.enforcer is not None else {}

    def guarded(self, what: str, function: Callable[_Params, _Result], *args: _Params.args,
                **kwargs: _Params.kwargs) -> _Result | None:
        """Run ``function``, timed as GrowPage's own work; a fault is counted (``component="plugin"``),
        logged once, never raised."""
        with self.observed.scheduler_time.own():
            return self.controller.faults.call(PLUGIN_COMPONENT, f"{what} failed in the scheduler; vLLM carries on",
                                               function, *args, **kwargs)

    # ---- the scheduler's step -------------------------------------------------------------------
    def before_schedule(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        if self.enforcer is not None:
            # guarded apart: a fault in admission leaves vLLM's own admission and the step's boundaries
            held = self.guarded("growth-aware admission", self.requests.gate_admission, scheduler)
            self.enforcer.before_schedule(scheduler, admission_held=bool(held))
        if self.forecast is not None:  # after the gate: it reads vLLM's configured limit, not this step's
            limit = (self.admission.configured_limit if self.admission is not None
                     else getattr(scheduler, LIMIT_ATTRIBUTE, None))
            self.guarded("forecasting enforce", self.forecast.before_schedule, scheduler, limit)

    def on_allocated(self, request_id: str, new_blocks: int, latency_s: float) -> None:
        """``KVCacheManager.allocate_slots`` handed ``request_id`` ``new_blocks`` blocks in ``latency_s``."""
        if new_blocks <= 0:
            return
        blocks, latency = self._allocations.get(request_id, (0, 0.0))
        self._allocations[request_id] = (blocks + new_blocks, latency + latency_s)

    def after_schedule(self, scheduler: Scheduler, output: Any) -> None:
        """Admit requests that run for the first time, record this step's grants and monitored
        boundaries, attach the enforcer's payload, and let telemetry poll."""
        self.scheduler = scheduler
        self.steps.scheduled(output)
        allocations, self._allocations = self._allocations, {}
        req_to_blocks = blocks_by_request(scheduler.kv_cache_manager)
        boundaries = []
        for request in scheduler.running:
            request_id = request.request_id
            held = len(req_to_blocks.get(request_id, ()))
            new_blocks, latency_s = allocations.pop(request_id, (0, 0.0))
            entry = self.requests.get(request_id)
            if entry is None or entry.pages_held is None:  # its first step, or its first since a preemption
                self._admit(request, held, new_blocks, latency_s)
                continue
            if new_blocks:
                control = self.controller.requests.get(request_id)
                if control is not None and control.mode is Mode.MONITOR and entry.pages_held >= entry.grant_pages:
                    boundaries.append((request, held))
                self.stats.record_grant(new_blocks, latency_s)
            entry.pages_held = held
        for new_blocks, latency_s in allocations.values():  # requests no longer running (not expected)
            self.stats.record_grant(new_blocks, latency_s)
        for request, held in boundaries:
            self._decide_monitored(scheduler, request, held)
        if self.forecast is not None:
            self.guarded("forecasting enforce", self._forecast_step, scheduler, output, req_to_blocks)
        if self.enforcer is not None:
            self.enforcer.after_schedule(scheduler, output)
            self.observed.steps_with_room += int(self.enforcer.room_for_all and bool(scheduler.running))
            self.observed.steps_compression_idle += int(self.enforcer.compression_idle and bool(scheduler.running))
        self.guarded("reading the headroom", self.refresh_headroom, scheduler)
        if self.telemetry is not None:
            self.telemetry.on_step()

    def _admit(self, request: Request, held: int, new_blocks: int, latency_s: float) -> None:
        """A run starts: the request's entry (made now at its first run) and its admission to the
        controller, unless it is not observed or the enforcer admitted it this step."""
        self.requests.track(request).pages_held = held
        admitted = self.requests.admit(request, cached_tokens=int(getattr(request, "num_cached_tokens", 0) or 0),
                                       pages_granted=new_blocks, latency_s=latency_s)
        if not admitted:  # not observed, or the enforcer admitted it this step: the grant is counted here
            self.stats.record_grant(new_blocks, latency_s)

    def _forecast_step(self, scheduler: Scheduler, output: Any, req_to_blocks: dict[str, list[KVBlock]]) -> None:
        assert self.forecast is not None
        pool = scheduler.kv_cache_manager.block_pool
        waiting = [WaitingRequest(r.request_id, int(r.num_prompt_tokens), int(r.num_tokens), _steps_left(r))
                   for r in itertools.islice(scheduler.waiting, FORECAST_WAITING_READ)]
        free = pool.get_num_free_blocks()
        room = self.settings.grow_with_room_for_all and room_for_all(
            free, scheduler.running, scheduler.waiting, req_to_blocks, self.config.block_size)
        self.forecast.on_step(step_requests(scheduler, output, req_to_blocks), free_pages=free,
                              waiting=waiting, total_pages=pool.num_gpu_blocks - 1,  # block 0 is vLLM's null block
                              room_for_all=room)
        if self.enforcer is None:
            # monitor's workers observe as enforce's would: only prompt ends while enforce's gate (run on
            # the shadows) idles or the pool holds everyone, so the forecast reads what enforce would read
            setattr(output, PAYLOAD_ATTRIBUTE, step_payload({}, {}, prompts_only=room or self.forecast.gate.idle))

    def _forecast_preemption(self, request: Request) -> None:
        assert self.forecast is not None
        self.forecast.on_preempt(request.request_id, _steps_left(request), int(request.num_tokens))

    def _decide_monitored(self, scheduler: Scheduler, request: Request, held: int) -> None:
        """Monitor: run the contract on a boundary vLLM's paging has already crossed; record what
        GrowPage would have done (vLLM's plain paging is what happened). Whether it could evict is
        the controller's answer for a compressible request: above its floor, past its protected tokens."""
        config = self.config
        view = RequestView(
            request.request_id, pages_held=held, allowance_pages=held, needs_page=True,
            protected_tokens=protected_tokens(int(request.num_computed_tokens), 0, config.sink_tokens,
                                              config.recent_window_tokens),
            can_evict=True)  # kv_cache_dtype is deployment-wide in vLLM: no per-request quantization
        plan = self.controller.plan_boundary(
            view, free_pages=scheduler.kv_cache_manager.block_pool.get_num_free_blocks())
        self.controller.record_decision(plan.call, kind=plan.call.decision.action, enforced=False, pages_after=held)

    # ---- request ends -----------------------------------------------------------------------------
    def on_preempt(self, request: Request) -> None:
        """vLLM preempted ``request`` (its blocks are freed; it is recomputed when it runs again)."""
        self.stats.record_oom()
        if self.enforcer is not None:
            self.enforcer.note_preemption(request)
        if self.forecast is not None:
            self.guarded("forecasting enforce", self._forecast_preemption, request)
        self.requests.preempted(request)
        self._release(request, "preempted")

    def on_free(self, request: Request) -> None:
        """``request`` finished or was aborted; its blocks are back in the pool."""
        if self.forecast is not None:
            self.guarded("forecasting enforce", self.forecast.on_finish, request)
        self.requests.finished(request)  # before the controller lets go: admission learns its attention need
        self._release(request, "finished")

    def _release(self, request: Request, reason: str) -> None:
        """The request's run ends (preempted) or the request does (finished or aborted): the
        forecast's shadow and the controller's growth state go."""
        if self.forecast is not None:
            self.forecast.forget(request.request_id)
        self._allocations.pop(request.request_id, None)
        released = self.controller.release(request.request_id, reason, num_tokens=int(request.num_tokens))
        if released is not None and reason == "finished":  # a preempted request is counted when it ends
            self.observed.requests += 1
            self.observed.requests_observed += int(released.observed)

    # ---- the workers' reports ---------------------------------------------------------------------
    def on_output(self, model_runner_output: Any, scheduler_output: Any = None) -> None:
        """Take the worker's :class:`WorkerReport` for ``scheduler_output``'s step (which the step
        meter times)."""
        self.steps.finished(scheduler_output)
        report = getattr(model_runner_output, REPORT_ATTRIBUTE, None)
        if isinstance(report, WorkerReport):
            self.take_report(report)
        if self.rank_faults is not None:
            self.count_rank_faults(self.rank_faults)

    def count_rank_faults(self, rank_faults: RankFaultReader) -> None:
        """Faults caught on ranks whose reports never come back, counted as the output rank's are."""
        for faults in rank_faults.new_faults().values():
            for _ in range(faults):
                self.stats.record_error(PLUGIN_COMPONENT)

    def take_report(self, report: WorkerReport) -> None:
        for request_id, (density, entropy) in report.readings.items():
            self.controller.update_reading(request_id, Reading(density, entropy))
        for request_id, tokens in report.attention_tokens.items():
            self.controller.update_attention_need(request_id, tokens)
        self.stats.set_component_state("observer", report.observer_state)
        for _ in range(report.errors):
            self.stats.record_error(PLUGIN_COMPONENT)
        self.observed.steps += report.steps
        self.observed.steps_observed += report.steps_observed
        self.observed.worker_own_seconds += report.own_seconds
        self.observed.worker_step_seconds += report.step_seconds
        if self.enforcer is not None:
            self.enforcer.on_worker_ready(report.ready_to_compact)
            self.stats.set_component_state("enforcer", ACTIVE if report.ready_to_compact else "waiting_for_worker")

    def after_output(self, scheduler: Scheduler) -> None:
        """After vLLM processed the step's output: an idle engine runs no further step, so poll now
        (the gauges then show the pool as the last request left it, not as it ran)."""
        if not scheduler.running and not scheduler.waiting:
            self.guarded("reading the headroom", self.refresh_headroom, scheduler)
            if self.telemetry is not None:
                self.telemetry.poll()

    def refresh_headroom(self, scheduler: Scheduler) -> None:
        """Read the pool and the running requests into :attr:`headroom` (nothing is reclaimable unless
        the enforcer runs and its worker can move tokens)."""
        def mode_of(request_id: str) -> Mode | None:
            control = self.controller.requests.get(request_id)
            return control.mode if control is not None else None

        def need_of(request_id: str) -> int:
            control = self.controller.requests.get(request_id)
            return control.attention_tokens if control is not None else 0

        can_compact = self.enforcer is not None and bool(getattr(self.enforcer, "worker_ready", False))
        self.headroom = read_headroom(scheduler, self.view.num_pages, self.config, enforced_mode=mode_of,
                                      can_compact=can_compact, attention_tokens=need_of)

    # ---- stats ----------------------------------------------------------------------------------------
    def make_stats(self) -> StatsSnapshot:
        """Get-and-reset stats (the telemetry agent is the only caller)."""
        return self.controller.make_stats(self._gauges())

    def _gauges(self) -> PoolGauges:
        num_pages, block_size = self.view.num_pages, self.config.block_size
        scheduler = self.scheduler
        if scheduler is None:  # before the first step: an empty pool
            return self.controller.pool_gauges(
                num_pages=num_pages, pages_free=num_pages, pages_reserved=0, pages_used=0, live_tokens=0,
                granted_token_slots=0, used_token_slots=0, logical_bytes=0, stored_bytes=0, tracked=[])
        free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        used = max(0, num_pages - free)
        live, logical = live_and_logical_tokens(scheduler.running, blocks_by_request(scheduler.kv_cache_manager),
                                                block_size)
        token_bytes = self.view.token_bytes
        return self.controller.pool_gauges(
            num_pages=num_pages, pages_free=min(free, num_pages), pages_reserved=0, pages_used=used,
            live_tokens=live, granted_token_slots=used * block_size, used_token_slots=used * block_size,
            logical_bytes=logical * token_bytes, stored_bytes=live * token_bytes,
            tracked=[r.request_id for r in scheduler.running])

    # ---- telemetry -----------------------------------------------------------------------------------
    def parent_context(self, request_id: str) -> Any:
        """The trace context ``growpage.request`` continues: vLLM's ``llm_request`` span for the
        request when it carries trace headers (:mod:`~growpage.vllm_plugin.trace_join`)."""
        request = getattr(self.scheduler, "requests", {}).get(request_id) if self.scheduler is not None else None
        return parent_context_for(getattr(request, "trace_headers", None), request_id)

    def start_telemetry(self) -> None:
        """The telemetry agent and, unless disabled, the exporter on ``exporter_port``: the one this
        process's start-up exporter already serves when there is one (:mod:`~growpage.vllm_plugin.startup`;
        it keeps serving, now the agent's series), else a new one. A port that cannot be bound is
        counted (``growpage_agent_errors_total{component="plugin"}``) and logged; vLLM carries on."""
        # deferred: telemetry brings OpenTelemetry's SDK and prometheus_client, loaded when the agent
        # starts serving, not wherever this module is imported (the hooks, tests with stand-ins)
        from growpage.telemetry import TelemetryAgent
        from growpage.telemetry.tracing import tracing_enabled

        port, host = self.settings.exporter_port, self.settings.exporter_host
        early = take_over(port, host) if self.settings.exporter_enabled else None
        model, version = self.view.model, self.view.engine_version
        shared: dict[str, Any] = {"model": model, "engine": "vllm", "engine_version": version,
                                  "parent_context": self.parent_context,
                                  "registry": early.registry if early is not None else None}
        if self.view.otlp_traces_endpoint and not tracing_enabled():  # vLLM traces: join its traces
            self.telemetry = TelemetryAgent(self, tracer_provider=vllm_tracer_provider(self.view.otlp_traces_endpoint),
                                            **shared)
        else:
            self.telemetry = TelemetryAgent.from_env(self, **shared)
        self.telemetry.registry.register(DegradedDecisionsCollector(self, self.view.model))
        self.telemetry.registry.register(ObservationCollector(self, self.view.model))
        self.telemetry.registry.register(ForecastCollector(self, self.view.model))
        self.telemetry.registry.register(AdmissionCollector(self, self.view.model))
        self.telemetry.registry.register(HeadroomCollector(self, self.view.model))
        if early is not None:
            self.exporter = self._adopted_exporter = early.exporter
        elif self.settings.exporter_enabled:
            try:
                self.exporter = self.telemetry.serve(port, host)
            except OSError:
                self.controller.fault(PLUGIN_COMPONENT, f"binding the exporter to port {port} failed (retrying every "
                                                        f"{RETRY_INTERVAL_S:g} s); choose a free exporter_port (with "
                                                        "data parallelism rank r binds port + r)")
                self._exporter_retry = ExporterRetry(lambda: self.telemetry.serve(port, host), self._exporter_bound,
                                                     port)
                return
        if self.exporter is not None:
            logger.info("growpage: /metrics/growpage served at %s (pid %d, mode %s)", self.exporter.url, os.getpid(),
                        self.config.mode.value)

    def _exporter_bound(self, exporter: Any) -> None:
        self.exporter = exporter
        logger.info("growpage: /metrics/growpage served at %s after its port freed (pid %d)", exporter.url,
                    os.getpid())

    def close(self) -> None:
        """Stop telemetry and its exporter, also one taken over from start-up (telemetry did not start that one)."""
        if self._exporter_retry is not None:
            self._exporter_retry.stop()
            self._exporter_retry = None
        if self.telemetry is not None:
            self.telemetry.close()
        if self._adopted_exporter is not None:
            self._adopted_exporter.close()
            self._adopted_exporter = None
        self.exporter = None
        if self.rank_faults is not None:
            self.rank_faults.close()
            self.rank_faults = None


def may_monitor(config: GrowPageConfig, settings: PluginSettings) -> bool:
    """Whether any request of this deployment can run in ``monitor``: it monitors, or it enforces only
    some namespaces, or it lets clients lower their mode."""
    if config.mode is Mode.OFF:
        return False
    return (config.mode is Mode.MONITOR or bool(config.enforce_namespaces)
            or honours(settings.client_mode, config.mode))


def live_and_logical_tokens(running: Sequence[Request], req_to_blocks: dict[str, list[KVBlock]],
                            block_size: int) -> tuple[int, int]:
    """Tokens the running requests' KV holds in the pool, and the tokens it would hold without GrowPage.

    Both count a block shared through vLLM's prefix cache once: sharing is vLLM's saving, not
    GrowPage's, so with nothing compacted the two are equal (a compression ratio of 1.0) however
    many requests share a prefix. Only GrowPage's own compactions part them: logical = live + the
    tokens compactions dropped (``growpage_dropped``, which only ever comes from blocks the
    request alone held). A request's block ``i`` holds ``min(block_size, physical - i * block_size)``
    tokens, where ``physical`` is its computed tokens less those GrowPage dropped.
    """
    per_block: dict[int, int] = {}
    dropped = 0
    for request in running:
        physical = physical_tokens(request)
        dropped += int(request.num_computed_tokens) - physical
        for index, block in enumerate(req_to_blocks.get(request.request_id, ())):
            tokens = max(0, min(block_size, physical - index * block_size))
            block_id = getattr(block, "block_id", id(block))
            per_block[block_id] = max(per_block.get(block_id, 0), tokens)
    live = sum(per_block.values())
    return live, live + dropped


def _steps_left(request: Request) -> int:
    """Decode steps to ``request``'s ``max_tokens``: how long enforce would run it on (an upper bound
    where it stops earlier)."""
    return int(request.max_tokens) - int(request.num_output_tokens)
