"""promtool unit tests for every alerting rule (kubernetes-mixin style), both ways.

Each rule gets scenarios that breach it from ``starts`` on: the test asserts the alert is silent one
evaluation before ``for`` has elapsed and fires right after, with its exact labels and rendered
annotations. Each rule also gets quiet scenarios, near misses where its condition is false (an idle
pod, a genuinely full pool, a healthy service averaged over its pods): the alert must stay silent
long after ``for`` would have elapsed.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator

from growpage import catalog
from growpage.monitoring import router_alert_tests
from growpage.monitoring.alert_rule import AlertRule, burn_rate_alert_name
from growpage.monitoring.alert_rules import VLLM_SLO_ALERT_STEMS, rules_by_name
from growpage.monitoring.alert_scenario import (
    REPLACED_AT_MIN,
    REPLACED_BAD_SHARE,
    REPLACED_TOTAL,
    SAMPLES,
    QuietScenario,
    Scenario,
    TimelineScenario,
    replacement_timeline,
)
from growpage.monitoring.alert_scenario import constant as _constant
from growpage.monitoring.alert_scenario import counter as _counter
from growpage.monitoring.alert_templates import render
from growpage.monitoring.mixin import DEFAULT_CONFIG, MixinConfig
from growpage.monitoring.promql import duration_seconds, format_duration, le_value, selector

EVALUATION_INTERVAL = "1m"
RULES_FILE_FROM_TESTS = "../growpage-rules.yaml"  # promtool resolves it from the test file's folder

MODEL = "qwen2.5-7b"
POD = {"namespace": "math-reasoning", "pod": "vllm-reasoning-5d8c7b9f4-x2k9q", catalog.MODEL_LABEL: MODEL}
SERVICE = {label: POD[label] for label in catalog.SLO_LABELS}
TARGET = {"job": catalog.SCRAPE_JOB, "instance": "10.42.0.17:8000", **POD}
VLLM_TARGET = {**TARGET, "job": catalog.VLLM_SCRAPE_JOB, "engine": "0"}  # vLLM's own /metrics
def _series(metric: str, values: str, **extra: str) -> dict[str, str]:
    return {selector(metric, **TARGET, **extra): values}


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


def _build_info(mode: str, home: str = "vllm") -> dict[str, str]:
    return _series(catalog.BUILD_INFO.name, _constant(1), mode=mode, home=home)


ENFORCE = _build_info("enforce")
MONITOR = _build_info("monitor")
OFF = _build_info("off")


def _histogram(name: str, good_bound: float, good_share: float, per_minute: float,
               labels: dict[str, str]) -> dict[str, str]:
    """A histogram where ``good_share`` of ``per_minute`` observations fall at or under ``good_bound``
    (the +Inf bucket and _count hold them all, as every client library exports)."""
    good = _counter(round(per_minute * good_share))
    return {selector(f"{name}_count", **labels): _counter(per_minute),
            selector(f"{name}_bucket", **labels, le=le_value(good_bound)): good,
            selector(f"{name}_bucket", **labels, le="+Inf"): _counter(per_minute)}


def _latency(fast_share: float, per_minute: float = 1000,
             threshold_s: float = catalog.ALLOCATION_LATENCY_SLO_THRESHOLD_S, **target: str) -> dict[str, str]:
    """Grant latency histogram series where ``fast_share`` of grants meet the SLO threshold ``threshold_s``."""
    return _histogram(catalog.ALLOCATION_LATENCY.name, threshold_s, fast_share, per_minute, {**TARGET, **target})


def _vllm_latency(slo: catalog.LatencySLO, good_share: float, per_minute: float = 1000,
                  **target: str) -> dict[str, str]:
    """vLLM's own histogram (job vllm) where ``good_share`` of observations meet ``slo``."""
    return _histogram(slo.histogram, slo.threshold_s, good_share, per_minute, {**VLLM_TARGET, **target})


def _vllm_finished(good_share: float, per_minute: float = 1000, **target: str) -> dict[str, str]:
    """vLLM's finished-requests counter (job vllm) where ``good_share`` finish by stop or length and
    the rest are aborted by their clients."""
    labels = {**VLLM_TARGET, **target}
    good = round(per_minute * good_share)
    reason = catalog.VLLM_FINISHED_REASON_LABEL
    return {selector(catalog.VLLM_REQUESTS_FINISHED, **labels, **{reason: "stop"}): _counter(good),
            selector(catalog.VLLM_REQUESTS_FINISHED, **labels, **{reason: "abort"}): _counter(per_minute - good)}


