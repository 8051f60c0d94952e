"""Joining vLLM's traces without an engine: both processes derive the llm_request span's id."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from growpage.vllm_plugin import trace_join

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
HEADERS = {"traceparent": f"00-{TRACE_ID:032x}-00f067aa0ba902b7-01"}


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_the_derived_span_id_is_the_same_on_both_sides_and_differs_per_request():
    first = trace_join.request_span_id(TRACE_ID, "req-1")
    assert first == trace_join.request_span_id(TRACE_ID, "req-1") and first != 0
    assert first != trace_join.request_span_id(TRACE_ID, "req-2")
    assert first != trace_join.request_span_id(TRACE_ID + 1, "req-1")


def test_a_pinned_id_goes_to_the_next_span_only_even_from_a_tracer_made_before_the_pin():
    provider, exporter = _provider()
    tracer = provider.get_tracer("test")  # the SDK caches tracers: vLLM's may predate the first request
    trace_join.pin_span_ids()
    token = trace_join._PINNED_SPAN_ID.set(0x1234)
    try:
        with tracer.start_as_current_span("llm_request"):
            with tracer.start_as_current_span("child"):
                pass
    finally:
        trace_join._PINNED_SPAN_ID.reset(token)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["llm_request"].context.span_id == 0x1234
    assert spans["child"].context.span_id != 0x1234  # the child of the pinned span has its own id


def test_growpage_spans_name_vllms_request_span_as_parent_in_the_clients_trace():
    provider, exporter = _provider()
    vllm_side = provider.get_tracer("vllm")
    trace_join.pin_span_ids()  # what the front-end hook does around vLLM's do_tracing
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    token = trace_join._PINNED_SPAN_ID.set(trace_join.request_span_id(TRACE_ID, "req-1"))
    try:
        vllm_side.start_span("llm_request", context=TraceContextTextMapPropagator().extract(HEADERS)).end()
    finally:
        trace_join._PINNED_SPAN_ID.reset(token)
    # what the scheduler agent does, in another process
    growpage_side = provider.get_tracer("growpage")
    assert [s.context.span_id for s in exporter.get_finished_spans()] == [
        trace_join.request_span_id(TRACE_ID, "req-1")]
    growpage_side.start_span("growpage.request", context=trace_join.parent_context_for(HEADERS, "req-1")).end()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    request, ours = spans["llm_request"], spans["growpage.request"]
    assert request.context.trace_id == ours.context.trace_id == TRACE_ID
    assert ours.parent is not None and ours.parent.span_id == request.context.span_id
    assert request.parent is not None and request.parent.span_id == 0x00F067AA0BA902B7  # the client's span


def test_requests_without_trace_headers_are_roots_of_their_own():
    assert trace_join.parent_context_for(None, "r") is None
    assert trace_join.parent_context_for({"traceparent": "garbage"}, "r") is None
