"""Debian's Prometheus scrapes the live reference engine (``build_stack``: the real model serving real
requests over HTTP) at ``/metrics/growpage``: every contract metric arrives with its type and
plausible values, and ``promtool`` accepts the live exposition.

GrowPage enforces with a small grant (``base_pages=2``, 32 token slots) and requests of ~60 tokens
(``ignore_eos``), so each request crosses its capacity boundary and compresses: the compress-ratio
gauge exists only after a compression.
"""

from __future__ import annotations

import time

import pytest

from growpage import __version__, catalog
from growpage.config import GrowPageConfig
from support.live_agent import drive_load, run_live_agent, scrape_config
from support.metric_families import assert_metadata
from support.promstack import run_prometheus, run_tool, wait_until

BASE_PAGES, BLOCK_SIZE, NUM_PAGES = 2, 16, 400
NUM_REQUESTS, MAX_TOKENS = 4, 48
# The only labels a series may carry besides the contract's: what the scrape adds.
SCRAPE_LABELS = {"__name__", "job", "instance"}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def scraped(llama_model, tokenizer, prepared_model_dir, tmp_path_factory):
    """Prometheus (1 s scrapes) watching the live engine serve ``NUM_REQUESTS`` requests.

    Yields ``(agent, prometheus, before_s, after_s, load)``: ``before_s`` is an instant after the
    first scrape and before any request, ``after_s`` one after every request finished and was scraped.
    """
    config = GrowPageConfig(mode="enforce", base_pages=BASE_PAGES, block_size=BLOCK_SIZE, sink_tokens=4,
                            recent_window_tokens=12)  # sinks + recent window must fit in base_pages - 1
    with run_live_agent(config, model=llama_model, tokenizer=tokenizer, model_dir=prepared_model_dir,
                        num_pages=NUM_PAGES) as agent, \
            run_prometheus(tmp_path_factory.mktemp("prometheus"), [scrape_config(agent)]) as prometheus:
        wait_until(prometheus.targets_up, 20, what="the live agent's target to be up")
        wait_until(lambda: prometheus.query(catalog.ALLOCATIONS.name), 20, what="a first scrape")
        before_s = time.time()
        time.sleep(1.0)  # before_s lies strictly between two scrapes that both precede the load
        load = drive_load(agent.url, agent.model, num_requests=NUM_REQUESTS, concurrency=NUM_REQUESTS,
                          max_tokens=MAX_TOKENS, time_limit_s=90)
        assert load.num_ok == NUM_REQUESTS, load
        agent.wait_idle()
        # A scrape after the last request finished: its request-length sample is in Prometheus.
        wait_until(lambda: prometheus.query_value(f"{catalog.REQUEST_TOKENS.name}_count") == NUM_REQUESTS,
                   20, what="every finished request to be scraped")
        yield agent, prometheus, before_s, time.time(), load


def test_every_contract_metric_arrives_with_its_type_and_labels(scraped):
    agent, prometheus, _, _, _ = scraped
    for spec in catalog.METRICS:
        if spec is catalog.AGENT_ACTIVE:  # reported by the vLLM plugin's components, not this engine
            continue
        for name in spec.series_names:
            result = prometheus.query(f'{name}{{job="{catalog.SCRAPE_JOB}"}}')
            assert result, f"{name} is missing from Prometheus"
            for series in result:
                bucket = {"le"} if name.endswith("_bucket") else set()
                assert set(series["metric"]) - SCRAPE_LABELS == {catalog.MODEL_LABEL, *spec.exported_labels} | bucket, \
                    (name, series["metric"])
                assert series["metric"][catalog.MODEL_LABEL] == agent.model
        for label, values in spec.label_values.items():  # bounded sets: every value, from the start
            seen = {s["metric"][label] for s in prometheus.query(spec.name)}
            assert seen == set(values), (spec.name, label, seen)
        assert_metadata(prometheus, spec)