def _vllm(metric: str, values: str) -> dict[str, str]:
    return {selector(metric, **VLLM_TARGET): values}


SIBLING = {"pod": "vllm-reasoning-5d8c7b9f4-b7n1c", "instance": "10.42.0.18:8000"}  # another replica


def _fleet(preempt_per_minute: float, arrivals_per_minute: float, load: float, sibling_load: float,
           mode: dict[str, str]) -> dict[str, str]:
    """A replica that preempts and keeps getting new requests, its load, and a sibling's load."""
    return {**mode, **_vllm(catalog.VLLM_PREEMPTIONS, _counter(preempt_per_minute)),
            **_histogram(catalog.VLLM_TTFT, catalog.SLO_VLLM_TTFT.threshold_s, 1.0, arrivals_per_minute, VLLM_TARGET),
            **_series(catalog.ROUTER_LOAD.name, _constant(load)),
            selector(catalog.ROUTER_LOAD.name, **{**TARGET, **SIBLING}): _constant(sibling_load)}


def _fleet_quiet() -> dict[str, list[QuietScenario]]:
    """Routing that is right, or a fleet that is simply full."""
    return {"GrowPageFleetRoutesToPreemptingReplica": [
        QuietScenario(_fleet(6, 30, 150, 120, ENFORCE), "every replica full: capacity, not routing"),
        QuietScenario(_fleet(6, 0, 150, 20, ENFORCE), "the router stopped sending to it"),
        QuietScenario(_fleet(6, 30, 80, 20, ENFORCE), "the replica says it has room"),
        QuietScenario(_fleet(1, 30, 150, 20, ENFORCE), "1 preemption a minute"),
        QuietScenario(_fleet(6, 30, 150, 20, OFF), "mode off")]}


def _burn_scenario(burn: catalog.BurnRateWindow, latency: Callable[..., dict[str, str]], budget: float,
                   mode: dict[str, str]) -> Scenario:
    """``latency(good_share, per_minute, **target)``: the histogram series of the SLO being burnt."""
    # Just above this window's limit and below any faster window's, so only this pair trips.
    # Two pods share the errors: the SLO is the service's, whichever pod served.
    total = 1000
    slow = round(total * burn.factor * budget * 1.5)
    other = {"pod": "vllm-reasoning-5d8c7b9f4-b7n1c", "instance": "10.42.0.18:8000"}
    series = {**mode, **latency(1 - slow / total, total), **latency(1 - slow / total, total, **other),
              **{selector(catalog.BUILD_INFO.name, **{**TARGET, **other}, mode="enforce", home="vllm"): _constant(1)}}
    title = f"{burn.long_window}/{burn.short_window} windows at {burn.factor:g}x, two pods"
    return Scenario(series, "1m", dict(SERVICE), slow / total, title,
                    {"long_window": burn.long_window, "short_window": burn.short_window})


def _latency_scenario() -> Scenario:
    # Every grant lands between the 20 ms and 50 ms bounds: p99 interpolates to 49.7 ms.
    histogram = catalog.ALLOCATION_LATENCY.name
    slow_low, slow_high = 0.02, 0.05
    series = {**MONITOR, **_series(f"{histogram}_count", _counter(100))}
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


def _vllm_full(preempt_per_min: float, queue_per_min: float, live: float, pool_free: int = 5) -> dict[str, str]:
    """vLLM's symptom: preemptions at kv_cache_usage_perc 99 % while its queue grows by
    ``queue_per_min``; inside vLLM pages are granted on demand (nothing reserved, granted = used)."""
    return {**_vllm(catalog.VLLM_PREEMPTIONS, _counter(preempt_per_min)),
            **_vllm(catalog.VLLM_KV_CACHE_USAGE, _constant(0.99)),
            **_vllm(catalog.VLLM_REQUESTS_WAITING, _counter(queue_per_min)),
            **_pool(free=pool_free, reserved=0, used=1000 - pool_free),
            **_slots(live=live, granted=(1000 - pool_free) * 16)}


