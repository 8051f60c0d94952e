"""OpenTelemetry traces: one ``growpage.request`` span per request, configured from ``OTEL_*``.

Off by default. :func:`tracing_enabled` is the switch: ``OTEL_SDK_DISABLED=true`` or
``GROWPAGE_TRACING=0`` turn it off; ``GROWPAGE_TRACING=1`` or ``OTEL_TRACES_EXPORTER=otlp`` (or
``console``) turn it on. The rest is the SDK's own reading of the standard variables:
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` / ``_ARG`` (default
``parentbased_always_on``), ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` / ``HEADERS`` / ``TIMEOUT`` /
``COMPRESSION`` (OTLP over http/protobuf), ``OTEL_BSP_*`` for the batch processor.

:class:`RequestTracer` is a core ``StatsListener``: it runs synchronously in the engine loop, so it
does nothing for unsampled requests (no span kept, no attribute computed), and every fault is caught
and counted (component ``tracing``), never raised into the engine.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from growpage import __version__, catalog
from growpage.core.stats import AdmitEvent, DecisionEvent, FinishEvent
from growpage.errors import ConfigError

logger = logging.getLogger(__name__)

TRACING_SWITCH_ENV = "GROWPAGE_TRACING"
TRACING_COMPONENT = "tracing"
DEFAULT_SERVICE_NAME = "growpage"
SUPPORTED_PROTOCOL = "http/protobuf"
MAX_OPEN_SPANS = 10_000  # requests that never finish (an engine bug) cannot grow memory forever
_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")
_COMPRESSIONS = ("quantize", "evict")

# Called with (value_s, trace_id_hex, span_id_hex) for a sampled page grant.
ExemplarSink = Callable[[float, str, str], None]


def _exporter_names(environ: Mapping[str, str]) -> list[str]:
    raw = environ.get("OTEL_TRACES_EXPORTER", "")
    return [name.strip().lower() for name in raw.split(",") if name.strip()]


def tracing_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether GrowPage should trace, from the environment (default: off).

    Off when ``OTEL_SDK_DISABLED=true``, ``GROWPAGE_TRACING`` is false-ish, or
    ``OTEL_TRACES_EXPORTER=none``. On when ``GROWPAGE_TRACING`` is true-ish (exporter ``otlp``
    unless ``OTEL_TRACES_EXPORTER`` names one) or ``OTEL_TRACES_EXPORTER`` is set. The SDK would
    default the exporter to OTLP when the variable is unset; we do not, so a deployment that never
    asked for traces never tries to reach a collector.
    """
    environ = os.environ if environ is None else environ
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    switch = environ.get(TRACING_SWITCH_ENV, "").strip().lower()
    exporters = _exporter_names(environ)
    if switch in _FALSE or exporters == ["none"]:
        return False
    return switch in _TRUE or bool(exporters)


def _make_exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER={name!r} is not supported by GrowPage; use 'otlp' "
                          "(OTLP over http/protobuf) or 'console', or unset it to keep tracing off")
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or SUPPORTED_PROTOCOL).strip()
    if protocol != SUPPORTED_PROTOCOL:
        raise ConfigError(f"OTLP protocol {protocol!r} is not supported by GrowPage; set "
                          f"OTEL_EXPORTER_OTLP_PROTOCOL={SUPPORTED_PROTOCOL} and point "
                          "OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port (usually 4318)")
    # Imported here: the OTLP exporter pulls in requests and protobuf, which off-by-default need not.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()  # endpoint, headers, timeout, compression: OTEL_EXPORTER_OTLP_*


def configure_tracing() -> TracerProvider | None:
    """A private ``TracerProvider`` from the standard ``OTEL_*`` variables, or None when off.

    Private (not installed as the global provider) so GrowPage neither overrides nor depends on the
    host engine's tracing; pass the host's provider to the agent instead to share one pipeline.

    Raises:
        ConfigError: an exporter or OTLP protocol GrowPage cannot serve (the message says what to set).
    """
    if not tracing_enabled():
        return None
    names = _exporter_names(os.environ) or ["otlp"]
    exporters = [_make_exporter(name) for name in names if name != "none"]
    attributes = {}
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""):
        attributes[SERVICE_NAME] = DEFAULT_SERVICE_NAME  # explicit values override the env: only default
    provider = TracerProvider(resource=Resource.create(attributes))  # sampler: OTEL_TRACES_SAMPLER
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))  # OTEL_BSP_* tune it
    return provider