def test_values_are_what_the_served_requests_imply(scraped):
    agent, prometheus, before_s, after_s, load = scraped

    def value(expr: str, at: float | None = None) -> float:
        result = prometheus.query(expr, at=at)
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])

    window = f"[{int(after_s - before_s) + 5}s]"
    # Counters: nothing before the load, then what the requests did.
    assert value(catalog.ALLOCATIONS.name, at=before_s) == 0
    assert value(catalog.ALLOCATIONS.name, at=after_s) >= NUM_REQUESTS * BASE_PAGES
    decisions = {s["metric"]["decision"]: float(s["value"][1])
                 for s in prometheus.query(catalog.DECISIONS.name, at=after_s)}
    assert set(decisions) == set(catalog.DECISION_KINDS)
    assert decisions["allocate"] > 0 and decisions["quantize"] + decisions["evict"] > 0, decisions
    assert decisions["denied"] == decisions["preempt"] == 0, decisions  # 400 pages: never short
    assert value(catalog.OOM_EVENTS.name) == 0
    assert value(f"sum({catalog.AGENT_ERRORS.name})") == 0
    assert value(f"{catalog.COMPRESS_INPUT_BYTES.name} - {catalog.COMPRESS_OUTPUT_BYTES.name}") > 0

    # Gauges: ratios in range, pool pages add up, and the load was seen while it ran.
    for spec in (catalog.UTILIZATION, catalog.FRAGMENTATION):
        low, high = value(f"min_over_time({spec.name}{window})"), value(f"max_over_time({spec.name}{window})")
        assert 0.0 <= low <= high <= 1.0
    assert value(f"max_over_time({catalog.UTILIZATION.name}{window})") > 0.4  # requests fill their pages
    assert value(f"sum({catalog.POOL_PAGES.name})") == NUM_PAGES
    assert value(f'{catalog.POOL_PAGES.name}{{state="free"}}') == NUM_PAGES  # idle: every page back
    assert value(catalog.REQUESTS_RUNNING.name) == 0
    assert 1 <= value(f"max_over_time({catalog.REQUESTS_RUNNING.name}{window})") <= NUM_REQUESTS
    assert value(f"max_over_time({catalog.DEMAND_P95.name}{window})") >= BASE_PAGES
    assert value(catalog.COMPRESSION_RATIO.name) > 0
    # The gauge exists only once something was compressed; INT8 with scales stays under 2x, and
    # eviction (drops tokens, keeps no bytes for them) can go above.
    assert value(catalog.INTRA_PAGE_COMPRESS_RATIO.name) > 1.0

    # Histograms: one request-length and one entropy sample per finished request.
    assert value(f"{catalog.REQUEST_TOKENS.name}_count") == NUM_REQUESTS
    seen_tokens = value(f"{catalog.REQUEST_TOKENS.name}_sum")
    served_tokens = load.prompt_tokens + load.completion_tokens
    assert served_tokens - NUM_REQUESTS <= seen_tokens <= served_tokens, (seen_tokens, load)
    assert value(f"{catalog.LTS_ENTROPY.name}_count") == NUM_REQUESTS
    assert value(f"{catalog.STS_DENSITY.name}_count") > 0
    grants = value(f"{catalog.ALLOCATION_LATENCY.name}_count")
    assert grants >= NUM_REQUESTS  # one admission grant per request, plus growth pages
    assert value(f'{catalog.ALLOCATION_LATENCY.name}_bucket{{le="+Inf"}}') == grants
    p99 = value(f"histogram_quantile(0.99, sum by (le) (increase({catalog.ALLOCATION_LATENCY.name}_bucket{window})))")
    assert 0 < p99 <= catalog.ALLOCATION_LATENCY.buckets[-1]


def test_build_info_describes_the_running_deployment(scraped):
    agent, prometheus, _, _, _ = scraped
    [series] = prometheus.query(catalog.BUILD_INFO.name)
    labels = series["metric"]
    assert series["value"][1] == "1"
    assert {k: labels[k] for k in catalog.BUILD_INFO.exported_labels} == {
        "version": __version__, "home": "reference", "home_version": __version__, "mode": "enforce",
        "block_size": str(BLOCK_SIZE), "base_pages": str(BASE_PAGES), "device": "cpu"}
    assert labels[catalog.MODEL_LABEL] == agent.model


def test_promtool_accepts_the_live_exposition(scraped):
    agent, _, _, _, _ = scraped
    text = agent.scrape()
    assert "growpage_intra_page_compress_ratio" in text
    result = run_tool("promtool", "check", "metrics", input_text=text, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