def _stranded_scenarios() -> list[Scenario]:
    # The case the framebuffer rule could not see: vLLM reserved its KV cache at start-up, so the GPU
    # is 92 % full, yet 1 OOM a minute strikes a pool with no free page and a third of its slots live.
    inside_pool = {**ENFORCE, **_series(catalog.OOM_EVENTS.name, _counter(1)), **_dcgm(75_000, 6_500),
                   **_pool(free=5, reserved=400, used=595), **_slots(live=3236, granted=1000 * 16, used=595 * 16)}
    # vLLM's own view, GrowPage monitoring: preemptions at 99 % KV usage with a growing queue, while
    # 70 % of the written slots hold no live token.
    vllm = {**MONITOR, **_vllm_full(1, 2, live=4776)}
    # Six failures counted at the firing evaluation (for: 5m after the first one at 1m).
    return [Scenario(inside_pool, "1m", dict(POD), 6, "GrowPage OOMs, pool empty, GPU framebuffer 92 %"),
            Scenario(vllm, "1m", dict(POD), 6, "vLLM preemptions at kv_cache_usage_perc 99 %, queue growing")]


def _vllm_burn_alerts(t: catalog.MixinThresholds) -> Iterator[tuple[str, Callable[..., dict[str, str]], float,
                                                                     catalog.BurnRateAlert]]:
    """``(alertname, series, error budget, burn-rate alert)`` of each burn-rate alert on vLLM's SLOs;
    ``series(good_share, per_minute=1000, **target)`` are the SLO's input series."""
    events: list[tuple[str, float, Callable[..., dict[str, str]]]] = [
        (slo.name, slo.objective, functools.partial(_vllm_latency, slo)) for slo in t.vllm_latency_slos]
    availability = t.vllm_availability_slo
    events.append((availability.name, availability.objective, _vllm_finished))
    for name, objective, series in events:
        budget = round(1 - objective, 10)
        for alert in t.burn_rate_alerts:
            yield burn_rate_alert_name(alert.speed, VLLM_SLO_ALERT_STEMS[name]), series, budget, alert


def _vllm_burn_scenarios(t: catalog.MixinThresholds) -> dict[str, list[Scenario]]:
    result: dict[str, list[Scenario]] = {}
    for name, series, budget, alert in _vllm_burn_alerts(t):
        result[name] = [_burn_scenario(burn, series, budget, ENFORCE) for burn in alert.windows]
        fast = alert.windows[0]
        # What users feel does not depend on GrowPage: rolled back to off, or its exporter gone.
        pair = f"{fast.long_window}/{fast.short_window}"
        result[name] += [
            dataclasses.replace(_burn_scenario(fast, series, budget, OFF),
                                title=f"{pair}: GrowPage rolled back to off"),
            dataclasses.replace(_burn_scenario(fast, series, budget, {}),
                                title=f"{pair}: no GrowPage series at all")]
    return result


def _replaced_pod(series: Callable[..., dict[str, str]], burn: catalog.BurnRateWindow, mode: dict[str, str]
                  ) -> TimelineScenario:
    """A pod serves 30 % errors for 30 minutes and is then replaced by a healthy pod.

    The slow burn's 2h window still holds the old pod's errors (the per-service recordings outlive its
    series), so the page fires at ``for`` and stays up an hour after the replacement; it resolves once
    the burn has left the short window. An instant join on the pod's current series would forget the
    old pod at once.
    """
    old_pod = {"pod": "vllm-reasoning-5d8c7b9f4-old01", "instance": "10.42.0.19:8000"}
    old_build_info = selector(catalog.BUILD_INFO.name, **{**TARGET, **old_pod}, mode="enforce", home="vllm")
    return replacement_timeline(series(1 - REPLACED_BAD_SHARE, REPLACED_TOTAL, **old_pod),
                                series(1.0, REPLACED_TOTAL), burn, "a pod", dict(SERVICE),
                                {**mode, old_build_info: f"1x{REPLACED_AT_MIN} stale"})


def timeline_scenarios(t: catalog.MixinThresholds = catalog.MIXIN_THRESHOLDS) -> dict[str, list[TimelineScenario]]:
    """Incidents over time per alertname: a pod replaced mid-burn keeps its errors in the budget."""
    result: dict[str, list[TimelineScenario]] = {}
    for name, series, _, alert in _vllm_burn_alerts(t):
        if alert.speed == "slow":
            result[name] = [_replaced_pod(series, alert.windows[0], ENFORCE)]
    latency = functools.partial(_latency, threshold_s=t.allocation_latency_s)
    slow = t.burn_rate_alerts[1]
    result[burn_rate_alert_name(slow.speed)] = [_replaced_pod(latency, slow.windows[0], ENFORCE)]
    return {**result, **router_alert_tests.timeline_scenarios(t)}


