"""promtool unit tests for every alerting rule (kubernetes-mixin style).

Each rule gets a scenario: input series that breach it from ``starts`` on. The test asserts the
alert is silent one evaluation before ``for`` has elapsed and fires right after, with its exact
labels and rendered annotations.
"""

from __future__ import annotations

import dataclasses

from growpage import catalog
from growpage.monitoring.alert_rules import SLO_ERROR_BUDGET, AlertRule, alert_rules, burn_rate_alert_name
from growpage.monitoring.alert_templates import render
from growpage.monitoring.promql import duration_seconds, format_duration, le_value, selector

EVALUATION_INTERVAL = "1m"
RULES_FILE_FROM_TESTS = "../growpage-rules.yaml"  # promtool resolves it from the test file's folder

POD = {"namespace": "math-reasoning", "pod": "vllm-reasoning-5d8c7b9f4-x2k9q", "model": "qwen2.5-7b"}
TARGET = {"job": catalog.SCRAPE_JOB, "instance": "10.42.0.17:8000", **POD}
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


def _series(metric: str, values: str, **extra: str) -> dict[str, str]:
    return {selector(metric, **TARGET, **extra): values}


def _constant(value: float) -> str:
    return f"{value:g}x{SAMPLES}"


def _counter(per_minute: float) -> str:
    return f"0+{per_minute:g}x{SAMPLES}"


def _gauge_breach(metric: str, value: float, **extra: dict) -> Scenario:
    return Scenario({**_series(metric, _constant(value)), **extra}, "0m", dict(TARGET), value)


def _burn_scenario(burn: catalog.BurnRateWindow) -> Scenario:
    histogram = catalog.ALLOCATION_LATENCY.name
    # Just above this window's limit and below any faster window's, so only this branch trips.
    total = 1000
    slow = round(total * burn.factor * SLO_ERROR_BUDGET * 1.5)
    fast = le_value(catalog.ALLOCATION_LATENCY_SLO_THRESHOLD_S)
    series = {**_series(f"{histogram}_count", _counter(total)),
              **_series(f"{histogram}_bucket", _counter(total - slow), le=fast)}
    error_ratio = slow / total
    title = f"{burn.long_window}/{burn.short_window} windows at {burn.factor:g}x"
    return Scenario(series, "1m", dict(POD), error_ratio, title)


def _latency_scenario() -> Scenario:
    # Every grant lands between the 20 ms and 50 ms bounds: p99 interpolates to 49.7 ms.
    histogram = catalog.ALLOCATION_LATENCY.name
    slow_low, slow_high = 0.02, 0.05
    series = _series(f"{histogram}_count", _counter(100))
    for bound in (*catalog.ALLOCATION_LATENCY.buckets, float("inf")):
        le = "+Inf" if bound == float("inf") else le_value(bound)
        series |= _series(f"{histogram}_bucket", _counter(100 if bound >= slow_high else 0), le=le)
    return Scenario(series, "1m", dict(POD), slow_low + (slow_high - slow_low) * 0.99)


def _oom_scenario() -> Scenario:
    # DCGM as scraped with honorLabels false: namespace/pod name the exporter, exported_* the user.
    dcgm = {"job": "dcgm-exporter", "namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-7xk2p",
            "gpu": "0", "exported_namespace": POD["namespace"], "exported_pod": POD["pod"]}
    series = {
        **_series(catalog.OOM_EVENTS.name, _counter(1)),
        selector(catalog.DCGM_FB_USED, **dcgm): _constant(40_000),
        selector(catalog.DCGM_FB_FREE, **dcgm): _constant(41_000),
    }
    return Scenario(series, "1m", dict(POD), 6)  # six OOMs counted at the firing evaluation


def scenarios() -> dict[str, list[Scenario]]:
    """Scenarios per alertname. Values that a rate sees exactly: counters start at 0 on 1m samples."""
    ok_running = _series(catalog.REQUESTS_RUNNING.name, _constant(3))
    compress = {**_series(catalog.COMPRESS_INPUT_BYTES.name, _counter(1970)),
                **_series(catalog.COMPRESS_OUTPUT_BYTES.name, _counter(1000))}
    throttle = {**_series(catalog.DECISIONS.name, _counter(6), decision="throttled"),
                **_series(catalog.DECISIONS.name, _counter(4), decision="allocate")}
    result = {
        "GrowPageKVUtilizationLow": _gauge_breach(catalog.UTILIZATION.name, 0.5, **ok_running),
        "GrowPageKVUtilizationCritical": _gauge_breach(catalog.UTILIZATION.name, 0.3, **ok_running),
        "GrowPageCompressRatioLow": Scenario(compress, "1m", dict(POD), 1.97),
        "GrowPageAllocationLatencyHigh": _latency_scenario(),
        "GrowPageFragmentationHigh": _gauge_breach(catalog.FRAGMENTATION.name, 0.6),
        "GrowPageOOMWithFreeGPUMemory": _oom_scenario(),
        "GrowPageAgentDown": Scenario(_series("up", _constant(0)), "0m", dict(TARGET), 0),
        "GrowPageMetricsAbsent": Scenario(_series("up", _constant(1)), "0m",
                                          {"job": catalog.SCRAPE_JOB}, 1),
        "GrowPageAgentErrors": Scenario(_series(catalog.AGENT_ERRORS.name, _counter(2), component="actuator"),
                                        "1m", {**POD, "component": "actuator"}, 10),
        "GrowPageGrowthThrottled": Scenario(throttle, "1m", dict(POD), 0.6),
    }
    by_name = {name: [scenario] for name, scenario in result.items()}
    for alert in catalog.ALLOCATION_LATENCY_BURN_RATE_ALERTS:
        by_name[burn_rate_alert_name(alert.speed)] = [_burn_scenario(burn) for burn in alert.windows]
    return by_name


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


def alert_test_files() -> dict[str, dict]:
    """``{AlertName: test file document}``: one file per alert, one test per scenario."""
    scenarios_by_name = scenarios()
    files: dict[str, dict] = {}
    for rule in alert_rules():
        if rule.name not in scenarios_by_name:
            raise KeyError(f"no promtool scenario for alert {rule.name}; add one in alert_tests.py")
        files[rule.name] = {
            "rule_files": [RULES_FILE_FROM_TESTS],
            "evaluation_interval": EVALUATION_INTERVAL,
            "tests": [_test_case(rule, scenario) for scenario in scenarios_by_name[rule.name]],
        }
    return files
