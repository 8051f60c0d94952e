"""Pure pieces of diagnose, without I/O: histogram math, parsing, the checks and the verdict."""

from __future__ import annotations

import dataclasses
import math

import pytest

from growpage import catalog
from growpage.diagnose import DiagnoseError, parse_duration_s, parse_time_s
from growpage.diagnose.checks import CHECKS, run_checks
from growpage.diagnose.checks.base import Thresholds, pct, pct_floor
from growpage.diagnose.checks.health import agent_health
from growpage.diagnose.checks.latency import allocation_latency, recommended_block_size
from growpage.diagnose.checks.oom import oom_fragmentation
from growpage.diagnose.checks.overgrant import over_granting, suggest_base_pages
from growpage.diagnose.checks.rollout import rollout
from growpage.diagnose.checks.slo import allocation_latency_slo, compress_ratio, utilization
from growpage.diagnose.checks.vllm import vllm_latency
from growpage.diagnose.exposition import parse_exposition, snapshot_time, with_snapshot_time
from growpage.diagnose.findings import Severity, Status, verdict, worst
from growpage.diagnose.observations import (
    BuildInfo,
    GaugeStats,
    HistogramCounts,
    Observations,
    Scope,
    ServiceErrorRatios,
    Window,
)
from growpage.diagnose.scrapes import build_scope, counter_increase, histogram_increase

T = Thresholds.from_catalog()
WINDOW = Window(1000.0, 1060.0, "snapshots", num_samples=2)
H100_BUILD = BuildInfo(mode="enforce", block_size=16, base_pages=128, device="NVIDIA H100 80GB HBM3")


def gauge(value: float, high: float | None = None) -> GaugeStats:
    return GaugeStats(mean=value, min=value, max=high if high is not None else value, last=value)


def histogram(bounds_counts: dict[float, float]) -> HistogramCounts:
    running, buckets = 0.0, []
    for bound in sorted(bounds_counts):
        running += bounds_counts[bound]
        buckets.append((bound, running))
    buckets.append((math.inf, running))
    return HistogramCounts(tuple(buckets))


# --- histogram math (histogram_quantile semantics) ---------------------------------------------

def test_fraction_on_a_bucket_bound_is_exact():
    latency = histogram({0.005: 90, 0.015: 9, 0.05: 1})
    assert latency.fraction_at_or_below(0.015) == pytest.approx(0.99)


def test_fraction_between_bounds_is_interpolated():
    latency = histogram({0.01: 50, 0.02: 50})
    assert latency.fraction_at_or_below(0.015) == pytest.approx(0.75)


def test_quantile_interpolates_inside_the_bucket_and_caps_at_the_top_bound():
    tokens = histogram({128: 10, 256: 30, 512: 40, 1024: 15, 2048: 5})
    assert tokens.quantile(0.5) == pytest.approx(256 + 256 * (50 - 40) / 40)
    overflow = HistogramCounts(((1.0, 0.0), (2.0, 1.0), (math.inf, 10.0)))
    assert overflow.quantile(0.99) == 2.0  # beyond the last finite bucket: its bound, like Prometheus


def test_empty_histogram_has_no_quantile_or_fraction():
    empty = histogram({0.01: 0})
    assert empty.quantile(0.99) is None and empty.fraction_at_or_below(0.015) is None


# --- parsing ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "seconds"), [("15s", 15), ("30m", 1800), ("1h30m", 5400), ("90", 90),
                                               ("1.5", 1.5), ("2m5s", 125)])
def test_parse_duration(text, seconds):
    assert parse_duration_s(text, "--since") == seconds


@pytest.mark.parametrize("text", ["", "abc", "10x", "0s", "-5"])
def test_parse_duration_rejects_with_a_hint(text):
    with pytest.raises(DiagnoseError, match="--since"):
        parse_duration_s(text, "--since")