def _slow_burn(t: catalog.MixinThresholds) -> float:
    """1.5 times the largest slow-pair factor: a slow burn, below every fast pair's (the fast burn's near miss)."""
    return max(window.factor for window in t.burn_rate_alerts[1].windows) * 1.5


def _vllm_burn_quiet(t: catalog.MixinThresholds) -> dict[str, list[QuietScenario]]:
    result: dict[str, list[QuietScenario]] = {}
    slow = _slow_burn(t)
    for name, series, budget, alert in _vllm_burn_alerts(t):
        near = (QuietScenario({**ENFORCE, **series(1 - slow * budget)}, f"a slow burn ({slow:g}x)")
                if alert.speed == "fast" else
                QuietScenario({**ENFORCE, **series(1 - 0.5 * budget)}, "half the error budget"))
        result[name] = [
            near,
            QuietScenario({**ENFORCE, **series(1.0, 0)}, "healthy idle pod: no requests"),
            QuietScenario({**OFF, **series(1.0, 0)}, "healthy idle pod in mode off"),
            QuietScenario(_starting_pod(), "a pod still loading its model: nothing answers yet"),
        ]
    return result


def _starting_pod() -> dict[str, str]:
    """A pod loading its model: Prometheus scrapes it and fails, so both targets are down and no
    series of either exists yet."""
    return {selector("up", **TARGET): _constant(0), selector("up", **VLLM_TARGET): _constant(0)}


def scenarios(t: catalog.MixinThresholds = catalog.MIXIN_THRESHOLDS) -> dict[str, list[Scenario]]:
    """Breaching scenarios per alertname. Counters start at 0 on 1m samples, so rates are exact.

    The burn-rate scenarios follow ``t`` (SLO thresholds, objectives, factors); the checklist's are
    fixed values, on the default thresholds' sides."""
    ok_running = _running(3)
    throttle = {**ENFORCE, **_series(catalog.DECISIONS.name, _counter(6), decision="throttled"),
                **_series(catalog.DECISIONS.name, _counter(4), decision="allocate")}
    # Compressions in bursts every 10 minutes: the hour-long window sees them from the first burst.
    compressions = {**_series(catalog.COMPRESS_INPUT_BYTES.name, _bursts(1970)),
                    **_series(catalog.COMPRESS_OUTPUT_BYTES.name, _bursts(1000))}
    compress = {**ENFORCE, **compressions}
    inactive = {**ENFORCE,
                **_series(catalog.AGENT_ACTIVE.name, _constant(1), component="observer"),
                **_series(catalog.AGENT_ACTIVE.name, _constant(0), component="enforcer", reason="full_cudagraph")}
    result = {
        **_vllm_burn_scenarios(t),
        # rate() over 5m divides by the whole window: from 0 at 0m it is above 0 from 1m on.
        "GrowPageObservationStale": [Scenario(_observation(steps_per_min=60, observed_per_min=0), "1m",
                                              dict(POD), 1, "60 steps a minute, none observed, observer active")],
        "GrowPageKVUtilizationLow": [Scenario({**ENFORCE, **_slots(500, 1000), **ok_running}, "0m",
                                              dict(SERVICE), 0.5)],
        "GrowPageKVOverGranting": [Scenario({**_build_info("enforce", "reference"), **_slots(300, 1000),
                                             **ok_running}, "0m", dict(POD), 0.3, "reference engine")],
        "GrowPageCompressRatioLow": [
            Scenario(compress, "10m", dict(SERVICE), 1.97, "inside vLLM, compressions in bursts", {"home": "vllm"}),
            Scenario({**compressions, **_build_info("enforce", "reference")}, "10m", dict(SERVICE), 1.97,
                     "reference engine, compressions in bursts", {"home": "reference"})],
        "GrowPageAllocationLatencyHigh": [_latency_scenario()],
        "GrowPageFragmentationHigh": [Scenario({**MONITOR, **_slots(34, 100), **_pool(100, 0, 900)}, "0m",
                                               dict(POD), 0.66, "pool 10 % free")],
        "GrowPageKVPagesStranded": _stranded_scenarios(),
        # rate() over 5m divides by the whole window: from 0 at 0m it passes 0.05/s at 3m.
        "GrowPageVLLMPreemptions": [Scenario({**MONITOR, **_vllm(catalog.VLLM_PREEMPTIONS, _counter(6))}, "3m",
                                             dict(POD), 0.1, "6 preemptions a minute")],
        "GrowPageFleetRoutesToPreemptingReplica": [Scenario(_fleet(6, 30, 150, 20, ENFORCE), "3m", dict(POD), 0.1,
                                                            "load 150 here, 20 on a sibling, still 30 arrivals/min")],
        "GrowPageAgentDown": [Scenario({**_series("up", _constant(0)), selector("up", **VLLM_TARGET): _constant(1)},
                                       "0m", dict(TARGET), 0, "vLLM answers, GrowPage's route does not")],
        "GrowPageMetricsAbsent": [Scenario({selector("up", **VLLM_TARGET): _constant(1)}, "0m",
                                           {"job": catalog.SCRAPE_JOB}, 1, "vLLM answers, no GrowPage target")],
        "GrowPageAgentErrors": [Scenario(_series(catalog.AGENT_ERRORS.name, _counter(2), component="actuator"),
                                         "1m", {**POD, "component": "actuator"}, 10)],
        "GrowPageGrowthThrottled": [Scenario(throttle, "1m", dict(POD), 0.6)],
        "GrowPageAgentInactive": [
            Scenario(inactive, "0m", {**POD, "component": "enforcer", "reason": "full_cudagraph"}, 0),
            Scenario({**OFF, **_series(catalog.AGENT_ACTIVE.name, _constant(0), component="observer",
                                       reason=catalog.AGENT_INVALID_CONFIG_REASON)},
                     "0m", {**POD, "component": "observer", "reason": catalog.AGENT_INVALID_CONFIG_REASON}, 0,
                     "settings GrowPage cannot honour: it runs off, whatever mode was asked")],
    }
    latency = functools.partial(_latency, threshold_s=t.allocation_latency_s)
    budget = round(1 - t.allocation_latency_objective, 10)
    for alert in t.burn_rate_alerts:
        result[burn_rate_alert_name(alert.speed)] = [_burn_scenario(burn, latency, budget, ENFORCE)
                                                     for burn in alert.windows]
    return {**result, **router_alert_tests.scenarios(t)}


