"""Plain stats snapshots: everything the metrics contract needs, with no prometheus import.

The manager records events into a :class:`StatsRecorder`; ``make_stats()`` returns a
:class:`StatsSnapshot` with cumulative counters, current gauges and the samples collected since the
previous snapshot (get-and-reset, as vLLM's ``make_stats``), so exactly one consumer (the telemetry
collector) should drain it. Sample lists are bounded; what overflowed is counted, never silently
dropped.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Protocol, TypeVar

logger = logging.getLogger(__name__)

_Sample = TypeVar("_Sample")  # one bounded sample list holds one kind of value

DECISION_KINDS = ("allocate", "quantize", "evict", "denied", "throttled", "preempt")
ACTIVE = "active"  # a component's state when it runs; anything else is the reason it does not
MAX_SAMPLES = 10_000
MAX_EVENTS = 2_000


@dataclasses.dataclass(frozen=True)
class DecisionEvent:
    """One boundary decision, for spans and timelines (request ids never become metric labels)."""

    request_id: str
    namespace: str | None
    kind: str  # the action taken (or that monitor mode would take)
    refusal: str | None
    reason: str
    enforced: bool
    pages_before: int
    pages_after: int
    sts_density: float
    lts_entropy: float
    capacity_boundary_pages: float
    bytes_in: int
    bytes_out: int
    duration_s: float
    time_s: float


@dataclasses.dataclass(frozen=True)
class AdmitEvent:
    """A request was granted its pages."""

    request_id: str
    namespace: str | None
    mode: str
    prompt_tokens: int
    cached_tokens: int
    pages_granted: int
    latency_s: float
    time_s: float


@dataclasses.dataclass(frozen=True)
class FinishEvent:
    """A request released its pages (finished, aborted or preempted)."""

    request_id: str
    reason: str
    num_tokens: int
    lts_entropy: float | None
    time_s: float


class StatsListener(Protocol):
    """Receives request lifecycle events as they happen (e.g. the tracer). Called from the engine
    loop: keep it cheap, and do nothing when not recording. Exceptions are caught and counted."""

    def on_admit(self, event: AdmitEvent) -> None: ...

    def on_decision(self, event: DecisionEvent) -> None: ...

    def on_finish(self, event: FinishEvent) -> None: ...


@dataclasses.dataclass(frozen=True)
class PoolGauges:
    """Instantaneous state of the pool and the running requests."""

    num_pages: int
    pages_free: int
    pages_reserved: int
    pages_used: int
    live_tokens: int
    granted_token_slots: int  # token slots of reserved + used pages (quantized pages hold more)
    used_token_slots: int
    logical_bytes: int  # every running request's seen tokens at full precision
    stored_bytes: int  # bytes of the live tokens at their page's format, scales included
    requests_running: int
    capacity_boundaries: tuple[float, ...]  # of running requests, pages
    lts_by_namespace: dict[str, tuple[float, ...]]

    @property
    def utilization(self) -> float:
        """Live KV tokens / token slots granted (0 when nothing is granted)."""
        return self.live_tokens / self.granted_token_slots if self.granted_token_slots else 0.0

    @property
    def fragmentation(self) -> float:
        """1 - live tokens / token slots of used pages: tail slack and eviction holes."""
        return 1.0 - self.live_tokens / self.used_token_slots if self.used_token_slots else 0.0

    @property
    def compression_ratio(self) -> float:
        """Logical KV bytes / stored KV bytes (1.0 when nothing is stored)."""
        return self.logical_bytes / self.stored_bytes if self.stored_bytes else 1.0


@dataclasses.dataclass(frozen=True)
class StatsSnapshot:
    """One get-and-reset read of the agent's stats."""

    gauges: PoolGauges
    # cumulative
    decisions_total: dict[str, int]
    pages_allocated_total: int
    compress_input_bytes_total: int
    compress_output_bytes_total: int
    oom_events_total: int
    agent_errors_total: dict[str, int]
    requests_finished_total: dict[str, int]  # by reason: finished, aborted, preempted
    # since the previous snapshot
    allocation_latencies_s: tuple[float, ...]
    lts_entropy_at_finish: tuple[float, ...]
    request_tokens_at_finish: tuple[int, ...]
    sts_density_at_decision: tuple[float, ...]
    window_compress_input_bytes: int
    window_compress_output_bytes: int
    decision_events: tuple[DecisionEvent, ...]
    samples_dropped: int
    # component ("observer", "enforcer") -> ACTIVE, or why it is inactive in this process
    # (e.g. "unsupported_backend", "full_cudagraph", "async_scheduling"); current, not windowed
    component_states: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def intra_page_compress_ratio(self) -> float | None:
        """Bytes in / bytes out of this window's compressions; None when there were none."""
        if not self.window_compress_output_bytes:
            return None
        return self.window_compress_input_bytes / self.window_compress_output_bytes