def test_parse_time_accepts_unix_and_iso8601():
    assert parse_time_s("1714557600", "--at") == 1714557600
    assert parse_time_s("2024-05-01T10:00:00Z", "--at") == 1714557600
    assert parse_time_s("2024-05-01T10:00:00", "--at") == 1714557600  # no zone: UTC
    with pytest.raises(DiagnoseError, match="ISO 8601"):
        parse_time_s("yesterday", "--at")


def test_snapshot_time_line_round_trips_and_is_invisible_to_the_parser():
    text = with_snapshot_time("growpage_requests_running 3\n", 1714557600.5)
    assert text.startswith("# growpage-snapshot-time: 1714557600.500\n")
    assert snapshot_time(text) == 1714557600.5
    exposition = parse_exposition(text, "x.prom", 0.0)
    assert [(s.name, s.value) for s in exposition.samples] == [("growpage_requests_running", 3.0)]


def test_openmetrics_exposition_with_the_time_line_parses():
    text = ("# growpage-snapshot-time: 10\n# TYPE growpage_oom_events counter\n"
            "growpage_oom_events_total{model=\"m\"} 4.0\n# EOF\n")
    exposition = parse_exposition(text, "x.om", 10.0, "application/openmetrics-text; version=1.0.0")
    assert [(s.name, s.value) for s in exposition.samples] == [("growpage_oom_events_total", 4.0)]


def test_counter_increase_handles_resets_and_late_series():
    def exposition(time_s, body):
        return parse_exposition(body, "x", time_s)
    series = [exposition(0, 'growpage_oom_events_total{model_name="m"} 10\n'),
              exposition(30, 'growpage_oom_events_total{model_name="m"} 15\n'
                             'growpage_oom_events_total{model_name="n"} 2\n'),
              exposition(60, 'growpage_oom_events_total{model_name="m"} 3\n'  # restart: 3 new events
                             'growpage_oom_events_total{model_name="n"} 2\n')]
    assert counter_increase(series, "growpage_oom_events_total", lambda labels: True) == 5 + 2 + 3


def test_histogram_increase_sums_series_per_bucket():
    body = ('growpage_request_tokens_bucket{{model_name="{m}",le="256.0"}} {a}\n'
            'growpage_request_tokens_bucket{{model_name="{m}",le="+Inf"}} {b}\n')
    first = parse_exposition(body.format(m="a", a=1, b=2) + body.format(m="b", a=0, b=0), "x", 0)
    second = parse_exposition(body.format(m="a", a=4, b=8) + body.format(m="b", a=1, b=1), "x", 60)
    counts = histogram_increase([first, second], "growpage_request_tokens", lambda labels: True)
    assert counts.buckets == ((256.0, 4.0), (math.inf, 7.0))


# --- checks ------------------------------------------------------------------------------------

def test_every_check_has_a_runbook_page_in_the_catalog():
    assert [check.id for check in CHECKS] == list(catalog.CHECK_RUNBOOKS)


def test_utilization_slo_uses_the_mean():
    assert utilization(Scope("s", utilization=gauge(0.64, 0.9)), WINDOW, T).status is Status.WARNING
    assert utilization(Scope("s", utilization=gauge(0.65)), WINDOW, T).status is Status.OK


def test_an_idle_scope_is_ok_with_nothing_to_judge_not_over_granting():
    # As for the alerts: a ratio of no traffic never fires, so an idle pod is healthy, not unknown.
    idle = Scope("s", utilization=gauge(0.0), page_allocations=0.0, requests_running_max=0.0)
    for check in (utilization, over_granting):
        finding = check(idle, WINDOW, T)
        assert finding.status is Status.OK and finding.summary.startswith("idle: no pages granted"), finding
        assert finding.evidence["idle"] is True and finding.not_checked is None


def test_samples_between_bursts_are_not_over_granting():
    """Grants in the window, but no request held pages at either sample: the gauge's 0 is no data."""
    between = Scope("s", utilization=gauge(0.0), page_allocations=12.0, requests_running_max=0.0)
    finding = over_granting(between, WINDOW, T)
    assert finding.status is Status.OK and "no request held KV pages" in finding.summary