def quiet_scenarios(t: catalog.MixinThresholds = catalog.MIXIN_THRESHOLDS) -> dict[str, list[QuietScenario]]:
    """Near misses per alertname: the condition is false, the alert must stay silent."""
    return {**_vllm_burn_quiet(t), **_pool_use_quiet(), **_pressure_quiet(), **_growth_quiet(t), **_agent_quiet(),
            **_fleet_quiet(), **router_alert_tests.quiet_scenarios(t)}


def _pool_use_quiet() -> dict[str, list[QuietScenario]]:
    """How much of the granted KV is live, and how the pool is cut up."""
    other_pod = {"pod": "vllm-reasoning-5d8c7b9f4-b7n1c", "instance": "10.42.0.18:8000"}

    def other(metric: str, values: str, **extra: str) -> dict[str, str]:
        return {selector(metric, **{**TARGET, **other_pod}, **extra): values}

    # One busy pod at 90 % and one small one at 30 %: the service fills 84 % of its slots. The mean
    # of the two ratios (60 %) would have alerted.
    two_pods = {**ENFORCE, **_slots(8100, 9000), **_running(3), **other(catalog.LIVE_TOKENS.name, _constant(300)),
                **other(catalog.GRANTED_TOKEN_SLOTS.name, _constant(1000)),
                **other(catalog.UTILIZATION.name, _constant(0.3)),
                **other(catalog.REQUESTS_RUNNING.name, _constant(1))}
    return {
        "GrowPageKVUtilizationLow": [
            QuietScenario(two_pods, "utilization is summed over pods, not averaged"),
            QuietScenario({**ENFORCE, **_slots(0, 1000), **_running(0)}, "idle: no request running"),
            QuietScenario({**OFF, **_slots(500, 1000), **_running(3)}, "mode off")],
        "GrowPageKVOverGranting": [
            QuietScenario({**_build_info("enforce", "reference"), **_slots(0, 1000), **_running(0)},
                          "idle: no request running"),
            QuietScenario({**_build_info("enforce", "reference"), **_slots(700, 1000), **_running(3)},
                          "utilization 70 %"),
            QuietScenario({**ENFORCE, **_slots(300, 1000), **_running(3)},
                          "inside vLLM: base_pages is a floor, low utilization is slack"),
            QuietScenario({**_build_info("off", "reference"), **_slots(300, 1000), **_running(3)}, "mode off")],
        "GrowPageFragmentationHigh": [
            QuietScenario({**MONITOR, **_slots(34, 100), **_pool(990, 0, 10), **_running(1)},
                          "nearly idle: 1 request, pool 99 % free"),
            QuietScenario({**MONITOR, **_slots(80, 100), **_pool(10, 0, 990)}, "pool short but fragmentation 20 %"),
            QuietScenario({**OFF, **_slots(34, 100), **_pool(100, 0, 900)}, "mode off")],
    }


