"""The collector against the contract: exact families, plausible values, faults, promtool, cardinality."""

import math

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from telemetry_workload import MODEL, Workload, in_memory_tracing

from growpage import __version__, catalog
from growpage.telemetry import TelemetryAgent, collector
from growpage.telemetry.collector import exposition_unit
from support.factories import make_manager
from support.metric_families import PROMETHEUS_TYPE, family_name
from support.promstack import run_tool


def scrape(agent, accept=None) -> dict:
    text = agent.render(accept).body.decode()
    parse = parse_openmetrics if accept else text_string_to_metric_families
    return {family.name: family for family in parse(text)}


def value(families, spec, **labels) -> float:
    samples = [s for s in families[family_name(spec)].samples
               if s.name == spec.name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(samples) == 1, (spec.name, labels, samples)
    return samples[0].value


def test_exposition_matches_the_catalog_exactly(agent, manager):
    Workload(manager).run(20)
    manager.stats.set_component_state("scheduler", "active")  # what the vLLM home's scheduler agent reports
    manager.stats.set_component_state("observer", "active")
    manager.stats.set_component_state("enforcer", "full_cudagraph")
    agent.poll()
    families = scrape(agent)
    assert set(families) == {family_name(spec) for spec in catalog.METRICS}
    for spec in catalog.METRICS:
        family = families[family_name(spec)]
        assert family.type == PROMETHEUS_TYPE[spec.type], spec.name
        assert family.documentation == spec.help
        assert {sample.name for sample in family.samples} == set(spec.series_names), spec.name
        for sample in family.samples:
            bucket = {"le"} if sample.name.endswith("_bucket") else set()
            expected = {catalog.MODEL_LABEL, *spec.exported_labels} | bucket
            assert set(sample.labels) == expected, sample
            assert sample.labels[catalog.MODEL_LABEL] == MODEL
        if spec.type is catalog.MetricType.HISTOGRAM:
            bounds = [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")]
            assert bounds == [*spec.buckets, math.inf], spec.name
        for label, allowed in spec.label_values.items():
            assert {sample.labels[label] for sample in family.samples} == set(allowed), spec.name


def test_openmetrics_units_follow_the_catalog_where_the_name_allows(agent):
    families = scrape(agent, "application/openmetrics-text; version=1.0.0")
    for spec in catalog.METRICS:
        assert families[family_name(spec)].unit == exposition_unit(spec)
    assert families["growpage_page_allocation_latency_seconds"].unit == "seconds"
    assert families["growpage_compress_input_bytes"].unit == "bytes"


def test_build_info_says_what_diagnose_must_not_guess(agent, manager):
    families = scrape(agent)
    [sample] = families[catalog.BUILD_INFO.name].samples
    assert sample.value == 1.0
    # home/home_version, not engine: vLLM's own series carry an `engine` label of their own.
    assert sample.labels == {"model_name": MODEL, "version": __version__, "home": "reference",
                             "home_version": "test", "mode": "enforce", "block_size": "4",
                             "base_pages": "4", "device": "cpu"}


def test_values_after_a_driven_workload_are_plausible(agent, manager):
    scrapes = []

    def poll_and_scrape():
        agent.poll()
        scrapes.append(scrape(agent))

    workload = Workload(manager)
    workload.run(40, on_step=lambda: workload.num_steps % 25 == 0 and poll_and_scrape())
    poll_and_scrape()
    assert len(scrapes) >= 4
    allocations = [value(f, catalog.ALLOCATIONS) for f in scrapes]
    assert allocations == sorted(allocations) and allocations[-1] > allocations[0]
    for families in scrapes:
        assert 0.0 <= value(families, catalog.UTILIZATION) <= 1.0
        assert 0.0 <= value(families, catalog.FRAGMENTATION) <= 1.0
        assert value(families, catalog.COMPRESSION_RATIO) > 0.0  # not >= 1: see the Prometheus test
        pool = [value(families, catalog.POOL_PAGES, state=state) for state in catalog.POOL_STATES]
        assert sum(pool) == manager.pool.num_pages
        assert 0 <= value(families, catalog.REQUESTS_RUNNING) <= 8
    busy = [f for f in scrapes if value(f, catalog.REQUESTS_RUNNING) > 0]
    assert busy and all(value(f, catalog.UTILIZATION) > 0 for f in busy)
    assert all(value(f, catalog.DEMAND_P95) >= manager.config.base_pages for f in busy)
    last = scrapes[-1]
    for kind in catalog.DECISION_KINDS:  # by kind, exactly what the core counted
        assert value(last, catalog.DECISIONS, decision=kind) == manager.stats.decisions_total[kind]
    assert value(last, catalog.DECISIONS, decision="quantize") > 0
    assert value(last, catalog.DECISIONS, decision="evict") > 0
    assert value(last, catalog.DECISIONS, decision="denied") > 0
    bytes_in = value(last, catalog.COMPRESS_INPUT_BYTES)
    bytes_out = value(last, catalog.COMPRESS_OUTPUT_BYTES)
    assert bytes_in > bytes_out > 0
    assert value(last, catalog.INTRA_PAGE_COMPRESS_RATIO) > 1.0
    finished = manager.stats.requests_finished_total["finished"]
    assert finished == 40
    tokens_count = [s.value for s in last[catalog.REQUEST_TOKENS.name].samples
                    if s.name == catalog.REQUEST_TOKENS.name + "_count"]
    assert tokens_count == [40.0]
    latency_count = [s.value for s in last[catalog.ALLOCATION_LATENCY.name].samples
                     if s.name == catalog.ALLOCATION_LATENCY.name + "_count"]
    assert latency_count[0] >= 40  # one admission grant each, plus growth pages


def test_a_collector_fault_costs_one_family_and_is_counted(agent, manager, monkeypatch, caplog):
    def broken(view):
        raise RuntimeError("injected")

    monkeypatch.setitem(collector.SAMPLE_READERS, catalog.UTILIZATION.name, broken)
    first = scrape(agent)
    assert catalog.UTILIZATION.name not in first
    assert set(first) == {family_name(s) for s in catalog.METRICS} - {catalog.UTILIZATION.name}
    assert value(first, catalog.AGENT_ERRORS, component="collector") == 1.0
    second = scrape(agent)
    assert value(second, catalog.AGENT_ERRORS, component="collector") == 2.0
    assert sum("injected" in record.exc_text for record in caplog.records if record.exc_text) == 1


def test_a_failing_snapshot_is_counted_and_the_last_state_is_served(agent, manager, monkeypatch):
    Workload(manager).run(5)
    agent.poll()
    before = value(scrape(agent), catalog.ALLOCATIONS)

    def broken():
        raise RuntimeError("injected")

    monkeypatch.setattr(manager, "make_stats", broken)
    agent.poll()
    families = scrape(agent)
    assert value(families, catalog.ALLOCATIONS) == before
    assert value(families, catalog.AGENT_ERRORS, component="collector") == 1.0


def test_agent_errors_carry_the_cores_components(agent, manager):
    manager.stats.record_error("actuator")
    agent.poll()
    assert value(scrape(agent), catalog.AGENT_ERRORS, component="actuator") == 1.0


def test_promtool_finds_no_problem_in_the_exposition(agent, manager, tmp_path):
    Workload(manager).run(10)
    agent.poll()
    text = agent.render().body.decode()
    result = run_tool("promtool", "check", "metrics", input_text=text, check=False)
    problems = (result.stdout + result.stderr).strip()
    assert result.returncode == 0 and not problems, problems


def series(families) -> set:
    return {(sample.name, tuple(sorted(sample.labels.items())))
            for family in families.values() for sample in family.samples}


def test_series_do_not_grow_with_the_number_of_requests():
    # Small grants so short requests cross page boundaries (decisions, compressions) quickly.
    manager = make_manager(num_pages=48, kv_dtype="float16", block_size=2, base_pages=2, sink_tokens=1,
                           recent_window_tokens=1)
    provider, exporter = in_memory_tracing()  # request ids must go to spans, never to labels
    agent = TelemetryAgent(manager, model=MODEL, tracer_provider=provider)
    workload = Workload(manager)
    workload.run(100, prompt_tokens=(1, 3), decode_steps=(1, 5), max_batch=16)
    agent.poll()
    after_100 = series(scrape(agent))
    assert manager.stats.decisions_total["evict"] > 0  # the label sets seen include compressions
    workload.run(900, prompt_tokens=(1, 3), decode_steps=(1, 5), max_batch=16)
    agent.poll()
    after_1000 = series(scrape(agent))
    assert manager.stats.requests_finished_total["finished"] == 1000
    assert after_1000 == after_100
    assert not any("req-" in value for _, labels in after_1000 for _, value in labels)
    span_ids = {span.attributes.get("growpage.request.id") for span in exporter.get_finished_spans()}
    assert "req-999" in span_ids
    agent.close()
    provider.shutdown()


def test_two_scrapers_read_the_same_compress_ratio_over_the_agents_window(agent, manager):
    # An HA pair of Prometheus (or one curl between their scrapes) must not split the compressions
    # between them: the ratio is computed when the agent polls, over its fixed window.
    manager.stats.record_compression(1970, 1000)
    agent.poll()
    manager.stats.record_compression(4000, 1000)
    agent.poll()
    replica_a, curl, replica_b = scrape(agent), scrape(agent), scrape(agent)
    true_ratio = (1970 + 4000) / 2000
    for families in (replica_a, curl, replica_b):
        assert value(families, catalog.INTRA_PAGE_COMPRESS_RATIO) == true_ratio


def test_numerators_and_denominators_let_every_ratio_aggregate(agent, manager):
    workload = Workload(manager)
    workload.run(6, on_step=lambda: workload.num_steps == 12 and agent.poll())
    families = scrape(agent)
    live, granted = value(families, catalog.LIVE_TOKENS), value(families, catalog.GRANTED_TOKEN_SLOTS)
    used = value(families, catalog.USED_TOKEN_SLOTS)
    assert granted >= used >= live
    assert value(families, catalog.UTILIZATION) == (live / granted if granted else 0.0)
    assert value(families, catalog.FRAGMENTATION) == (1 - live / used if used else 0.0)
    stored = value(families, catalog.STORED_BYTES)
    assert value(families, catalog.COMPRESSION_RATIO) == (value(families, catalog.LOGICAL_BYTES) / stored
                                                          if stored else 1.0)
    # Demand: a gauge histogram whose +Inf bucket counts the running requests.
    buckets = {s.labels["pages_le"]: s.value for s in families[catalog.DEMAND_REQUESTS.name].samples}
    assert buckets["+Inf"] == value(families, catalog.REQUESTS_RUNNING)
    assert list(buckets.values()) == sorted(buckets.values())
    assert value(families, catalog.SAMPLES_DROPPED) == 0


def test_demand_buckets_are_cumulative_and_end_at_inf():
    buckets = dict(collector.demand_buckets([1.0, 3.0, 3.0, 5000.0]))
    assert (buckets["1.0"], buckets["2.0"], buckets["4.0"], buckets["4096.0"], buckets["+Inf"]) == (1, 1, 3, 3, 4)


def test_demand_p95_is_zero_with_nothing_running(manager):
    gauges = manager.make_stats().gauges
    assert gauges.capacity_boundaries == ()  # nothing admitted yet
    assert collector.demand_p95(gauges) == 0.0


def test_agent_active_says_which_component_runs_and_why_not(agent, manager):
    manager.stats.set_component_state("observer", "active")
    manager.stats.set_component_state("enforcer", "Full CUDA graph!")  # a free-text reason stays bounded
    agent.poll()
    families = scrape(agent)
    states = {s.labels["component"]: (s.labels["reason"], s.value)
              for s in families[catalog.AGENT_ACTIVE.name].samples}
    assert states == {"observer": ("active", 1.0), "enforcer": ("full_cuda_graph", 0.0)}
