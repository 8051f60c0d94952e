"""promtool unit tests for every alerting rule (kubernetes-mixin style), both ways.

Each rule gets scenarios that breach it from ``starts`` on: the test asserts the alert is silent one
evaluation before ``for`` has elapsed and fires right after, with its exact labels and rendered
annotations. Each rule also gets quiet scenarios, near misses where its condition is false (an idle
pod, a genuinely full pool, a healthy service averaged over its pods): the alert must stay silent
long after ``for`` would have elapsed.
"""

from __future__ import annotations

import dataclasses

from growpage import catalog
from growpage.monitoring.alert_rules import SLO_ERROR_BUDGET, AlertRule, alert_rules, burn_rate_alert_name
from growpage.monitoring.alert_templates import render
from growpage.monitoring.promql import duration_seconds, format_duration, le_value, selector

EVALUATION_INTERVAL = "1m"
RULES_FILE_FROM_TESTS = "../growpage-rules.yaml"  # promtool resolves it from the test file's folder

MODEL = "qwen2.5-7b"
POD = {"namespace": "math-reasoning", "pod": "vllm-reasoning-5d8c7b9f4-x2k9q", catalog.MODEL_LABEL: MODEL}
SERVICE = {label: POD[label] for label in catalog.SLO_LABELS}
TARGET = {"job": catalog.SCRAPE_JOB, "instance": "10.42.0.17:8000", **POD}
VLLM_TARGET = {**TARGET, "job": catalog.VLLM_SCRAPE_JOB, "engine": "0"}  # vLLM's own /metrics
SAMPLES = 200  # per series: covers the longest `for` (3h) plus a margin, at 1m


@dataclasses.dataclass(frozen=True)
class Scenario:
    """Input series that breach one rule.

    Attributes:
        series: promtool series selector -> values notation (``'0+60x200'``).
        starts: first evaluation at which the rule's expression returns the alert.
        labels: the alert's labels besides ``severity``.
        value: ``$value`` at the firing evaluation.
        title: what the scenario shows, when a rule has several.
    """

    series: dict[str, str]
    starts: str
    labels: dict[str, str]
    value: float
    title: str = "breached"


@dataclasses.dataclass(frozen=True)
class QuietScenario:
    """Input series close to a rule's condition where it must NOT fire.

    Attributes:
        series: promtool series selector -> values notation.
        title: why the alert must stay silent.
    """

    series: dict[str, str]
    title: str


def _series(metric: str, values: str, **extra: str) -> dict[str, str]:
    return {selector(metric, **TARGET, **extra): values}


def _constant(value: float) -> str:
    return f"{value:g}x{SAMPLES}"


def _counter(per_minute: float) -> str:
    return f"0+{per_minute:g}x{SAMPLES}"


def _bursts(per_burst: float, every_min: int = 10) -> str:
    """A counter that jumps by ``per_burst`` every ``every_min`` minutes and is flat in between."""
    return " ".join(f"{(minute // every_min) * per_burst:g}" for minute in range(SAMPLES + 1))


def _slots(live: float, granted: float, used: float | None = None) -> dict[str, str]:
    """Token slot gauges, and the per-pod ratio gauges an agent exports next to them."""
    used = granted if used is None else used
    return {**_series(catalog.LIVE_TOKENS.name, _constant(live)),
            **_series(catalog.GRANTED_TOKEN_SLOTS.name, _constant(granted)),
            **_series(catalog.USED_TOKEN_SLOTS.name, _constant(used)),
            **_series(catalog.UTILIZATION.name, _constant(round(live / granted, 6))),
            **_series(catalog.FRAGMENTATION.name, _constant(round(1 - live / used, 6)))}


def _pool(free: float, reserved: float, used: float) -> dict[str, str]:
    return {**_series(catalog.POOL_PAGES.name, _constant(free), state="free"),
            **_series(catalog.POOL_PAGES.name, _constant(reserved), state="reserved"),
            **_series(catalog.POOL_PAGES.name, _constant(used), state="used")}


def _running(requests: float) -> dict[str, str]:
    return _series(catalog.REQUESTS_RUNNING.name, _constant(requests))


def _build_info(mode: str) -> dict[str, str]:
    return _series(catalog.BUILD_INFO.name, _constant(1), mode=mode)


def _latency(fast_share: float, per_minute: float = 1000, **target: str) -> dict[str, str]:
    """Grant latency histogram series where ``fast_share`` of grants meet the SLO threshold."""
    histogram = catalog.ALLOCATION_LATENCY.name
    labels = {**TARGET, **target}
    fast = le_value(catalog.ALLOCATION_LATENCY_SLO_THRESHOLD_S)
    return {selector(f"{histogram}_count", **labels): _counter(per_minute),
            selector(f"{histogram}_bucket", **labels, le=fast): _counter(round(per_minute * fast_share))}