def _pressure_quiet() -> dict[str, list[QuietScenario]]:
    """A pool that is full for a reason, or preempts rarely: no stranded pages, no preemption storm."""
    stranded_ooms = {**_series(catalog.OOM_EVENTS.name, _counter(1)), **_pool(5, 400, 595),
                     **_slots(3236, 16_000, 9_520)}
    return {
        "GrowPageKVPagesStranded": [
            QuietScenario({**ENFORCE, **_series(catalog.OOM_EVENTS.name, _counter(1)), **_pool(300, 300, 400),
                           **_slots(300, 11_200, 6_400)}, "OOMs but 30 % of the pool is free"),
            QuietScenario({**ENFORCE, **_series(catalog.OOM_EVENTS.name, _counter(1)), **_pool(5, 5, 990),
                           **_slots(15_000, 15_920, 15_840), **_dcgm(75_000, 6_500)},
                          "genuinely full: no free page, 94 % of the slots live"),
            QuietScenario({**MONITOR, **_vllm_full(1, 2, live=15_000)},
                          "vLLM preempts at 99 % with a growing queue, but 94 % of the slots are live"),
            QuietScenario({**MONITOR, **_vllm_full(1, 0, live=4776, pool_free=30)},
                          "vLLM at 99 % (GrowPage's pool 3 % free) but its queue is not growing"),
            QuietScenario({**ENFORCE, **_series(catalog.OOM_EVENTS.name, _constant(0)), **_pool(5, 400, 595),
                           **_slots(300, 16_000, 9_520)}, "stranded pages but no request failed"),
            QuietScenario({**OFF, **stranded_ooms}, "mode off"),
            QuietScenario({**MONITOR, **_vllm(catalog.VLLM_PREEMPTIONS, _constant(0)),
                           **_vllm(catalog.VLLM_KV_CACHE_USAGE, _constant(0)),
                           **_vllm(catalog.VLLM_REQUESTS_WAITING, _constant(0)),
                           **_pool(free=1000, reserved=0, used=0),
                           **{selector(spec.name, **TARGET): _constant(0) for spec in
                              (catalog.LIVE_TOKENS, catalog.GRANTED_TOKEN_SLOTS, catalog.USED_TOKEN_SLOTS)}},
                          "healthy idle pod")],
        "GrowPageVLLMPreemptions": [
            QuietScenario({**MONITOR, **_vllm(catalog.VLLM_PREEMPTIONS, _counter(1))}, "1 preemption a minute"),
            QuietScenario({**MONITOR, **_vllm(catalog.VLLM_PREEMPTIONS, _constant(0))}, "healthy idle pod"),
            QuietScenario({**OFF, **_vllm(catalog.VLLM_PREEMPTIONS, _counter(6))}, "mode off")],
    }


