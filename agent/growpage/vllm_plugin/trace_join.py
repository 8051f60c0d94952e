"""GrowPage's spans as children of vLLM's ``llm_request`` span, across vLLM's processes.

vLLM (``--otlp-traces-endpoint``) makes one ``llm_request`` span per request in the front-end, after
the request has finished, as a child of the client's trace context (its ``traceparent`` header);
its span id is chosen only then. GrowPage's spans are made earlier, in EngineCore, where the
scheduler agent admits the request and decides its boundaries. To make them children of vLLM's span
without a channel between the processes, both sides derive that span's id from what both know: the
client's trace id and the request id (:func:`request_span_id`).

- front-end (:func:`install_front_end_hook`): around ``OutputProcessor.do_tracing`` the next span
  id OpenTelemetry's random id generator hands out is pinned to the derived one
  (:func:`pin_span_ids`; every other span keeps its random id);
- EngineCore (:func:`parent_context_for`): the scheduler agent parents ``growpage.request`` on a
  remote span context with that trace id and that span id.

Only requests that carry trace headers join (vLLM's span is then in the client's trace); without
them GrowPage's spans are roots of their own traces. Every hook here swallows its own faults.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from growpage import __version__
from growpage.vllm_plugin.patching import is_wrapped, wrap_methods

if TYPE_CHECKING:  # for annotations only: OpenTelemetry is imported where it is used (tracing is optional)
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    from opentelemetry.trace import SpanContext

    from growpage.vllm_plugin.vllm_types import FrontEndRequestState

logger = logging.getLogger("vllm.growpage")

_PINNED_SPAN_ID: contextvars.ContextVar[int | None] = contextvars.ContextVar("growpage_pinned_span_id",
                                                                             default=None)


def request_span_id(trace_id: int, request_id: str) -> int:
    """The span id of vLLM's ``llm_request`` span for ``request_id`` in trace ``trace_id`` (never 0)."""
    digest = hashlib.sha256(f"{trace_id:032x}/{request_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def _client_span_context(trace_headers: Mapping[str, str] | None) -> SpanContext | None:
    """The client's span context from ``traceparent``, or None when there is none (or it is invalid)."""
    if not trace_headers:
        return None
    # deferred: OpenTelemetry loads only where tracing is on
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = TraceContextTextMapPropagator().extract(dict(trace_headers))
    span_context = trace.get_current_span(context).get_span_context()
    return span_context if span_context.is_valid else None


def parent_context_for(trace_headers: Mapping[str, str] | None, request_id: str) -> Context | None:
    """The context ``growpage.request`` is a child of: vLLM's ``llm_request`` span for the request,
    or None when the request carries no trace headers."""
    client = _client_span_context(trace_headers)
    if client is None:
        return None
    # deferred: OpenTelemetry loads only where tracing is on
    from opentelemetry import trace

    parent = trace.SpanContext(trace_id=client.trace_id, span_id=request_span_id(client.trace_id, request_id),
                               is_remote=True, trace_flags=client.trace_flags, trace_state=client.trace_state)
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


def pin_span_ids() -> bool:
    """Make OpenTelemetry's random id generator hand out the pinned span id, once, inside
    :data:`_PINNED_SPAN_ID`'s window (a no-op everywhere else). Returns False when already done.

    The class is patched, not one provider's generator: the SDK caches its tracers with the
    generator they were made with, and vLLM's tracer may exist before the first traced request.
    """
    # deferred: OpenTelemetry's SDK loads only where tracing is on
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    if is_wrapped(RandomIdGenerator.generate_span_id):
        return False
    wrap_methods([(RandomIdGenerator, "generate_span_id", _pinning_span_ids)])
    return True


def _pinning_span_ids(original: Callable[[RandomIdGenerator], int]) -> Callable[[RandomIdGenerator], int]:
    @functools.wraps(original)
    def generate_span_id(self: RandomIdGenerator) -> int:
        pinned = _PINNED_SPAN_ID.get()
        if pinned is not None:
            _PINNED_SPAN_ID.set(None)  # once: the span's children get ids of their own
            return pinned
        return int(original(self))

    return generate_span_id


def install_front_end_hook() -> bool:
    """Wrap ``OutputProcessor.do_tracing`` once per process. Returns False when already done."""
    # deferred: vLLM's modules load when the hook installs, not with the plugin's modules
    from vllm.v1.engine.output_processor import OutputProcessor

    if is_wrapped(OutputProcessor.do_tracing):
        return False
    pin_span_ids()
    wrap_methods([(OutputProcessor, "do_tracing", _pinning_request_span)])
    return True


def _pinning_request_span(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def do_tracing(self: object, engine_core_output: object, req_state: FrontEndRequestState, *args: object,
                   **kwargs: object) -> object:
        span_id = None
        try:
            client = _client_span_context(getattr(engine_core_output, "trace_headers", None))
            if client is not None:
                span_id = request_span_id(client.trace_id, str(req_state.request_id))
        except Exception:
            logger.debug("growpage: cannot pin the llm_request span id; vLLM traces as usual", exc_info=True)
        token = _PINNED_SPAN_ID.set(span_id)
        try:
            return original(self, engine_core_output, req_state, *args, **kwargs)
        finally:
            _PINNED_SPAN_ID.reset(token)

    return do_tracing


def vllm_tracer_provider(endpoint: str, service_name: str = "growpage") -> TracerProvider:
    """A tracer provider exporting to vLLM's own OTLP endpoint with vLLM's exporter (same protocol:
    ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, grpc unless set)."""
    # deferred: OpenTelemetry's SDK and vLLM's exporter load only where tracing is on
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from vllm.tracing.otel import get_span_exporter

    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name,
                                                        "service.version": __version__}))
    provider.add_span_processor(BatchSpanProcessor(get_span_exporter(endpoint)))
    return provider