def test_over_granting_reads_the_pooled_ratio_at_samples_with_grants():
    """The alert's ratio (live / granted where something is granted), not the gauge's idle zeros."""
    scope = Scope("s", utilization=gauge(0.0, 0.3), pooled_utilization=gauge(0.3), page_allocations=12.0,
                  requests_running_max=4.0)
    finding = over_granting(scope, WINDOW, T)
    assert finding.status is Status.WARNING and finding.evidence["value"] == 0.3
    busy = dataclasses.replace(scope, pooled_utilization=gauge(0.3, 0.7))
    assert over_granting(busy, WINDOW, T).status is Status.OK


def test_compress_ratio_prefers_byte_counters_and_flags_int8():
    finding = compress_ratio(Scope("s", compress_input_bytes=1.97e6, compress_output_bytes=1e6,
                                   intra_page_compress_ratio=gauge(9.0)), WINDOW, T)
    assert finding.status is Status.WARNING
    assert finding.evidence["value"] == pytest.approx(1.97)
    assert any("INT4" in step for step in finding.remediation)


def test_compress_ratio_falls_back_to_the_gauge_and_is_ok_without_compressions():
    assert compress_ratio(Scope("s", intra_page_compress_ratio=gauge(2.4)), WINDOW, T).evidence["value"] == 2.4
    monitor = Scope("s", compress_input_bytes=0.0, compress_output_bytes=0.0, build_infos=(BuildInfo(mode="monitor"),))
    finding = compress_ratio(monitor, WINDOW, T)
    assert finding.status is Status.OK and "mode monitor" in finding.summary


def test_latency_slo_is_the_fraction_of_grants_at_or_under_15_ms():
    finding = allocation_latency_slo(Scope("s", allocation_latency=histogram({0.01: 985, 0.015: 4, 0.05: 11})),
                                     WINDOW, T)
    # Snapshots hold no history: the share is read, the burn-rate alerts are not checked.
    assert finding.status is Status.UNKNOWN and finding.not_checked is not None
    assert "burn-rate alerts not checked" in finding.not_checked.reason
    assert "--prometheus" in finding.not_checked.to_check
    assert finding.evidence["value"] == pytest.approx(0.989)
    assert "98.9 %" in finding.summary


RANGE = Window(0.0, 1800.0, "range")
WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")


def burning(ratios: dict[str, float], slo: str = catalog.SLO_ALLOCATION_LATENCY.name) -> Scope:
    return Scope("s", allocation_latency=histogram({0.01: 900, 0.05: 100}), build_infos=(BuildInfo(mode="enforce"),),
                 burn_ratios={slo: (ServiceErrorRatios({"namespace": "chat"}, ratios),)})


def test_a_30_minute_burn_at_7x_is_no_fast_burn():
    # The old verdict: 7x over --since 30m > the lowest fast factor (6): critical. The rules: the 6h
    # window of the 6h/30m pair is quiet, so nothing fires.
    ratios = {"5m": 0.07, "30m": 0.07, "1h": 0.035, "6h": 0.07 / 12}
    finding = allocation_latency_slo(burning(ratios), RANGE, T)
    assert finding.status is Status.OK and finding.alerts == (), finding.summary
    # The slow pairs' long windows (1d, 3d) are not covered: said, not guessed.
    assert finding.not_checked is not None and "SlowBurn 1d/2h" in finding.not_checked.reason
    states = {(p["alert"], p["long_window"]): p["state"] for p in finding.evidence["burn_pairs"]}
    assert states[("GrowPageAllocationLatencyFastBurn", "6h")] == "quiet"
    assert states[("GrowPageAllocationLatencySlowBurn", "3d")] == "not_checked"