def _growth_quiet(t: catalog.MixinThresholds) -> dict[str, list[QuietScenario]]:
    """GrowPage's own decisions: compressions worth their cost, grants fast enough, growth rarely refused."""
    budget, slow = round(1 - t.allocation_latency_objective, 10), _slow_burn(t)
    latency = functools.partial(_latency, threshold_s=t.allocation_latency_s)
    return {
        "GrowPageCompressRatioLow": [
            QuietScenario({**ENFORCE, **_series(catalog.COMPRESS_INPUT_BYTES.name, _bursts(3000)),
                           **_series(catalog.COMPRESS_OUTPUT_BYTES.name, _bursts(1000))}, "bursts at 3x"),
            QuietScenario({**MONITOR, **_series(catalog.COMPRESS_INPUT_BYTES.name, _constant(0)),
                           **_series(catalog.COMPRESS_OUTPUT_BYTES.name, _constant(0))},
                          "no compressions (mode monitor)"),
            QuietScenario({**OFF, **_series(catalog.COMPRESS_INPUT_BYTES.name, _bursts(1970)),
                           **_series(catalog.COMPRESS_OUTPUT_BYTES.name, _bursts(1000))}, "mode off")],
        "GrowPageAllocationLatencyHigh": [
            QuietScenario({**MONITOR, **latency(1.0, 100)}, f"every grant under {t.allocation_latency_s * 1000:g} ms"),
            QuietScenario({**{k: v for k, v in _latency_scenario().series.items() if "build_info" not in k}, **OFF},
                          "mode off")],
        burn_rate_alert_name("fast"): [
            QuietScenario({**ENFORCE, **latency(1 - slow * budget)}, f"a slow burn ({slow:g}x)"),
            QuietScenario({**OFF, **latency(0.5)}, "mode off")],
        burn_rate_alert_name("slow"): [
            QuietScenario({**ENFORCE, **latency(1 - 0.5 * budget)}, "half the error budget (0.5x)"),
            QuietScenario({**OFF, **latency(0.5)}, "mode off")],
        "GrowPageGrowthThrottled": [
            QuietScenario({**ENFORCE, **_series(catalog.DECISIONS.name, _counter(2), decision="throttled"),
                           **_series(catalog.DECISIONS.name, _counter(8), decision="allocate")}, "20 % throttled"),
            QuietScenario({**MONITOR, **_series(catalog.DECISIONS.name, _counter(6), decision="throttled"),
                           **_series(catalog.DECISIONS.name, _counter(4), decision="allocate")},
                          "mode monitor: nothing is refused for real"),
            QuietScenario({**OFF, **_series(catalog.DECISIONS.name, _counter(6), decision="throttled"),
                           **_series(catalog.DECISIONS.name, _counter(4), decision="allocate")}, "mode off")],
    }


def _observation(steps_per_min: float, observed_per_min: float, observer: str = "active",
                 mode: dict[str, str] = MONITOR) -> dict[str, str]:
    """The vLLM home's step counters and the observer's state."""
    return {**mode, **_series(catalog.VLLM_STEPS.name, _counter(steps_per_min)),
            **_series(catalog.VLLM_OBSERVED_STEPS.name, _counter(observed_per_min)),
            **_series(catalog.AGENT_ACTIVE.name, _constant(1 if observer == "active" else 0), component="observer",
                      reason=observer)}


def _agent_quiet() -> dict[str, list[QuietScenario]]:
    """The agent itself: scraped, exporting, without new faults, its components active or idle by design."""
    enforcing = {**ENFORCE,
                 **_series(catalog.AGENT_ACTIVE.name, _constant(1), component="observer"),
                 **_series(catalog.AGENT_ACTIVE.name, _constant(1), component="enforcer")}
    monitoring = {**MONITOR,
                  **_series(catalog.AGENT_ACTIVE.name, _constant(1), component="observer"),
                  **_series(catalog.AGENT_ACTIVE.name, _constant(0), component="enforcer", reason="mode_monitor")}
    off = {**OFF,
           **_series(catalog.AGENT_ACTIVE.name, _constant(0), component="observer", reason="mode_off"),
           **_series(catalog.AGENT_ACTIVE.name, _constant(0), component="enforcer", reason="mode_off")}
    return {
        "GrowPageAgentDown": [QuietScenario(_series("up", _constant(1)), "scraped"),
                              QuietScenario({**_series("up", _constant(1)), **off},
                                            "mode off: the route answers, nothing runs"),
                              QuietScenario(_starting_pod(), "a pod still loading its model: neither target answers"),
                              QuietScenario({**_series("up", _constant(0)),
                                             selector("up", **{**VLLM_TARGET, **SIBLING}): _constant(1)},
                                            "another pod's vLLM answers: the join is per pod")],
        "GrowPageMetricsAbsent": [QuietScenario({**_series("up", _constant(1)), **MONITOR}, "build info present"),
                                  QuietScenario({**_series("up", _constant(1)), **OFF}, "mode off exports it too"),
                                  QuietScenario(_starting_pod(), "the only pod still loading its model")],
        "GrowPageAgentErrors": [QuietScenario(_series(catalog.AGENT_ERRORS.name, _constant(3), component="actuator"),
                                              "old faults, none new")],
        "GrowPageObservationStale": [
            QuietScenario(_observation(60, 15), "one step in four observed (observe_every_steps 4, or the eager "
                          "steps under full CUDA graphs)"),
            QuietScenario(_observation(0, 0), "healthy idle pod: no step ran"),
            QuietScenario(_observation(60, 0, "full_cudagraph"), "the observer says it is inactive "
                          "(GrowPageAgentInactive's case)"),
            QuietScenario(_observation(60, 0, "mode_off", OFF), "mode off")],
        "GrowPageAgentInactive": [QuietScenario(enforcing, "every component active"),
                                  QuietScenario({**MONITOR, **_series(catalog.AGENT_ACTIVE.name, _constant(0),
                                                                      component="observer",
                                                                      reason=catalog.AGENT_STARTING_REASON)},
                                                "vLLM still loading the model (starting)"),
                                  QuietScenario(monitoring, "mode monitor: the enforcer idles by design"),
                                  QuietScenario(off, "mode off: inactive by design")],
    }


