"""promtool scenarios for vLLM's router alerts (``router_rules``): each breaches one rule, or comes close.

The router runs two pods in one namespace (deploy/components/router); its series name each worker by
URL, as vllm-router 0.1.17 exports them.
"""

from __future__ import annotations

from growpage import catalog
from growpage.monitoring.alert_rule import burn_rate_alert_name
from growpage.monitoring.alert_scenario import (
    REPLACED_BAD_SHARE,
    REPLACED_TOTAL,
    QuietScenario,
    Scenario,
    TimelineScenario,
    constant,
    counter,
    replacement_timeline,
)
from growpage.monitoring.promql import selector
from growpage.monitoring.router_rules import AVAILABILITY_STEM, NO_HEALTHY_WORKER, ROUTER_DOWN

NAMESPACE = {"namespace": "math-reasoning"}
ROUTERS = ({"pod": "vllm-router-6b8f9c7d5-k2m4p", "instance": "10.42.0.30:29000"},
           {"pod": "vllm-router-6b8f9c7d5-r7t9w", "instance": "10.42.0.31:29000"})
WORKERS = ("http://vllm-reasoning-0.vllm-reasoning-peers:8000", "http://vllm-reasoning-1.vllm-reasoning-peers:8000")
REPLICA = {**NAMESPACE, "job": catalog.VLLM_SCRAPE_JOB, "pod": "vllm-reasoning-0", "instance": "10.42.0.17:8000"}


REPLACEMENT = {"pod": "vllm-router-6b8f9c7d5-n3w5z", "instance": "10.42.0.32:29000"}  # a new router pod


def _router(metric: str, values: str, router: int = 0, **extra: str) -> dict[str, str]:
    return _router_pod(metric, values, ROUTERS[router], **extra)


def _router_pod(metric: str, values: str, pod: dict[str, str], **extra: str) -> dict[str, str]:
    return {selector(metric, job=catalog.ROUTER_SCRAPE_JOB, **NAMESPACE, **pod, **extra): values}


def _pod_requests(answered_share: float, per_minute: float, pod: dict[str, str]) -> dict[str, str]:
    """One router pod's answered and failed counters (each only where it grows)."""
    failed = round(per_minute * (1 - answered_share))
    route = {"route": "/v1/completions"}
    series: dict[str, str] = {}
    if per_minute - failed:
        series |= _router_pod(catalog.ROUTER_REQUESTS, counter(per_minute - failed), pod, **route)
    if failed:
        series |= _router_pod(catalog.ROUTER_REQUESTS_FAILED, counter(failed), pod, **route)
    return series


def _health(*healthy: tuple[int, ...], workers: int = len(WORKERS)) -> dict[str, str]:
    """Each router pod's health gauge per worker (1 healthy), and its count of workers."""
    series: dict[str, str] = {}
    for router, states in enumerate(healthy):
        series |= _router(catalog.ROUTER_ACTIVE_WORKERS, constant(workers), router)
        for worker, state in zip(WORKERS, states, strict=True):
            series |= _router(catalog.ROUTER_WORKER_HEALTH, constant(state), router, worker=worker)
    return series


def _requests(failed_share: float, per_minute: float = 1000) -> dict[str, str]:
    """Both router pods answer and fail requests at ``failed_share`` of ``per_minute`` each; a counter
    that never grows is not exported (the router creates it on its first increment)."""
    failed = round(per_minute * failed_share)
    series: dict[str, str] = {}
    for router in range(len(ROUTERS)):
        if per_minute - failed:
            series |= _router(catalog.ROUTER_REQUESTS, counter(per_minute - failed), router, route="/v1/completions")
        if failed:
            series |= _router(catalog.ROUTER_REQUESTS_FAILED, counter(failed), router, route="/v1/completions")
    return series


def _up(router_up: tuple[int, ...], replica_up: int = 1) -> dict[str, str]:
    series = {selector("up", **REPLICA): constant(replica_up)}
    for router, up in enumerate(router_up):
        series |= _router("up", constant(up), router)
    return series