def test_a_burn_names_the_alert_and_window_pair_the_rules_raise():
    ratios = dict.fromkeys(WINDOWS, 0.0) | {"1h": 0.16, "5m": 0.2}
    finding = allocation_latency_slo(burning(ratios), RANGE, T)
    assert finding.alerts == ("GrowPageAllocationLatencyFastBurn",) and finding.not_checked is None
    # Its severity is the severity table's (a ticket: grant latency is a cause), not the speed's.
    assert finding.status is Status.WARNING
    assert "GrowPageAllocationLatencyFastBurn (1h/5m: 16.00/20.00 % bad > 14.40 %, namespace chat)" in finding.summary
    ttft = vllm_latency(Scope(
        "s", vllm_ttft=histogram({1.0: 90, 5.0: 10}), build_infos=(BuildInfo(engine="vllm", mode="monitor"),),
        burn_ratios={catalog.SLO_VLLM_TTFT.name: (ServiceErrorRatios({}, ratios),)}), RANGE, T)
    assert ttft.alerts == ("GrowPageVLLMTimeToFirstTokenFastBurn",) and ttft.status is Status.CRITICAL


def test_a_burn_alert_firing_in_prometheus_is_named_though_its_pairs_are_quiet_now():
    quiet = dict.fromkeys(WINDOWS, 0.0)
    paged = frozenset({"GrowPageVLLMTimeToFirstTokenFastBurn"})
    scope = Scope("s", vllm_ttft=histogram({1.0: 90, 5.0: 10}), build_infos=(BuildInfo(engine="vllm", mode="off"),),
                  burn_ratios={catalog.SLO_VLLM_TTFT.name: (ServiceErrorRatios({"namespace": "chat"}, quiet, paged),)})
    ttft = vllm_latency(scope, RANGE, T)
    # the page that woke the on-call, with its severity, though the windows read quiet a second later
    assert (ttft.status, ttft.alerts) == (Status.CRITICAL, ("GrowPageVLLMTimeToFirstTokenFastBurn",))
    assert ttft.evidence["firing_in_prometheus"] == [{"alert": "GrowPageVLLMTimeToFirstTokenFastBurn",
                                                      "service": "namespace chat"}]
    assert "firing in Prometheus, namespace chat" in ttft.summary
    # a check names only its own SLO's alerts: the grant-latency check does not take up vLLM's page
    grants = ServiceErrorRatios({"namespace": "chat"}, quiet, paged)
    allocation = allocation_latency_slo(Scope(
        "s", allocation_latency=histogram({0.01: 900, 0.05: 100}), build_infos=(BuildInfo(mode="enforce"),),
        burn_ratios={catalog.SLO_ALLOCATION_LATENCY.name: (grants,)}), RANGE, T)
    assert (allocation.status, allocation.alerts) == (Status.OK, ())


def test_no_covered_pair_is_not_checked():
    finding = allocation_latency_slo(burning({"5m": 0.5, "30m": 0.5}), RANGE, T)
    assert finding.status is Status.UNKNOWN and finding.not_checked is not None
    assert "up to 3d" in finding.not_checked.to_check


def test_pct_floor_never_rounds_a_miss_up_to_the_objective():
    assert pct_floor(0.98996) == "98.99 %"
    assert pct_floor(1.0) == "100 %"


def test_over_granting_suggests_base_pages_with_the_stated_formula():
    tokens = histogram({128: 10, 256: 30, 512: 40, 1024: 15, 2048: 5})  # p50 = 320 tokens
    scope = Scope("s", utilization=gauge(0.3, 0.34), request_tokens=tokens,
                  build_infos=(BuildInfo(mode="monitor", block_size=16, base_pages=128),))
    finding = over_granting(scope, WINDOW, T)
    # The GrowPageKVOverGranting condition: a ticket, so a warning, from any number of samples.
    assert finding.status is Status.WARNING and finding.alerts == ("GrowPageKVOverGranting",)
    one = over_granting(scope, dataclasses.replace(WINDOW, num_samples=1), T)
    assert one.status is Status.WARNING and "one snapshot" in one.summary
    assert finding.evidence["suggested_base_pages"] == 30 == suggest_base_pages(320, 16, 0.65)
    assert finding.evidence["request_tokens_p50"] == pytest.approx(320)
    assert "floor(320 / (0.65 x 16)) = 30" in finding.remediation[0]


