"""A real Prometheus scrapes the standalone exporter of a live core: every contract metric arrives
with its type, and the values and exemplars are what an SRE's queries expect."""

import threading
import time

import pytest
from telemetry_workload import MODEL, Workload, in_memory_tracing

from growpage import catalog
from growpage.telemetry import TelemetryAgent
from support.factories import make_manager
from support.metric_families import assert_metadata
from support.promstack import http_get_json, run_prometheus, wait_until

JOB = {"job": catalog.SCRAPE_JOB}


@pytest.fixture
def live_engine():
    """A core serving requests in a background thread (its engine loop), traced, with an exporter."""
    manager = make_manager(num_pages=32, kv_dtype="float16")
    provider, spans = in_memory_tracing()
    agent = TelemetryAgent(manager, model=MODEL, engine="reference", engine_version="test",
                           poll_interval_s=0.2, clock=time.monotonic, tracer_provider=provider)
    manager.stats.set_component_state("observer", "active")  # as the vLLM plugin reports them
    manager.stats.set_component_state("enforcer", "active")
    exporter = agent.serve(port=0, host="127.0.0.1")
    stop = threading.Event()
    workload = Workload(manager)

    def engine_loop():  # steady traffic until the test is done
        workload.run(100_000, on_step=agent.on_step, stop=stop)
        agent.poll()

    thread = threading.Thread(target=engine_loop, name="engine", daemon=True)
    thread.start()
    yield agent, exporter, spans
    stop.set()
    thread.join(timeout=30)
    agent.close()
    provider.shutdown()


def selector(name: str) -> str:
    return f'{name}{{job="{catalog.SCRAPE_JOB}"}}'


def test_prometheus_scrapes_every_contract_metric_from_a_live_engine(live_engine, tmp_path):
    agent, exporter, spans = live_engine
    scrape = {"job_name": catalog.SCRAPE_JOB, "metrics_path": catalog.METRICS_PATH,
              "scrape_interval": "500ms", "scrape_timeout": "400ms",
              "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]}
    with run_prometheus(tmp_path, [scrape], extra_args=["--enable-feature=exemplar-storage"]) as prom:
        wait_until(prom.targets_up, 20, what="the exporter's target to be up")
        # Several scrapes, and a compression seen, before judging the values.
        # No sample yet reads as None: count it as zero scrapes, not a TypeError.
        wait_until(lambda: (prom.query_value(
            f"count_over_time({selector(catalog.ALLOCATIONS.name)}[1m])") or 0) >= 4, 30, what="4 scrapes")
        wait_until(lambda: prom.query(selector(catalog.INTRA_PAGE_COMPRESS_RATIO.name)), 30,
                   what="a compression")
        assert_every_series_with_its_labels_and_metadata(prom)
        assert_values_an_sre_expects(prom)
        assert_exemplars_name_exported_spans(prom, spans)


def assert_every_series_with_its_labels_and_metadata(prom):
    """Every contract series is present, with the model label and only the contract's labels."""
    for spec in catalog.METRICS:
        for name in spec.series_names:
            result = prom.query(selector(name))
            assert result, f"{name} is missing from Prometheus"
            for series in result:
                labels = set(series["metric"]) - {"__name__", "job", "instance"}
                bucket = {"le"} if name.endswith("_bucket") else set()
                expected = {catalog.MODEL_LABEL, *spec.exported_labels} | bucket
                assert labels == expected, (name, series["metric"])
                assert series["metric"][catalog.MODEL_LABEL] == MODEL
        assert_metadata(prom, spec)


def assert_values_an_sre_expects(prom):
    def value(expr):
        result = prom.query_value(expr)
        assert result is not None, expr
        return result

    assert 0.0 <= value(selector(catalog.UTILIZATION.name)) <= 1.0
    assert 0.0 <= value(selector(catalog.FRAGMENTATION.name)) <= 1.0
    assert value(selector(catalog.COMPRESSION_RATIO.name)) >= 1.0
    assert value(selector(catalog.INTRA_PAGE_COMPRESS_RATIO.name)) > 1.0
    assert value(f"sum({selector(catalog.POOL_PAGES.name)})") == 32
    assert value(f"max_over_time({selector(catalog.REQUESTS_RUNNING.name)}[1m])") > 0
    assert value(f"max_over_time({selector(catalog.DEMAND_P95.name)}[1m])") >= 4  # base_pages
    assert value(f"increase({selector(catalog.ALLOCATIONS.name)}[1m])") > 0
    assert value(f"sum({selector(catalog.DECISIONS.name)})") > 0
    assert value(f'{catalog.DECISIONS.name}{{decision="denied"}}') > 0
    assert value(f"{selector(catalog.COMPRESS_INPUT_BYTES.name)} - "
                 f"{selector(catalog.COMPRESS_OUTPUT_BYTES.name)}") > 0
    assert value(f"sum({selector(catalog.AGENT_ERRORS.name)})") == 0
    assert value(f'{selector(catalog.BUILD_INFO.name)[:-1]},device="cpu",mode="enforce"}}') == 1
    # The SLO's query: p99 of page grants, a number (not NaN) from real buckets.
    p99 = value("histogram_quantile(0.99, sum by (le) (rate("
                f"{catalog.ALLOCATION_LATENCY.name}_bucket[30s])))")
    assert 0 < p99 <= catalog.ALLOCATION_LATENCY.buckets[-1]
    assert value(f"{catalog.LTS_ENTROPY.name}_count") > 0
    assert value(f"{catalog.STS_DENSITY.name}_count") > 0


def assert_exemplars_name_exported_spans(prom, spans):
    """Exemplars travelled with the OpenMetrics scrape and name spans the tracer exported."""
    now = time.time()
    exemplars = wait_until(lambda: http_get_json(
        f"{prom.url}/api/v1/query_exemplars?query={catalog.ALLOCATION_LATENCY.name}_bucket"
        f"&start={now - 120}&end={now + 5}")["data"], 20, what="exemplars")
    trace_ids = {format(s.context.trace_id, "032x") for s in spans.get_finished_spans()}
    linked = [e["labels"]["trace_id"] for series in exemplars for e in series["exemplars"]]
    assert linked and set(linked) <= trace_ids