class EpochClock:
    """Maps the manager's clock (seconds, any origin: monotonic in production, fake in tests) to
    span timestamps (ns since the epoch), anchored once so spans of one process stay ordered.

    Args:
        clock: the manager's clock, seconds.
    """

    def __init__(self, clock: Callable[[], float]):
        self._anchor_epoch_ns = time.time_ns()
        self._anchor_clock_s = clock()

    def to_epoch_ns(self, clock_s: float) -> int:
        return self._anchor_epoch_ns + round((clock_s - self._anchor_clock_s) * 1e9)


@dataclasses.dataclass
class _OpenRequest:
    span: trace.Span
    sampled: bool
    prompt_tokens: int
    start_ns: int
    last_end_ns: int  # children end here at the latest; the request span must not end before it


def _decision_attributes(event: DecisionEvent) -> dict[str, str | int | float | bool]:
    attributes: dict[str, str | int | float | bool] = {
        "growpage.decision.kind": event.kind,
        "growpage.decision.reason": event.reason,
        "growpage.decision.enforced": event.enforced,
        "growpage.pages_before": event.pages_before,
        "growpage.pages_after": event.pages_after,
        "growpage.sts_density": event.sts_density,
        "growpage.lts_entropy": event.lts_entropy,
        "growpage.capacity_boundary_pages": event.capacity_boundary_pages,
        "growpage.bytes_in": event.bytes_in,
        "growpage.bytes_out": event.bytes_out,
        "growpage.decision.duration_s": event.duration_s,
    }
    if event.refusal:
        attributes["growpage.decision.refusal"] = event.refusal
    return attributes


