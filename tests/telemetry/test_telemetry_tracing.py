"""Traces: the switch, configuration from OTEL_*, span structure, sampling, faults, a real OTLP export."""

import gzip
import http.server
import os
import threading

import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision, ParentBased, Sampler, SamplingResult
from telemetry_workload import MODEL, Workload, in_memory_tracing

from growpage import catalog
from growpage.errors import ConfigError
from growpage.telemetry import TelemetryAgent, configure_tracing, tracing, tracing_enabled
from support.factories import make_manager


class EventLog:
    """A second StatsListener: what the core told every listener, to compare the spans against."""

    def __init__(self):
        self.admits, self.decisions, self.finishes = [], [], []

    def on_admit(self, event):
        self.admits.append(event)

    def on_decision(self, event):
        self.decisions.append(event)

    def on_finish(self, event):
        self.finishes.append(event)


class EveryOtherRoot(Sampler):
    """Samples every other new trace: a deterministic stand-in for a ratio sampler."""

    def __init__(self):
        self.count = 0

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None,
                      trace_state=None):
        self.count += 1
        decision = Decision.RECORD_AND_SAMPLE if self.count % 2 else Decision.DROP
        return SamplingResult(decision, attributes)

    def get_description(self):
        return "EveryOtherRoot"


@pytest.fixture
def clean_env(monkeypatch):
    for name in [*(n for n in os.environ if n.startswith("OTEL_")), "GROWPAGE_TRACING"]:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(("environ", "enabled"), [
    ({}, False),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "none"}, False),
    ({"GROWPAGE_TRACING": "1"}, True),
    ({"GROWPAGE_TRACING": "true", "OTEL_TRACES_EXPORTER": "none"}, False),
    ({"GROWPAGE_TRACING": "0", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ({"OTEL_SDK_DISABLED": "true", "GROWPAGE_TRACING": "1"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),  # an endpoint alone asks nothing
])
def test_tracing_is_off_unless_asked_for(environ, enabled):
    assert tracing_enabled(environ) is enabled


def test_configure_tracing_reads_the_standard_variables(clean_env):
    assert configure_tracing() is None
    clean_env.setenv("GROWPAGE_TRACING", "1")
    clean_env.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    clean_env.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    provider = configure_tracing()
    assert provider.sampler.get_description() == "TraceIdRatioBased{0.25}"
    assert provider.resource.attributes["service.name"] == "growpage"
    provider.shutdown()
    clean_env.setenv("OTEL_SERVICE_NAME", "vllm-growpage")
    provider = configure_tracing()
    assert provider.resource.attributes["service.name"] == "vllm-growpage"
    provider.shutdown()


@pytest.mark.parametrize(("name", "value", "hint"), [
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf"),
    ("OTEL_TRACES_EXPORTER", "jaeger", "use 'otlp'"),
])
def test_an_unsupported_exporter_fails_at_start_with_the_fix(clean_env, name, value, hint):
    clean_env.setenv("GROWPAGE_TRACING", "1")
    clean_env.setenv(name, value)
    with pytest.raises(ConfigError, match=hint):
        configure_tracing()


def spans_named(exporter, name):
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_one_request_span_per_admission_with_decisions_and_sampled_children(traced, manager):
    agent, exporter = traced
    log = EventLog()
    manager.stats.add_listener(log)
    Workload(manager).run(15)
    requests = spans_named(exporter, catalog.SPAN_REQUEST)
    assert len(requests) == len(log.admits) >= 15
    assert agent.request_tracer.num_open_spans == 0
    by_id = {span.context.span_id: span for span in requests}
    for span in requests:
        assert span.parent is None
        assert span.attributes["gen_ai.request.model"] == MODEL
        assert span.attributes["gen_ai.usage.input_tokens"] >= 1
        assert span.attributes["growpage.request.id"].startswith("req-")
        assert span.attributes["growpage.finish_reason"] in ("finished", "preempted")
        assert span.start_time <= span.end_time
    events = [event for span in requests for event in span.events]
    assert len(events) == len(log.decisions) > 0
    assert {event.name for event in events} == {catalog.EVENT_DECISION}
    def key(kind, before, after, bytes_in, bytes_out, density, entropy, enforced):
        return (kind, before, after, bytes_in, bytes_out, round(density, 6), round(entropy, 4), enforced)

    assert sorted(key(*(e.attributes[name] for name in (
        "growpage.decision.kind", "growpage.pages_before", "growpage.pages_after", "growpage.bytes_in",
        "growpage.bytes_out", "growpage.sts_density", "growpage.lts_entropy",
        "growpage.decision.enforced"))) for e in events) == sorted(
        key(d.kind, d.pages_before, d.pages_after, d.bytes_in, d.bytes_out, d.sts_density,
            d.lts_entropy, d.enforced) for d in log.decisions)
    refused = sum(1 for e in events if "growpage.decision.refusal" in e.attributes)
    assert refused == sum(1 for d in log.decisions if d.refusal)
    compress = spans_named(exporter, catalog.SPAN_COMPRESS)
    allocate = spans_named(exporter, catalog.SPAN_ALLOCATE)
    enforced = [d.kind for d in log.decisions if d.enforced]
    assert len(compress) == enforced.count("quantize") + enforced.count("evict") > 0
    assert len(allocate) == len(log.admits) + enforced.count("allocate")
    for child in compress + allocate:
        parent = by_id[child.parent.span_id]
        assert child.context.trace_id == parent.context.trace_id
        assert parent.start_time <= child.start_time <= child.end_time <= parent.end_time
    for child in compress:
        assert child.attributes["growpage.bytes_in"] > child.attributes["growpage.bytes_out"]


def test_unsampled_requests_cost_no_span_and_no_attribute_work(manager, monkeypatch):
    def must_not_run(event):
        raise AssertionError("attributes computed for a span that is not recording")

    monkeypatch.setattr(tracing, "_decision_attributes", must_not_run)
    provider, exporter = in_memory_tracing(ALWAYS_OFF)
    agent = TelemetryAgent(manager, model=MODEL, tracer_provider=provider)
    Workload(manager).run(10)
    agent.poll()
    assert exporter.get_finished_spans() == ()
    assert agent.request_tracer.num_open_spans == 0
    assert agent.agent_errors()["tracing"] == 0
    agent.close()


def test_children_only_under_sampled_request_spans(manager):
    provider, exporter = in_memory_tracing(ParentBased(root=EveryOtherRoot()))
    agent = TelemetryAgent(manager, model=MODEL, tracer_provider=provider)
    log = EventLog()
    manager.stats.add_listener(log)
    Workload(manager).run(12)
    requests = spans_named(exporter, catalog.SPAN_REQUEST)
    assert len(requests) == (len(log.admits) + 1) // 2
    sampled = {span.context.span_id for span in requests}
    children = spans_named(exporter, catalog.SPAN_COMPRESS) + spans_named(exporter, catalog.SPAN_ALLOCATE)
    assert children and all(child.parent.span_id in sampled for child in children)
    agent.close()


def test_a_request_span_continues_the_engines_trace(manager):
    provider, exporter = in_memory_tracing()
    remote = trace.SpanContext(trace_id=0x1234, span_id=0x99, is_remote=True,
                               trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
    context = trace.set_span_in_context(trace.NonRecordingSpan(remote))
    agent = TelemetryAgent(manager, model=MODEL, tracer_provider=provider,
                           parent_context=lambda request_id: context)
    manager.admit("r", 3)
    manager.release("r")
    [span] = spans_named(exporter, catalog.SPAN_REQUEST)
    assert span.context.trace_id == 0x1234 and span.parent.span_id == 0x99
    agent.close()


def test_a_tracer_fault_is_counted_and_the_engine_goes_on(traced, manager, monkeypatch):
    agent, _ = traced
    log = EventLog()
    manager.stats.add_listener(log)

    def broken(event):
        raise RuntimeError("injected")

    monkeypatch.setattr(tracing, "_decision_attributes", broken)
    Workload(manager).run(10)
    agent.poll()
    errors = agent.agent_errors()
    assert errors["tracing"] == len(log.decisions) > 0  # every sampled decision failed, was counted
    assert errors["listener"] == 0  # contained in the tracer, never raised into the core
    assert manager.stats.requests_finished_total["finished"] == 10
    assert agent.request_tracer.num_open_spans == 0


class OTLPReceiver(http.server.ThreadingHTTPServer):
    """A minimal OTLP/HTTP trace receiver on loopback: decodes every export request it gets."""

    def __init__(self):
        self.exports: list[tuple[str, str, ExportTraceServiceRequest]] = []
        super().__init__(("127.0.0.1", 0), _OTLPHandler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _OTLPHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.exports.append((self.path, self.headers.get("Content-Type"), request))
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format, *args):
        pass


def test_spans_arrive_at_a_real_otlp_http_receiver(clean_env):
    receiver = OTLPReceiver()
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    try:
        clean_env.setenv("OTEL_TRACES_EXPORTER", "otlp")
        clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        clean_env.setenv("OTEL_SERVICE_NAME", "growpage-test")
        clean_env.setenv("OTEL_TRACES_SAMPLER", "always_on")
        manager = make_manager(num_pages=32, kv_dtype="float16")
        agent = TelemetryAgent.from_env(manager, model=MODEL)
        log = EventLog()
        manager.stats.add_listener(log)
        Workload(manager).run(6)
        agent.close()  # shuts the batch processor down: everything is flushed
    finally:
        receiver.shutdown()
        receiver.server_close()
    assert receiver.exports
    assert {(path, content_type) for path, content_type, _ in receiver.exports} == {
        ("/v1/traces", "application/x-protobuf")}
    spans, services = [], set()
    for _, _, request in receiver.exports:
        for resource_spans in request.resource_spans:
            services |= {a.value.string_value for a in resource_spans.resource.attributes
                         if a.key == "service.name"}
            for scope_spans in resource_spans.scope_spans:
                assert scope_spans.scope.name == "growpage"
                spans.extend(scope_spans.spans)
    assert services == {"growpage-test"}
    requests = [span for span in spans if span.name == catalog.SPAN_REQUEST]
    assert len(requests) == len(log.admits)
    request_ids = {span.span_id for span in requests}
    children = [span for span in spans if span.name in (catalog.SPAN_COMPRESS, catalog.SPAN_ALLOCATE)]
    assert children and all(child.parent_span_id in request_ids for child in children)
    models = {a.value.string_value for span in requests for a in span.attributes
              if a.key == "gen_ai.request.model"}
    assert models == {MODEL}
    assert sum(len(span.events) for span in requests) == len(log.decisions)
