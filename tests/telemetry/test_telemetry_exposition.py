"""Serving: Accept negotiation, exemplars linked to sampled traces, a host route, the standalone port."""

import urllib.error
import urllib.request

import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from fastapi.testclient import TestClient
from opentelemetry import trace
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from telemetry_workload import MODEL, Workload

from growpage import catalog
from growpage.telemetry import add_metrics_route

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
# What Prometheus 2.42 sends when it scrapes.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
                     "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def latency_buckets(text: str):
    for family in parse_openmetrics(text):
        if family.name == catalog.ALLOCATION_LATENCY.name:
            return [s for s in family.samples if s.name.endswith("_bucket")]
    raise AssertionError("latency histogram missing")


def test_text_format_by_default(agent):
    for accept in (None, "", "text/plain", "*/*"):
        body, content_type = agent.render(accept)  # what a host route hands back
        assert content_type == "text/plain; version=0.0.4; charset=utf-8"
        assert list(text_string_to_metric_families(body.decode()))
        assert b"# EOF" not in body


@pytest.mark.parametrize("accept", [OPENMETRICS, PROMETHEUS_ACCEPT])
def test_openmetrics_with_exemplars_linking_sampled_grants_to_their_traces(traced, manager, accept):
    agent, exporter = traced
    Workload(manager).run(10)
    agent.poll()
    rendered = agent.render(accept)
    assert rendered.content_type.startswith("application/openmetrics-text; version=1.0.0")
    text = rendered.body.decode()
    assert text.endswith("# EOF\n")
    allocate_spans = {(trace.format_trace_id(s.context.trace_id), trace.format_span_id(s.context.span_id)): s
                      for s in exporter.get_finished_spans() if s.name == catalog.SPAN_ALLOCATE}
    exemplars = 0
    lower = float("-inf")
    for bucket in latency_buckets(text):
        upper = float(bucket.labels["le"])
        if bucket.exemplar is not None:
            exemplars += 1
            key = (bucket.exemplar.labels["trace_id"], bucket.exemplar.labels["span_id"])
            span = allocate_spans[key]  # a real, exported span of a sampled grant
            assert span.attributes["growpage.allocation.phase"] == "admission"
            assert lower < bucket.exemplar.value <= upper
        lower = upper
    assert exemplars >= 1
    # the other families carry none
    assert sum(1 for line in text.splitlines() if " # {" in line) == exemplars


def test_no_exemplar_before_its_grant_is_counted(traced, manager):
    agent, _ = traced
    manager.admit("r", 3)  # the tracer sees the grant now; the histogram at the next poll
    assert all(b.exemplar is None for b in latency_buckets(agent.render(OPENMETRICS).body.decode()))
    agent.poll()
    assert any(b.exemplar is not None for b in latency_buckets(agent.render(OPENMETRICS).body.decode()))


def test_text_format_never_carries_exemplars(traced, manager):
    agent, _ = traced
    Workload(manager).run(3)
    agent.poll()
    assert b" # {" not in agent.render().body


def test_host_route_wins_over_a_metrics_mount_and_negotiates(agent):
    app = FastAPI()
    # Like vLLM: its own registry mounted at /metrics, whose pattern also matches /metrics/growpage.
    app.mount("/metrics", PlainTextResponse("vllm:num_requests_running 0\n"))
    add_metrics_route(app, agent.registry)
    client = TestClient(app)
    response = client.get(catalog.METRICS_PATH)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert f'growpage_kv_page_utilization{{model_name="{MODEL}"}}' in response.text
    response = client.get(catalog.METRICS_PATH, headers={"Accept": OPENMETRICS})
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n")
    assert "vllm:" in client.get("/metrics").text  # the host's own metrics are untouched


def get(url: str, accept: str | None = None):
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 (loopback)
        return response.status, response.headers["Content-Type"], response.read().decode()


def test_standalone_exporter_serves_the_contract_path_only(agent):
    exporter = agent.serve(port=0, host="127.0.0.1")
    assert agent.serve() is exporter  # one per agent
    status, content_type, body = get(exporter.url)
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    assert {f.name for f in text_string_to_metric_families(body)} >= {catalog.UTILIZATION.name}
    status, content_type, body = get(exporter.url, PROMETHEUS_ACCEPT)
    assert content_type.startswith("application/openmetrics-text") and body.endswith("# EOF\n")
    for path in ("/", "/metrics"):
        with pytest.raises(urllib.error.HTTPError) as error:
            get(f"http://127.0.0.1:{exporter.port}{path}")
        assert error.value.code == 404
    agent.close()
    with pytest.raises(urllib.error.URLError):
        get(exporter.url)