def test_over_granting_is_not_sustained_when_utilization_ever_reached_the_limit():
    assert over_granting(Scope("s", utilization=gauge(0.2, 0.45)), WINDOW, T).status is Status.OK


def test_over_granting_says_when_lengths_already_fit_the_grant():
    tokens = histogram({2048: 10})
    scope = Scope("s", utilization=gauge(0.3), request_tokens=tokens,
                  build_infos=(BuildInfo(block_size=16, base_pages=16),))
    finding = over_granting(scope, WINDOW, T)
    assert "another reason" in finding.remediation[0]


def test_block_size_recommendation_is_growpage_guidance_read_from_the_gpu_name():
    assert recommended_block_size(("NVIDIA A100-SXM4-80GB",), T.block_size_by_gpu) == ("A100", 16)
    assert recommended_block_size(("NVIDIA H100 80GB HBM3",), T.block_size_by_gpu) == ("H100", 32)
    assert recommended_block_size(("cuda",), T.block_size_by_gpu) == (None, None)


def test_slow_grants_name_block_size_throttling_and_pool_as_causes():
    scope = Scope("s", allocation_latency=histogram({0.01: 90, 0.05: 10}), build_infos=(H100_BUILD,),
                  decisions={"allocate": 10.0, "throttled": 20.0, "denied": 5.0}, pool_free_fraction_min=0.01)
    finding = allocation_latency(scope, WINDOW, T)
    assert finding.status is Status.WARNING and finding.alerts == ("GrowPageAllocationLatencyHigh",)
    assert finding.evidence["recommended_block_size"] == 32
    text = " ".join(finding.remediation)
    assert "--block-size 32" in text and "not a vLLM rule" in text
    assert "max_growth_rate" in text and "pool runs dry" in text


def test_fast_grants_with_a_mismatched_block_size_are_ok_with_advice():
    scope = Scope("s", allocation_latency=histogram({0.005: 100}), build_infos=(H100_BUILD,))
    finding = allocation_latency(scope, WINDOW, T)
    assert finding.status is Status.OK and finding.resolved_severity is Severity.INFO


def test_stranded_pages_are_critical_whatever_the_framebuffer_says():
    # vLLM's framebuffer is always ~90 % full (its KV cache is reserved at start-up): not a signal.
    scope = Scope("s", oom_events=60.0, fragmentation=gauge(0.66), gpu_framebuffer_used_max=0.92,
                  pool_free_fraction_min=0.005, stranded_slots_max=0.7,
                  build_infos=(BuildInfo(engine="vllm", engine_version="0.31.2", mode="monitor", block_size=16),))
    finding = oom_fragmentation(scope, WINDOW, T)
    assert finding.status is Status.CRITICAL and "genuinely full" not in finding.summary
    text = " ".join(finding.remediation)
    assert f"Upgrade to vLLM >= {catalog.MIN_SUPPORTED_VLLM_VERSION} (now 0.31.2)" in text
    assert "No vLLM release contains GrowPage" in text
    assert "Run mode=enforce (now monitor)" in text


def test_a_pool_full_of_live_tokens_is_a_capacity_warning_without_advice_it_already_follows():
    scope = Scope("s", oom_events=3.0, fragmentation=gauge(0.1), pool_free_fraction_min=0.0,
                  stranded_slots_max=0.08,
                  build_infos=(BuildInfo(engine="vllm", engine_version="0.32.1", mode="enforce", block_size=16),))
    finding = oom_fragmentation(scope, WINDOW, T)
    # No alert pages for a genuinely full KV cache (capacity): advice, not a finding.
    assert finding.status is Status.OK and finding.resolved_severity is Severity.INFO
    assert "genuinely full" in finding.summary and not finding.alerts
    text = " ".join(finding.remediation)
    assert "mode=enforce" not in text and "Upgrade" not in text  # it enforces, on a supported vLLM