def _burn_scenario(burn: catalog.BurnRateWindow) -> Scenario:
    # Just above this window's limit and below any faster window's, so only this branch trips.
    # Two pods share the errors: the SLO is the service's, whichever pod served.
    total = 1000
    slow = round(total * burn.factor * SLO_ERROR_BUDGET * 1.5)
    other = {"pod": "vllm-reasoning-5d8c7b9f4-b7n1c", "instance": "10.42.0.18:8000"}
    series = {**_latency(1 - slow / total, total), **_latency(1 - slow / total, total, **other)}
    title = f"{burn.long_window}/{burn.short_window} windows at {burn.factor:g}x, two pods"
    return Scenario(series, "1m", dict(SERVICE), slow / total, title)


def _latency_scenario() -> Scenario:
    # Every grant lands between the 20 ms and 50 ms bounds: p99 interpolates to 49.7 ms.
    histogram = catalog.ALLOCATION_LATENCY.name
    slow_low, slow_high = 0.02, 0.05
    series = _series(f"{histogram}_count", _counter(100))
    for bound in (*catalog.ALLOCATION_LATENCY.buckets, float("inf")):
        le = "+Inf" if bound == float("inf") else le_value(bound)
        series |= _series(f"{histogram}_bucket", _counter(100 if bound >= slow_high else 0), le=le)
    return Scenario(series, "1m", dict(POD), slow_low + (slow_high - slow_low) * 0.99)


def _dcgm(used_mib: float, free_mib: float) -> dict[str, str]:
    # DCGM as scraped with honorLabels false: namespace/pod name the exporter, exported_* the user.
    dcgm = {"job": "dcgm-exporter", "namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-7xk2p",
            "gpu": "0", "exported_namespace": POD["namespace"], "exported_pod": POD["pod"]}
    return {selector(catalog.DCGM_FB_USED, **dcgm): _constant(used_mib),
            selector(catalog.DCGM_FB_FREE, **dcgm): _constant(free_mib)}


def _stranded_scenarios() -> list[Scenario]:
    # The case the framebuffer rule could not see: vLLM reserved its KV cache at start-up, so the GPU
    # is 92 % full, yet 1 OOM a minute strikes a pool with no free page and a third of its slots live.
    inside_pool = {**_series(catalog.OOM_EVENTS.name, _counter(1)), **_dcgm(75_000, 6_500),
                   **_pool(free=5, reserved=400, used=595), **_slots(live=3236, granted=1000 * 16, used=595 * 16)}
    # vLLM's own view: its preemptions and kv_cache_usage_perc, while GrowPage only monitors.
    vllm = {**{selector(catalog.VLLM_PREEMPTIONS, **VLLM_TARGET): _counter(1),
               selector(catalog.VLLM_KV_CACHE_USAGE, **VLLM_TARGET): _constant(0.99)},
            **_pool(free=500, reserved=300, used=200), **_slots(live=1200, granted=500 * 16, used=200 * 16)}
    # Six failures counted at the firing evaluation (for: 5m after the first one at 1m).
    return [Scenario(inside_pool, "1m", dict(POD), 6, "GrowPage OOMs, pool empty, GPU framebuffer 92 %"),
            Scenario(vllm, "1m", dict(POD), 6, "vLLM preemptions at kv_cache_usage_perc 99 %")]


