"""vLLM's router (vllm-router), the fleet's entry point: its recording rules and alerts.

The router's series carry the router pod's namespace and pod (from the scrape) and the worker's URL;
no model name. Its alerts are per namespace, across the router's pods (deploy/components/router runs
two): clients reach whichever router pod is Ready, so one router pod's trouble is nobody's while
another serves.

Availability at the entry point: a request counts as failed when every attempt the router made
failed (``vllm_router_retries_exhausted_total``: a worker's 5xx, a connection error, no available
worker) and as answered when a worker's answer reached the client (``vllm_router_requests_total``,
which counts only those). A worker's 4xx (the client's error, ``request_errors_total`` with
``error_type="non_retryable_error"``) is in neither. The objective is the replicas' availability
objective, read where clients stand: failures no replica sees (a replica down, every circuit
open) count here.
"""

from __future__ import annotations

import dataclasses

from growpage import catalog
from growpage.monitoring.alert_rule import FLEET_DASHBOARD, AlertRule, burn_rules
from growpage.monitoring.mixin import DEFAULT_CONFIG, MixinConfig
from growpage.monitoring.promql import selector
from growpage.monitoring.recording_rules import SLO_BASE_WINDOW, RecordingRule, slo_windows

AVAILABILITY_STEM = "RouterAvailability"  # GrowPageRouterAvailabilityFastBurn / SlowBurn
NO_HEALTHY_WORKER = "GrowPageRouterNoHealthyWorker"
ROUTER_DOWN = "GrowPageRouterDown"
# Panel titles on GrowPage / Fleet, shared with growpage.monitoring.dashboards.fleet.
PANEL_WORKER_HEALTH = "Worker health as the router sees it"
PANEL_ERROR_RATIO = "Router: share of requests failed"
PANEL_SCRAPE = "Router pods answering their scrape (up)"
_LEVEL = "namespace"  # recording rules keep the cluster and the namespace
_WHERE = "{{ $labels.namespace }} (vLLM's router)"
_DIAGNOSE = ("Run: gpctl diagnose --prometheus {{ $externalURL }} --since 1h --namespace {{ $labels.namespace }}")
SUCCEEDED_RATE = f"{_LEVEL}:vllm_router_requests_succeeded:rate{SLO_BASE_WINDOW}"
FAILED_RATE = f"{_LEVEL}:vllm_router_requests_failed:rate{SLO_BASE_WINDOW}"
TOTAL_RATE = f"{_LEVEL}:vllm_router_requests:rate{SLO_BASE_WINDOW}"


def failed_ratio_name(window: str) -> str:
    """The recording of the share of the router's requests that failed over ``window``, per namespace."""
    return f"{_LEVEL}:vllm_router_requests_failed:ratio_rate{window}"


def _level(config: MixinConfig) -> str:
    return f"{config.cluster_label}, {_LEVEL}"


def recording_rules(config: MixinConfig = DEFAULT_CONFIG) -> list[RecordingRule]:
    """The base window's answered, failed and total request rates per namespace, then the failed share
    over every burn window from them (the long windows sum recorded samples, like the SLOs')."""
    level = _level(config)

    def rate(series: str) -> str:
        return f"sum by ({level}) (rate({selector(series, job=config.router_job)}[{SLO_BASE_WINDOW}]))"

    # Either counter appears only on its first increment: a router that never answered (or never
    # failed) has one of the two, and the total is then that one alone.
    total = (f"({SUCCEEDED_RATE} + {FAILED_RATE})\nor\n{SUCCEEDED_RATE}\nor\n{FAILED_RATE}")
    rules = [RecordingRule(SUCCEEDED_RATE, rate(catalog.ROUTER_REQUESTS)),
             RecordingRule(FAILED_RATE, rate(catalog.ROUTER_REQUESTS_FAILED)),
             RecordingRule(TOTAL_RATE, total)]
    for window in slo_windows():
        expr = (f"{FAILED_RATE}\n/\n{TOTAL_RATE}" if window == SLO_BASE_WINDOW else
                f"sum_over_time({FAILED_RATE}[{window}])\n/\nsum_over_time({TOTAL_RATE}[{window}])")
        rules.append(RecordingRule(failed_ratio_name(window), expr))
    return [dataclasses.replace(rule, expr=config.scoped(rule.expr)) for rule in rules]