def _burn_scenarios(t: catalog.MixinThresholds) -> dict[str, list[Scenario]]:
    budget = round(1 - t.vllm_availability_objective, 10)
    result: dict[str, list[Scenario]] = {}
    for alert in t.burn_rate_alerts:
        name = burn_rate_alert_name(alert.speed, AVAILABILITY_STEM)
        # Just above each pair's limit and below any faster pair's, so only this pair trips.
        result[name] = [Scenario(_requests(burn.factor * budget * 1.5), "1m", dict(NAMESPACE),
                                 round(burn.factor * budget * 1.5 * 1000) / 1000,
                                 f"{burn.long_window}/{burn.short_window} windows at {burn.factor:g}x, two router pods",
                                 {"long_window": burn.long_window, "short_window": burn.short_window})
                        for burn in alert.windows]
    fast = t.burn_rate_alerts[0].windows[0]
    result[burn_rate_alert_name("fast", AVAILABILITY_STEM)].append(Scenario(
        _requests(1.0), "1m", dict(NAMESPACE), 1.0, "every request fails: no answered request was ever counted",
        {"long_window": fast.long_window, "short_window": fast.short_window}))
    return result


def scenarios(t: catalog.MixinThresholds = catalog.MIXIN_THRESHOLDS) -> dict[str, list[Scenario]]:
    """Breaching scenarios of the router's alerts."""
    return {
        NO_HEALTHY_WORKER: [
            Scenario(_health((0, 0), (0, 0)), "0m", dict(NAMESPACE), 0, "both router pods see both workers unhealthy"),
            Scenario(_router(catalog.ROUTER_ACTIVE_WORKERS, constant(0)), "0m", dict(NAMESPACE), 0,
                     "service discovery found no replica")],
        ROUTER_DOWN: [Scenario(_up((0, 1)), "0m", dict(NAMESPACE), 1, "one of two router pods down, replicas up")],
        **_burn_scenarios(t),
    }


def quiet_scenarios(t: catalog.MixinThresholds = catalog.MIXIN_THRESHOLDS) -> dict[str, list[QuietScenario]]:
    """Near misses of the router's alerts."""
    budget = round(1 - t.vllm_availability_objective, 10)
    slow = max(window.factor for window in t.burn_rate_alerts[1].windows) * 1.5
    client_errors = {key: value for router in range(len(ROUTERS)) for key, value in _router(
        catalog.ROUTER_REQUEST_ERRORS, counter(300), router, route="/v1/completions",
        error_type="non_retryable_error").items()}
    idle = {**_requests(0.0, per_minute=0), **_health((1, 1), (1, 1))}
    return {
        NO_HEALTHY_WORKER: [
            QuietScenario(_health((0, 0), (0, 1)), "one router pod still has a healthy worker (the other leaves "
                          "the Service)"),
            QuietScenario(idle, "idle: every worker healthy, no request")],
        ROUTER_DOWN: [
            QuietScenario(_up((1, 1)), "both router pods answer"),
            QuietScenario(_up((0, 0), replica_up=0), "the replicas are down too (their own alerts)"),
            QuietScenario({**_router("up", constant(0)),
                           selector("up", **{**REPLICA, "namespace": "chat"}): constant(1)},
                          "replicas answer in another namespace only")],
        burn_rate_alert_name("fast", AVAILABILITY_STEM): [
            QuietScenario(_requests(slow * budget), f"a slow burn ({slow:g}x)"),
            QuietScenario({**_requests(0.0, per_minute=700), **client_errors}, "30 % client errors (a worker's 4xx)"),
            QuietScenario(idle, "idle: no request")],
        burn_rate_alert_name("slow", AVAILABILITY_STEM): [
            QuietScenario(_requests(0.5 * budget), "half the error budget (0.5x)"),
            QuietScenario(idle, "idle: no request")],
    }


def timeline_scenarios(t: catalog.MixinThresholds = catalog.MIXIN_THRESHOLDS) -> dict[str, list[TimelineScenario]]:
    """A router pod failing requests for 30 minutes, then replaced by a healthy one (a rollout, an
    eviction): the slow burn keeps the old pod's failures, recorded per namespace."""
    slow = t.burn_rate_alerts[1].windows[0]
    old = _pod_requests(1 - REPLACED_BAD_SHARE, REPLACED_TOTAL, ROUTERS[0])
    new = _pod_requests(1.0, REPLACED_TOTAL, REPLACEMENT)
    return {burn_rate_alert_name("slow", AVAILABILITY_STEM): [
        replacement_timeline(old, new, slow, "a router pod", dict(NAMESPACE))]}