def _expected_alert(rule: AlertRule, scenario: Scenario) -> dict:
    labels = {**scenario.labels, "severity": rule.severity, **rule.labels}
    annotations = {key: render(text, labels, scenario.value) for key, text in rule.annotations().items()}
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


def _timeline_case(rule: AlertRule, timeline: TimelineScenario) -> dict:
    labels = {"alertname": rule.name, "alertstate": "firing", **timeline.labels, "severity": rule.severity,
              **rule.labels}
    series = selector("ALERTS", **dict(sorted(labels.items())))
    watched = selector("ALERTS", alertname=rule.name, alertstate="firing", **rule.labels)
    return {
        "name": f"{rule.name} ({timeline.title}): " + ", ".join(
            f"{'firing' if firing else 'silent'} at {at}" for at, firing in timeline.firing),
        "interval": EVALUATION_INTERVAL,
        "input_series": [{"series": name, "values": values} for name, values in timeline.series.items()],
        "promql_expr_test": [{"expr": watched, "eval_time": at,
                              "exp_samples": [{"labels": series, "value": 1}] if firing else []}
                             for at, firing in timeline.firing],
    }


def quiet_eval_time(rules: list[AlertRule]) -> str:
    """Well past every ``for`` of the alertname and the windows its rules read (the longest burn
    window is 3d: capped by the input series, 200 minutes)."""
    longest = max(duration_seconds(rule.for_duration) for rule in rules)
    return format_duration(min(longest + 3600, (SAMPLES - 10) * 60))


def _quiet_case(rules: list[AlertRule], quiet: QuietScenario) -> dict:
    return {
        "name": f"{rules[0].name} stays silent: {quiet.title}",
        "interval": EVALUATION_INTERVAL,
        "input_series": [{"series": name, "values": values} for name, values in quiet.series.items()],
        "alert_rule_test": [{"eval_time": quiet_eval_time(rules), "alertname": rules[0].name, "exp_alerts": []}],
    }


def scenario_rule(rules: list[AlertRule], scenario: Scenario | TimelineScenario) -> AlertRule:
    """The rule of an alertname that ``scenario`` breaches (matched on the window-pair labels)."""
    matching = [rule for rule in rules if all(scenario.rule_labels.get(k) == v for k, v in rule.labels.items())]
    if len(matching) != 1:
        raise KeyError(f"scenario {scenario.title!r} of {rules[0].name} must pick one rule by its labels")
    return matching[0]


def alert_test_files(config: MixinConfig = DEFAULT_CONFIG) -> dict[str, dict]:
    """``{AlertName: test file document}``: one file per alertname, one test per scenario, quiet ones last."""
    firing, quiet = scenarios(config.thresholds), quiet_scenarios(config.thresholds)
    timelines = timeline_scenarios(config.thresholds)
    files: dict[str, dict] = {}
    for name, rules in rules_by_name(config).items():
        if name not in firing or not quiet.get(name):
            raise KeyError(f"alert {name} needs a firing and a quiet promtool scenario; add them in "
                           "alert_tests.py")
        files[name] = {
            "rule_files": [RULES_FILE_FROM_TESTS],
            "evaluation_interval": EVALUATION_INTERVAL,
            "tests": [*(_test_case(scenario_rule(rules, scenario), scenario) for scenario in firing[name]),
                      *(_quiet_case(rules, scenario) for scenario in quiet[name]),
                      *(_timeline_case(scenario_rule(rules, timeline), timeline)
                        for timeline in timelines.get(name, []))],
        }
    return files