def _availability_alerts(config: MixinConfig) -> list[AlertRule]:
    t = config.thresholds
    objective = t.vllm_availability_objective
    rules = burn_rules(
        AVAILABILITY_STEM, failed_ratio_name, objective, "Requests through vLLM's router fail too often",
        f"the requests the router handled over the long window failed after every retry "
        f"({catalog.ROUTER_REQUESTS_FAILED}: the replicas answered 5xx, could not be reached, or none was "
        f"available); SLO: {objective * 100:g} % of requests answered, the replicas' availability objective "
        f"read at the entry point", PANEL_ERROR_RATIO, burn_alerts=t.burn_rate_alerts, where=_WHERE,
        diagnose=_DIAGNOSE)
    return [dataclasses.replace(rule, dashboard=FLEET_DASHBOARD) for rule in rules]


def _no_healthy_worker_alert(config: MixinConfig) -> AlertRule:
    level = _level(config)
    health = selector(catalog.ROUTER_WORKER_HEALTH, job=config.router_job)
    workers = selector(catalog.ROUTER_ACTIVE_WORKERS, job=config.router_job)
    # max over every router pod and worker: one router pod with a healthy worker serves (a router with
    # none fails its readiness probe and leaves the Service). No worker at all (service discovery found
    # no replica) is the same outage.
    expr = f"max by ({level}) ({health}) == 0\nor\nmax by ({level}) ({workers}) == 0"
    wait = catalog.ROUTER_ALERT_FOR.no_healthy_worker
    return AlertRule(
        NO_HEALTHY_WORKER, expr, wait, "vLLM's router has no healthy replica to send requests to",
        f"{_WHERE}: no router pod that answers its scrape has a healthy worker (the router's health checks "
        f"of every replica's GET /health fail, or it knows no replica), for {wait}: every request through "
        f"the router fails, while the replicas' own latency alerts see no traffic at all. {_DIAGNOSE}",
        PANEL_WORKER_HEALTH, dashboard=FLEET_DASHBOARD)


def _router_down_alert(config: MixinConfig) -> AlertRule:
    level = _level(config)
    router_up, vllm_up = selector("up", job=config.router_job), selector("up", job=config.vllm_job)
    expr = (f"count by ({level}) ({router_up} == 0)\nand on ({level})\n"
            f"max by ({level}) ({vllm_up}) == 1")
    wait = catalog.ROUTER_ALERT_FOR.router_down
    return AlertRule(
        ROUTER_DOWN, expr, wait, "vLLM's router pods stop answering their scrape while the replicas serve",
        f"{_WHERE}: {{{{ $value | humanize }}}} router target(s) (job {config.router_job}, port "
        f"{catalog.ROUTER_METRICS_PORT}) failed every scrape for {wait} while the namespace's vLLM replicas "
        f"(job {config.vllm_job}) answer. While another router pod is up, clients keep their entry point and "
        f"the router's alerts see only the pods that answer; when none is, clients have lost it: "
        f"count by (namespace) (up{{job=\"{config.router_job}\"}} == 1) says which. {_DIAGNOSE}",
        PANEL_SCRAPE, dashboard=FLEET_DASHBOARD)


def alerts(config: MixinConfig = DEFAULT_CONFIG) -> list[AlertRule]:
    """The router's alerts, scoped by the config's selectors: no healthy worker, availability burns,
    router targets down."""
    rules = [_no_healthy_worker_alert(config), *_availability_alerts(config), _router_down_alert(config)]
    return [dataclasses.replace(rule, config=config, expr=config.scoped(rule.expr)) for rule in rules]