def test_failures_with_free_pages_are_not_blamed_on_fragmentation():
    scope = Scope("s", oom_events=3.0, fragmentation=gauge(0.66), pool_free_fraction_min=0.4, stranded_slots_max=0.7)
    finding = oom_fragmentation(scope, WINDOW, T)
    assert finding.status is Status.OK and "still had free pages" in finding.summary and not finding.alerts


def test_rollout_flags_phase_two_candidates_as_advice_and_throttling_as_warning():
    candidate = Scope("s", lts_entropy=histogram({2.5: 2, 3.0: 8}), build_infos=(BuildInfo(mode="monitor"),))
    finding = rollout(candidate, WINDOW, T)
    assert finding.status is Status.OK and finding.resolved_severity is Severity.INFO
    throttled = Scope("s", decisions={"allocate": 1.0, "throttled": 3.0}, build_infos=(BuildInfo(mode="enforce"),))
    assert rollout(throttled, WINDOW, T).status is Status.WARNING


def _forecast_counters(*, avoidable: float, recompute_s: float, wider_s: float) -> dict[str, float]:
    c = catalog
    return {c.FORECAST_PAGES_FREED.name: 40.0, c.FORECAST_COMPACTIONS.name: 30.0, c.FORECAST_PREEMPTIONS.name: 9.0,
            c.FORECAST_PREEMPTIONS_AVOIDABLE.name: avoidable, c.FORECAST_PREEMPTIONS_AVOIDABLE_BY_ADMISSION.name: 0.0,
            c.FORECAST_RECOMPUTE_SECONDS_AVOIDABLE.name: recompute_s, c.FORECAST_WIDER_BATCH_SECONDS.name: wider_s}


def test_rollout_follows_monitors_forecast_where_there_is_one_whatever_the_entropy():
    monitored = (BuildInfo(mode="monitor"),)
    hard = histogram({2.5: 2, 3.0: 8})  # entropy alone would make it a phase-2 candidate
    # the decode-heavy case: 2 short preemptions avoided, 0.04 s saved against 0.43 s of GrowPage's own
    slower = Scope("s", lts_entropy=hard, build_infos=monitored, own_seconds=0.43, hooked_seconds=10.0,
                   forecast_counters=_forecast_counters(avoidable=2.0, recompute_s=0.03, wider_s=0.01))
    finding = rollout(slower, WINDOW, T)
    assert finding.status is Status.OK and finding.resolved_severity is Severity.NONE and not finding.remediation
    assert "stay in monitor (LTS entropy p50" in finding.summary and "slower than vLLM alone" in finding.summary
    assert finding.evidence["forecast_verdict"] == "stay_in_monitor"
    # the retrieval case: nothing preempts, but compressed prompts let the queue in: advice to enforce
    pays = dataclasses.replace(slower, lts_entropy=histogram({1.5: 8, 2.0: 2}), own_seconds=0.21,
                               forecast_counters=_forecast_counters(avoidable=0.0, recompute_s=0.0, wider_s=0.87))
    finding = rollout(pays, WINDOW, T)
    assert finding.resolved_severity is Severity.INFO and "monitor's forecast says enforce pays here" in finding.summary
    assert any("Enable mode=enforce here (phase 2)" in step for step in finding.remediation)
    # no forecast (an older GrowPage, the reference engine): the entropy rule, as before
    older = dataclasses.replace(slower, forecast_counters=None)
    assert "a phase-2 candidate" in rollout(older, WINDOW, T).summary