def scenarios() -> dict[str, list[Scenario]]:
    """Breaching scenarios per alertname. Counters start at 0 on 1m samples, so rates are exact."""
    ok_running = _running(3)
    throttle = {**_series(catalog.DECISIONS.name, _counter(6), decision="throttled"),
                **_series(catalog.DECISIONS.name, _counter(4), decision="allocate")}
    # Compressions in bursts every 10 minutes: the hour-long window sees them from the first burst.
    compress = {**_series(catalog.COMPRESS_INPUT_BYTES.name, _bursts(1970)),
                **_series(catalog.COMPRESS_OUTPUT_BYTES.name, _bursts(1000))}
    inactive = {**_build_info("enforce"),
                **_series(catalog.AGENT_ACTIVE.name, _constant(1), component="observer", reason="active"),
                **_series(catalog.AGENT_ACTIVE.name, _constant(0), component="enforcer", reason="full_cudagraph")}
    result = {
        "GrowPageKVUtilizationLow": [Scenario({**_slots(500, 1000), **ok_running}, "0m", dict(SERVICE), 0.5)],
        "GrowPageKVOverGranting": [Scenario({**_slots(300, 1000), **ok_running}, "0m", dict(POD), 0.3)],
        "GrowPageCompressRatioLow": [Scenario(compress, "10m", dict(SERVICE), 1.97, "compressions in bursts")],
        "GrowPageAllocationLatencyHigh": [_latency_scenario()],
        "GrowPageFragmentationHigh": [Scenario({**_slots(34, 100), **_pool(100, 0, 900)}, "0m", dict(POD),
                                               0.66, "pool 10 % free")],
        "GrowPageKVPagesStranded": _stranded_scenarios(),
        "GrowPageAgentDown": [Scenario(_series("up", _constant(0)), "0m", dict(TARGET), 0)],
        "GrowPageMetricsAbsent": [Scenario(_series("up", _constant(1)), "0m", {"job": catalog.SCRAPE_JOB}, 1)],
        "GrowPageAgentErrors": [Scenario(_series(catalog.AGENT_ERRORS.name, _counter(2), component="actuator"),
                                         "1m", {**POD, "component": "actuator"}, 10)],
        "GrowPageGrowthThrottled": [Scenario(throttle, "1m", dict(POD), 0.6)],
        "GrowPageAgentInactive": [Scenario(inactive, "0m", {**POD, "component": "enforcer",
                                                            "reason": "full_cudagraph"}, 0)],
    }
    for alert in catalog.ALLOCATION_LATENCY_BURN_RATE_ALERTS:
        result[burn_rate_alert_name(alert.speed)] = [_burn_scenario(burn) for burn in alert.windows]
    return result


def quiet_scenarios() -> dict[str, list[QuietScenario]]:
    """Near misses per alertname: the condition is false, the alert must stay silent."""
    other_pod = {"pod": "vllm-reasoning-5d8c7b9f4-b7n1c", "instance": "10.42.0.18:8000"}

    def other(metric: str, values: str, **extra: str) -> dict[str, str]:
        return {selector(metric, **{**TARGET, **other_pod}, **extra): values}

    # One busy pod at 90 % and one small one at 30 %: the service fills 84 % of its slots. The mean
    # of the two ratios (60 %) would have alerted.
    two_pods = {**_slots(8100, 9000), **_running(3), **other(catalog.LIVE_TOKENS.name, _constant(300)),
                **other(catalog.GRANTED_TOKEN_SLOTS.name, _constant(1000)),
                **other(catalog.UTILIZATION.name, _constant(0.3)),
                **other(catalog.REQUESTS_RUNNING.name, _constant(1))}
    enforcing = {**_build_info("enforce"),
                 **_series(catalog.AGENT_ACTIVE.name, _constant(1), component="observer", reason="active"),
                 **_series(catalog.AGENT_ACTIVE.name, _constant(1), component="enforcer", reason="active")}
    off = {**_build_info("off"),
           **_series(catalog.AGENT_ACTIVE.name, _constant(0), component="observer", reason="mode_off"),
           **_series(catalog.AGENT_ACTIVE.name, _constant(0), component="enforcer", reason="mode_off")}
    return {
        "GrowPageKVUtilizationLow": [
            QuietScenario(two_pods, "utilization is summed over pods, not averaged"),
            QuietScenario({**_slots(0, 1000), **_running(0)}, "idle: no request running")],
        "GrowPageKVOverGranting": [
            QuietScenario({**_slots(0, 1000), **_running(0)}, "idle: no request running"),
            QuietScenario({**_slots(700, 1000), **_running(3)}, "utilization 70 %")],
        "GrowPageCompressRatioLow": [
            QuietScenario({**_series(catalog.COMPRESS_INPUT_BYTES.name, _bursts(3000)),
                           **_series(catalog.COMPRESS_OUTPUT_BYTES.name, _bursts(1000))}, "bursts at 3x"),
            QuietScenario({**_series(catalog.COMPRESS_INPUT_BYTES.name, _constant(0)),
                           **_series(catalog.COMPRESS_OUTPUT_BYTES.name, _constant(0))},
                          "no compressions (mode monitor)")],
        "GrowPageAllocationLatencyHigh": [QuietScenario(_latency(1.0, 100), "every grant under 15 ms")],
        "GrowPageFragmentationHigh": [
            QuietScenario({**_slots(34, 100), **_pool(990, 0, 10), **_running(1)},
                          "nearly idle: 1 request, pool 99 % free"),
            QuietScenario({**_slots(80, 100), **_pool(10, 0, 990)}, "pool short but fragmentation 20 %")],
        "GrowPageKVPagesStranded": [
            QuietScenario({**_series(catalog.OOM_EVENTS.name, _counter(1)), **_pool(300, 300, 400),
                           **_slots(300, 11_200, 6_400)}, "OOMs but 30 % of the pool is free"),
            QuietScenario({**_series(catalog.OOM_EVENTS.name, _counter(1)), **_pool(5, 5, 990),
                           **_slots(15_000, 15_920, 15_840), **_dcgm(75_000, 6_500)},
                          "genuinely full: no free page, 94 % of the slots live"),
            QuietScenario({**_series(catalog.OOM_EVENTS.name, _constant(0)), **_pool(5, 400, 595),
                           **_slots(300, 16_000, 9_520)}, "stranded pages but no request failed")],
        "GrowPageAgentDown": [QuietScenario(_series("up", _constant(1)), "scraped")],
        "GrowPageMetricsAbsent": [QuietScenario({**_series("up", _constant(1)), **_build_info("monitor")},
                                                "build info present")],
        "GrowPageAgentErrors": [QuietScenario(_series(catalog.AGENT_ERRORS.name, _constant(3), component="actuator"),
                                              "old faults, none new")],
        "GrowPageGrowthThrottled": [QuietScenario(
            {**_series(catalog.DECISIONS.name, _counter(2), decision="throttled"),
             **_series(catalog.DECISIONS.name, _counter(8), decision="allocate")}, "20 % throttled")],
        "GrowPageAgentInactive": [QuietScenario(enforcing, "every component active"),
                                  QuietScenario(off, "mode off: inactive by design")],
        burn_rate_alert_name("fast"): [QuietScenario(_latency(1 - 3 * 1.5 * SLO_ERROR_BUDGET), "a slow burn (4.5x)")],
        burn_rate_alert_name("slow"): [QuietScenario(_latency(1 - 0.5 * SLO_ERROR_BUDGET),
                                                     "half the error budget (0.5x)")],
    }


