"""The GrowPage / Fleet rows that read vLLM's router itself (job ``vllm-router``): where it sends each
request, which replicas it counts as healthy, how many requests it holds per replica, what share fails.

The router's series carry the router pod's namespace and the worker's URL; they are filtered by the
cluster and namespace variables only (the pod variable names replicas, not router pods).
"""

from __future__ import annotations

from growpage import catalog
from growpage.monitoring import router_rules
from growpage.monitoring.alert_rule import burn_rate_alert_name
from growpage.monitoring.dashboards.common import RATE, Cell, runbook_links, steps, targets, timeseries
from growpage.monitoring.promql import selector

ROUTER_FILTER = f'cluster=~"$cluster", namespace=~"$namespace", job="{catalog.ROUTER_SCRAPE_JOB}"'
RULE_FILTER = 'cluster=~"$cluster", namespace=~"$namespace"'
PANEL_CHOICES = "Router: requests sent to each worker"
PANEL_IN_FLIGHT = "Router: requests in flight per worker (its own count)"
_WORKER_LEGEND = "{{namespace}} {{worker}}"
_FAST, _SLOW = (burn_rate_alert_name(speed, router_rules.AVAILABILITY_STEM) for speed in ("fast", "slow"))


def _router(name: str) -> str:
    return selector(name, ROUTER_FILTER)


def _choices() -> Cell:
    sent = f"sum by (namespace, worker) (rate({_router(catalog.ROUTER_PROCESSED_REQUESTS)}[{RATE}]))"
    decided = (f"sum by (namespace, policy, worker) "
               f"(rate({_router(catalog.ROUTER_POLICY_DECISIONS)}[{RATE}]))")
    return Cell(timeseries(
        PANEL_CHOICES, f"Attempts the router sent to each worker per second ({catalog.ROUTER_PROCESSED_REQUESTS}), "
        f"and the policy's choices among them ({catalog.ROUTER_POLICY_DECISIONS}; with one healthy worker left "
        "the router skips the policy). Under power_of_two they follow the load panel above: the replica that "
        "reports more room gets more.",
        targets((sent, _WORKER_LEGEND), (decided, "{{namespace}} {{policy}} -> {{worker}}")), "reqps"), 8)


def _health() -> Cell:
    health = f"min by (namespace, worker) ({_router(catalog.ROUTER_WORKER_HEALTH)})"
    return Cell(timeseries(
        router_rules.PANEL_WORKER_HEALTH, f"{catalog.ROUTER_WORKER_HEALTH}: 1 while the router's health checks of "
        "the worker (GET /health, every 60 s by default, 3 failures to mark it down) pass, 0 after; the lowest "
        "over the router's pods. " + runbook_links(router_rules.NO_HEALTHY_WORKER),
        targets((health, _WORKER_LEGEND)), "short", steps("red", (1.0, "green"))), 8)


def _in_flight() -> Cell:
    running = f"sum by (namespace, worker) ({_router(catalog.ROUTER_RUNNING_REQUESTS)})"
    return Cell(timeseries(
        PANEL_IN_FLIGHT, f"{catalog.ROUTER_RUNNING_REQUESTS}: requests the router has sent to each worker and not "
        "seen finish, over its pods: the load it compares when a worker does not answer GET /get_load "
        "(service discovery, or vLLM alone).",
        targets((running, _WORKER_LEGEND)), "short"), 8)


def _errors(t: catalog.MixinThresholds) -> Cell:
    budget = round(1 - t.vllm_availability_objective, 10)
    # The failed counter appears on the first failure: until then the share is 0, not missing.
    ratio = (f"{selector(router_rules.failed_ratio_name(catalog.RATE_WINDOW), RULE_FILTER)}\nor\n"
             f"0 * {selector(router_rules.SUCCEEDED_RATE, RULE_FILTER)}")
    return Cell(timeseries(
        router_rules.PANEL_ERROR_RATIO, f"Share of the router's requests that failed after every retry over "
        f"{catalog.RATE_WINDOW} ({catalog.ROUTER_REQUESTS_FAILED} over answered plus failed; a worker's 4xx is "
        f"the client's and not counted). The line is the error budget ({budget:.0%}). Why they failed, per "
        f"attempt: {catalog.ROUTER_REQUEST_ERRORS} by error_type. " + runbook_links(_FAST, _SLOW),
        targets((ratio, "{{namespace}}")), "percentunit", steps("green", (budget, "red"))), 12)


def _scrape() -> Cell:
    up = f"max by (namespace, pod) ({_router('up')})"
    return Cell(timeseries(
        router_rules.PANEL_SCRAPE, f"up of job {catalog.ROUTER_SCRAPE_JOB} (the router's --prometheus-port "
        f"{catalog.ROUTER_METRICS_PORT}), one line per router pod: clients keep the entry point while one is up. "
        + runbook_links(router_rules.ROUTER_DOWN), targets((up, "{{namespace}}/{{pod}}")), "short",
        steps("red", (1.0, "green"))), 12)


def router_rows(t: catalog.MixinThresholds) -> list[tuple[str, list[Cell]]]:
    """The router's rows: its choices and its view of the workers, then its errors and its own scrape."""
    return [("vLLM's router: where it sends requests, which workers it counts as healthy",
             [_choices(), _health(), _in_flight()]),
            ("vLLM's router: failed requests and its own scrape", [_errors(t), _scrape()])]