def test_the_forecast_counters_are_read_from_scrapes_as_their_increase():
    def exposition(time_s: float, avoidable: float, wider_s: float):
        text = "".join(f"# TYPE {name.removesuffix('_total')} counter\n{name}{{model_name=\"m\"}} {value}\n"
                       for name, value in ((catalog.FORECAST_PREEMPTIONS_AVOIDABLE.name, avoidable),
                                           (catalog.FORECAST_WIDER_BATCH_SECONDS.name, wider_s)))
        return parse_exposition(text, "agent", time_s)

    scope = build_scope("all", [exposition(0.0, 1.0, 0.5), exposition(60.0, 3.0, 2.0)], [], lambda labels: True)
    assert scope.forecast_counters == {catalog.FORECAST_PREEMPTIONS_AVOIDABLE.name: 2.0,
                                       catalog.FORECAST_WIDER_BATCH_SECONDS.name: 1.5}
    assert build_scope("all", [parse_exposition("", "agent", 0.0)], [], lambda labels: True).forecast_counters is None


def test_growpage_costing_more_than_its_share_of_vllms_step_is_a_warning_with_what_to_observe_less():
    info = (BuildInfo(mode="monitor"),)
    limit = T.checklist.own_share_high
    cheap = agent_health(Scope("s", own_seconds=3.0, hooked_seconds=100.0, build_infos=info), WINDOW, T)
    assert cheap.status is Status.OK and cheap.evidence["own_share_of_vllm_steps"] == 0.03
    dear = agent_health(Scope("s", own_seconds=100.0 * limit + 1, hooked_seconds=100.0, build_infos=info), WINDOW, T)
    assert dear.status is Status.WARNING and f"of the vLLM calls it hooks (> {pct(limit)})" in dear.summary
    assert any("observe_every_steps" in step for step in dear.remediation)
    # outside vLLM, or no step in the window: nothing to judge, no warning
    for idle in (Scope("s", build_infos=info), Scope("s", own_seconds=0.0, hooked_seconds=0.0, build_infos=info)):
        finding = agent_health(idle, WINDOW, T)
        assert finding.status is Status.OK and finding.evidence["own_share_of_vllm_steps"] is None


def test_verdict_precedence_and_partial_data():
    # The verdict is the worst of the checks that could run; unknown only when none could.
    assert verdict([Status.OK, Status.UNKNOWN]) is Status.OK
    assert verdict([Status.UNKNOWN, Status.UNKNOWN]) is Status.UNKNOWN
    assert verdict([Status.UNKNOWN, Status.WARNING]) is Status.WARNING
    assert verdict([Status.WARNING, Status.CRITICAL, Status.OK]) is Status.CRITICAL
    assert worst([Status.OK, Status.UNKNOWN]) is Status.UNKNOWN  # a scope's worst still ranks unknown
    report = run_checks(Observations(source={"kind": "snapshot", "target": "x"}, window=WINDOW,
                                     overall=Scope("all", utilization=gauge(0.8))))
    statuses = {finding.id: finding.status for finding in report.findings}
    assert statuses["slo-utilization"] is Status.OK
    assert statuses["slo-allocation-latency"] is Status.UNKNOWN
    assert report.exit_code == 1  # agent-health warns: no build info
    listed = {item["id"]: item for item in report.to_dict()["not_checked"]}
    assert listed["slo-allocation-latency"]["to_check"].startswith(f"save {catalog.METRICS_PATH} of an agent")
    assert listed["vllm-latency"]["to_check"].startswith("save vLLM's /metrics beside /metrics/growpage")


def test_a_problem_namespace_escalates_an_ok_fleet():
    reference = (BuildInfo(engine="reference", mode="monitor"),)
    fleet = Scope("all", utilization=gauge(0.7, 0.9), build_infos=reference)
    batch = Scope("batch", utilization=gauge(0.3, 0.35), build_infos=reference)
    observations = Observations(source={"kind": "prometheus", "target": "x"}, window=WINDOW, overall=fleet,
                                breakdown_label="namespace", breakdown={"batch": batch, "chat": fleet})
    finding = next(f for f in run_checks(observations).findings if f.id == "over-granting")
    assert finding.status is Status.WARNING and finding.alerts == ("GrowPageKVOverGranting",)
    assert finding.summary.startswith("namespace batch: utilization never above 0.35")
    assert finding.breakdown["chat"].status is Status.OK