def _expected_alert(rule: AlertRule, scenario: Scenario) -> dict:
    labels = {**scenario.labels, "severity": rule.severity}
    annotations = {"summary": rule.summary, "runbook_url": rule.runbook_url,
                   "description": render(rule.description, labels, scenario.value)}
    return {"exp_labels": labels, "exp_annotations": annotations}


def _test_case(rule: AlertRule, scenario: Scenario) -> dict:
    step_s = duration_seconds(EVALUATION_INTERVAL)
    fires_s = duration_seconds(scenario.starts) + duration_seconds(rule.for_duration)
    checks = [
        {"eval_time": format_duration(fires_s - step_s), "alertname": rule.name, "exp_alerts": []},
        {"eval_time": format_duration(fires_s), "alertname": rule.name,
         "exp_alerts": [_expected_alert(rule, scenario)]},
    ]
    return {
        "name": f"{rule.name} ({scenario.title}): silent at for - 1 evaluation, fires after "
                f"for: {rule.for_duration}",
        "interval": EVALUATION_INTERVAL,
        "input_series": [{"series": name, "values": values} for name, values in scenario.series.items()],
        "alert_rule_test": checks,
    }


def quiet_eval_time(rule: AlertRule) -> str:
    """Well past ``for`` and every window the rules read (the longest burn window is 3d: capped by
    the input series, 200 minutes)."""
    return format_duration(min(duration_seconds(rule.for_duration) + 3600, (SAMPLES - 10) * 60))


def _quiet_case(rule: AlertRule, quiet: QuietScenario) -> dict:
    return {
        "name": f"{rule.name} stays silent: {quiet.title}",
        "interval": EVALUATION_INTERVAL,
        "input_series": [{"series": name, "values": values} for name, values in quiet.series.items()],
        "alert_rule_test": [{"eval_time": quiet_eval_time(rule), "alertname": rule.name, "exp_alerts": []}],
    }


def alert_test_files() -> dict[str, dict]:
    """``{AlertName: test file document}``: one file per alert, one test per scenario, quiet ones last."""
    firing, quiet = scenarios(), quiet_scenarios()
    files: dict[str, dict] = {}
    for rule in alert_rules():
        if rule.name not in firing or not quiet.get(rule.name):
            raise KeyError(f"alert {rule.name} needs a firing and a quiet promtool scenario; add them in "
                           "alert_tests.py")
        files[rule.name] = {
            "rule_files": [RULES_FILE_FROM_TESTS],
            "evaluation_interval": EVALUATION_INTERVAL,
            "tests": [*(_test_case(rule, scenario) for scenario in firing[rule.name]),
                      *(_quiet_case(rule, scenario) for scenario in quiet[rule.name])],
        }
    return files