class StatsRecorder:
    """Collects events; cheap enough for the decode loop (appends and integer adds)."""

    def __init__(self) -> None:
        self.decisions_total: collections.Counter[str] = collections.Counter(
            {kind: 0 for kind in DECISION_KINDS})
        self.pages_allocated_total = 0
        self.compress_input_bytes_total = 0
        self.compress_output_bytes_total = 0
        self.oom_events_total = 0
        self.agent_errors_total: collections.Counter[str] = collections.Counter()
        self.requests_finished_total: collections.Counter[str] = collections.Counter()
        self.listeners: list[StatsListener] = []
        self.component_states: dict[str, str] = {}
        self._reset_window()

    def add_listener(self, listener: StatsListener) -> None:
        self.listeners.append(listener)

    def _notify(self, method: str, event: AdmitEvent | DecisionEvent | FinishEvent) -> None:
        for listener in self.listeners:
            try:
                getattr(listener, method)(event)
            except Exception:  # a telemetry fault must never reach the engine
                first = self.agent_errors_total["listener"] == 0
                self.agent_errors_total["listener"] += 1
                if first:
                    logger.exception("growpage: stats listener %r failed (further faults are only counted)",
                                     listener)

    def _reset_window(self) -> None:
        self._latencies: list[float] = []
        self._lts_at_finish: list[float] = []
        self._tokens_at_finish: list[int] = []
        self._density_at_decision: list[float] = []
        self._window_in = 0
        self._window_out = 0
        self._events: list[DecisionEvent] = []
        self._dropped = 0

    def _append(self, samples: list[_Sample], value: _Sample, limit: int = MAX_SAMPLES) -> None:
        if len(samples) < limit:
            samples.append(value)
        else:
            self._dropped += 1

    def record_admit(self, event: AdmitEvent) -> None:
        self.record_grant(event.pages_granted, event.latency_s)
        self._notify("on_admit", event)

    def record_grant(self, num_pages: int, latency_s: float) -> None:
        """``num_pages`` granted in ``latency_s``; nothing granted (a prompt fully served from the
        prefix cache) is no grant and adds no latency sample."""
        if num_pages <= 0:
            return
        self.pages_allocated_total += num_pages
        self._append(self._latencies, latency_s)

    def record_decision(self, event: DecisionEvent) -> None:
        if event.refusal:
            self.decisions_total[event.refusal] += 1
        if event.kind in DECISION_KINDS:
            self.decisions_total[event.kind] += 1
        self._append(self._density_at_decision, event.sts_density)
        self._append(self._events, event, MAX_EVENTS)
        self._notify("on_decision", event)

    def record_compression(self, bytes_in: int, bytes_out: int) -> None:
        self.compress_input_bytes_total += bytes_in
        self.compress_output_bytes_total += bytes_out
        self._window_in += bytes_in
        self._window_out += bytes_out

    def record_oom(self) -> None:
        self.oom_events_total += 1

    def set_component_state(self, component: str, state: str) -> None:
        """``ACTIVE``, or the reason ``component`` does nothing in this process (never silent)."""
        self.component_states[component] = state

    def record_error(self, component: str) -> None:
        self.agent_errors_total[component] += 1

    def record_finish(self, event: FinishEvent) -> None:
        self.requests_finished_total[event.reason] += 1
        if event.reason != "preempted":  # a preempted request comes back; count its length once
            self._append(self._tokens_at_finish, event.num_tokens)
        if event.lts_entropy is not None:
            self._append(self._lts_at_finish, event.lts_entropy)
        self._notify("on_finish", event)

    def drain(self, gauges: PoolGauges) -> StatsSnapshot:
        snapshot = StatsSnapshot(
            gauges=gauges,
            decisions_total=dict(self.decisions_total),
            pages_allocated_total=self.pages_allocated_total,
            compress_input_bytes_total=self.compress_input_bytes_total,
            compress_output_bytes_total=self.compress_output_bytes_total,
            oom_events_total=self.oom_events_total,
            agent_errors_total=dict(self.agent_errors_total),
            requests_finished_total=dict(self.requests_finished_total),
            allocation_latencies_s=tuple(self._latencies),
            lts_entropy_at_finish=tuple(self._lts_at_finish),
            request_tokens_at_finish=tuple(self._tokens_at_finish),
            sts_density_at_decision=tuple(self._density_at_decision),
            window_compress_input_bytes=self._window_in,
            window_compress_output_bytes=self._window_out,
            decision_events=tuple(self._events),
            samples_dropped=self._dropped,
            component_states=dict(self.component_states),
        )
        self._reset_window()
        return snapshot