class RequestTracer:
    """A ``StatsListener`` that turns request lifecycle events into spans.

    ``growpage.request`` starts at admission (backdated by the grant latency) and ends at release;
    each boundary decision is a ``growpage.decision`` event on it. Only for sampled requests,
    enforced compressions and growth become ``growpage.compress`` / ``growpage.allocate`` child
    spans (timed by the event's ``duration_s``), the admission grant a ``growpage.allocate`` child,
    and admission grants are offered as exemplars for ``growpage_page_allocation_latency_seconds``
    (their event carries the exact latency the histogram counted).

    Args:
        tracer: from the provider GrowPage traces into.
        model: the served model (``gen_ai.request.model``).
        clock: the manager's clock (event ``time_s`` is read from it).
        on_error: counts a caught fault, called with ``"tracing"``.
        on_exemplar: receives sampled grant latencies with their trace and span ids.
        parent_context: returns the context a request's span should be a child of (e.g. from
            the engine's trace headers), or None for a root span.
    """

    def __init__(self, tracer: trace.Tracer, *, model: str, clock: Callable[[], float],
                 on_error: Callable[[str], None], on_exemplar: ExemplarSink | None = None,
                 parent_context: Callable[[str], Context | None] | None = None):
        self._tracer = tracer
        self._model = model
        self._epoch = EpochClock(clock)
        self._on_error = on_error
        self._on_exemplar = on_exemplar
        self._parent_context = parent_context
        self._open: collections.OrderedDict[str, _OpenRequest] = collections.OrderedDict()
        self._logged = False

    @property
    def num_open_spans(self) -> int:
        return len(self._open)

    # ---- StatsListener ------------------------------------------------------------------------
    def on_admit(self, event: AdmitEvent) -> None:
        self._guard(self._admit, event)

    def on_decision(self, event: DecisionEvent) -> None:
        self._guard(self._decision, event)

    def on_finish(self, event: FinishEvent) -> None:
        self._guard(self._finish, event)

    def close(self) -> None:
        """End every span still open (engine shutdown), so the batch processor can export them."""
        while self._open:
            _, request = self._open.popitem(last=False)
            request.span.set_attribute("growpage.abandoned", True)
            request.span.end()

    # ---- handlers -----------------------------------------------------------------------------
    def _guard(self, handler: Callable[[Any], None], event: object) -> None:
        try:
            handler(event)
        except Exception:  # a tracer fault must never reach the engine loop
            self._on_error(TRACING_COMPONENT)
            if not self._logged:
                self._logged = True
                logger.exception("growpage tracing: handling %s failed (further faults are counted in "
                                 "growpage_agent_errors_total{component=\"tracing\"})", type(event).__name__)

    def _admit(self, event: AdmitEvent) -> None:
        end_ns = self._epoch.to_epoch_ns(event.time_s)
        start_ns = end_ns - round(event.latency_s * 1e9)
        context = self._parent_context(event.request_id) if self._parent_context else None
        span = self._tracer.start_span(catalog.SPAN_REQUEST, context=context, start_time=start_ns)
        if not span.is_recording():
            return  # unsampled: keep nothing, compute nothing; later events find no open request
        self._evict_if_full()
        stale = self._open.pop(event.request_id, None)
        if stale is not None:  # admitted twice without a release: close the first honestly
            stale.span.set_attribute("growpage.abandoned", True)
            stale.span.end()
        span.set_attributes({
            "gen_ai.request.model": self._model,
            "gen_ai.usage.input_tokens": event.prompt_tokens,
            "growpage.request.id": event.request_id,
            "growpage.mode": event.mode,
            "growpage.cached_tokens": event.cached_tokens,
            "growpage.pages_granted": event.pages_granted,
            "growpage.grant_latency_s": event.latency_s,
        })
        if event.namespace:
            span.set_attribute("growpage.namespace", event.namespace)
        sampled = span.get_span_context().trace_flags.sampled
        request = _OpenRequest(span, sampled, event.prompt_tokens, start_ns, end_ns)
        self._open[event.request_id] = request
        if sampled:
            self._child(request, catalog.SPAN_ALLOCATE, start_ns, end_ns, {
                "growpage.allocation.phase": "admission", "growpage.pages": event.pages_granted},
                exemplar_value_s=event.latency_s)

    def _decision(self, event: DecisionEvent) -> None:
        request = self._open.get(event.request_id)
        if request is None or not request.span.is_recording():
            return
        end_ns = max(self._epoch.to_epoch_ns(event.time_s), request.start_ns)
        request.span.add_event(catalog.EVENT_DECISION, attributes=_decision_attributes(event),
                               timestamp=end_ns)
        if not (request.sampled and event.enforced):
            return
        start_ns = max(end_ns - round(event.duration_s * 1e9), request.start_ns)
        if event.kind in _COMPRESSIONS:
            attributes = {"growpage.compress.method": event.kind, "growpage.bytes_in": event.bytes_in,
                          "growpage.bytes_out": event.bytes_out,
                          "growpage.pages_freed": max(event.pages_before - event.pages_after, 0)}
            if event.bytes_out:
                attributes["growpage.compress_ratio"] = event.bytes_in / event.bytes_out
            self._child(request, catalog.SPAN_COMPRESS, start_ns, end_ns, attributes)
        elif event.kind == "allocate":
            # NOTE: no exemplar here. The event times the whole decision (reading summaries,
            # planning compressions), often 100x the grant itself; as an exemplar it would sit in a
            # bucket the histogram never counted. Admission grants carry their exact latency.
            self._child(request, catalog.SPAN_ALLOCATE, start_ns, end_ns, {
                "growpage.allocation.phase": "growth", "growpage.pages": 1,
                "growpage.decision.reason": event.reason})

    def _finish(self, event: FinishEvent) -> None:
        request = self._open.pop(event.request_id, None)
        if request is None:
            return
        span = request.span
        span.set_attribute("growpage.finish_reason", event.reason)
        span.set_attribute("growpage.tokens_total", event.num_tokens)
        if event.reason == "finished":
            span.set_attribute("gen_ai.usage.output_tokens", max(event.num_tokens - request.prompt_tokens, 0))
        if event.lts_entropy is not None:
            span.set_attribute("growpage.lts_entropy", event.lts_entropy)
        span.end(end_time=max(self._epoch.to_epoch_ns(event.time_s), request.last_end_ns))

    def _child(self, request: _OpenRequest, name: str, start_ns: int, end_ns: int,
               attributes: dict, exemplar_value_s: float | None = None) -> None:
        context = trace.set_span_in_context(request.span)
        child = self._tracer.start_span(name, context=context, start_time=start_ns, attributes=attributes)
        child.end(end_time=end_ns)
        request.last_end_ns = max(request.last_end_ns, end_ns)
        if exemplar_value_s is not None and self._on_exemplar is not None:
            span_context = child.get_span_context()
            self._on_exemplar(exemplar_value_s, trace.format_trace_id(span_context.trace_id),
                              trace.format_span_id(span_context.span_id))

    def _evict_if_full(self) -> None:
        while len(self._open) >= MAX_OPEN_SPANS:
            request_id, request = self._open.popitem(last=False)
            request.span.set_attribute("growpage.abandoned", True)
            request.span.end()
            logger.debug("growpage tracing: %s never finished; its span was ended", request_id)


def tracer_for(provider: TracerProvider) -> trace.Tracer:
    """GrowPage's tracer from ``provider`` (instrumentation scope ``growpage``)."""
    return provider.get_tracer("growpage", __version__)
