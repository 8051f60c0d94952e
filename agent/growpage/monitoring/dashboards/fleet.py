"""``GrowPage / Fleet``: the replicas behind vLLM's router side by side, and where the router sends work.

One line per replica (pod) in the replicas' panels: the KV headroom each one reports (free plus
reclaimable pages), what it answers the router's ``/get_load``, and whether new requests keep arriving
at a replica while it preempts (``GrowPageFleetRoutesToPreemptingReplica``). Then the router's own
series, one line per worker (:mod:`growpage.monitoring.dashboards.router`).
"""

from __future__ import annotations

from typing import Any

from growpage import catalog
from growpage.monitoring.alert_rule import FLEET_DASHBOARD
from growpage.monitoring.alert_rules import PANEL_FLEET_LOAD
from growpage.monitoring.dashboards.common import (
    RATE,
    VLLM_FILTER,
    Cell,
    dashboard,
    metric,
    runbook_links,
    steps,
    targets,
    timeseries,
)
from growpage.monitoring.dashboards.router import router_rows
from growpage.monitoring.promql import selector

UID = "growpage-fleet"
TITLE = FLEET_DASHBOARD
FLEET_ALERT = "GrowPageFleetRoutesToPreemptingReplica"
_POD_LEGEND = "{{namespace}}/{{pod}}"
PANEL_LOAD = PANEL_FLEET_LOAD
PANEL_ARRIVALS = "New requests per second per replica"
PANEL_PREEMPTIONS = "vLLM preemptions per second per replica"


def _per_pod(expr: str) -> str:
    return f"sum by (namespace, pod) ({expr})"


def load_panel(t: catalog.MixinThresholds = catalog.MIXIN_THRESHOLDS) -> Any:
    """Each replica's answer to the router's poll; on the Troubleshooting dashboard too (the fleet alert's panel)."""
    full = t.fleet_load_full
    return timeseries(PANEL_LOAD, catalog.ROUTER_LOAD.help + f" At {full:g} and above the replica holds all it "
                      "can without preempting; vLLM's router (power_of_two) sends to the lower of two. "
                      + runbook_links(FLEET_ALERT),
                      targets((f"max by (namespace, pod) ({metric(catalog.ROUTER_LOAD.name)})", _POD_LEGEND)),
                      "percent", steps("green", (full, "red")))


def _headroom_row(t: catalog.MixinThresholds) -> list[Cell]:
    return [
        Cell(timeseries("KV headroom per replica", catalog.HEADROOM_PAGES.help + " More is room the router can use.",
                        targets((_per_pod(metric(catalog.HEADROOM_PAGES.name)), _POD_LEGEND)), "short"), 8),
        Cell(timeseries("Reclaimable pages per replica", catalog.RECLAIMABLE_PAGES.help,
                        targets((_per_pod(metric(catalog.RECLAIMABLE_PAGES.name)), _POD_LEGEND)), "short"), 8),
        Cell(load_panel(t), 8),
    ]


def _routing_row(t: catalog.MixinThresholds) -> list[Cell]:
    def vllm(name: str) -> str:
        return selector(name, VLLM_FILTER)

    arrivals = f"rate({vllm(f'{catalog.VLLM_TTFT}_count')}[{RATE}])"
    preemptions = f"rate({vllm(catalog.VLLM_PREEMPTIONS)}[{RATE}])"
    return [
        Cell(timeseries(PANEL_ARRIVALS, f"Requests that got their first token, per second (rate of "
                        f"{catalog.VLLM_TTFT}_count): where the router has been sending work. "
                        + runbook_links(FLEET_ALERT), targets((_per_pod(arrivals), _POD_LEGEND)), "reqps"), 12),
        Cell(timeseries(PANEL_PREEMPTIONS, f"rate({catalog.VLLM_PREEMPTIONS}): requests evicted for want of KV. "
                        "Arrivals at a replica that preempts, while another has headroom, are the router's to "
                        "fix. " + runbook_links(FLEET_ALERT, "GrowPageVLLMPreemptions"),
                        targets((_per_pod(preemptions), _POD_LEGEND)), "ops",
                        steps("green", (t.vllm_preemptions_per_s_high, "red"))), 12),
    ]


def _replica_state_row(t: catalog.MixinThresholds) -> list[Cell]:
    """What each replica's vLLM says of itself: KV in use, its queue, and its users' first-token p99."""
    def vllm(name: str) -> str:
        return selector(name, VLLM_FILTER)

    ttft_p99 = (f"histogram_quantile(0.99, sum by (namespace, pod, le) "
                f"(rate({vllm(f'{catalog.VLLM_TTFT}_bucket')}[{RATE}])))")
    return [
        Cell(timeseries("vLLM KV cache usage per replica",
                        f"{catalog.VLLM_KV_CACHE_USAGE}: the share of vLLM's KV blocks in use (0-1). Near "
                        f"{t.checklist.vllm_kv_cache_usage_full:.0%} with a queue the replica is full.",
                        targets((f"max by (namespace, pod) ({vllm(catalog.VLLM_KV_CACHE_USAGE)})", _POD_LEGEND)),
                        "percentunit", steps("green", (t.checklist.vllm_kv_cache_usage_full, "red"))), 8),
        Cell(timeseries("Requests waiting per replica",
                        f"{catalog.VLLM_REQUESTS_WAITING}: requests queued for KV blocks or a batch slot; the HPA "
                        f"scales at {catalog.HPA_TARGET_WAITING_PER_POD} per pod.",
                        targets((_per_pod(vllm(catalog.VLLM_REQUESTS_WAITING)), _POD_LEGEND)), "short",
                        steps("green", (float(catalog.HPA_TARGET_WAITING_PER_POD), "red"))), 8),
        Cell(timeseries("Time to first token p99 per replica",
                        f"What users of each replica feel (SLO: {t.vllm_latency_slos[0].description}) "
                        + runbook_links("GrowPageVLLMTimeToFirstTokenFastBurn"),
                        targets((ttft_p99, _POD_LEGEND)), "s",
                        steps("green", (t.vllm_ttft_s, "red"))), 8),
    ]


def fleet_dashboard(t: catalog.MixinThresholds = catalog.MIXIN_THRESHOLDS) -> dict:
    """The dashboard with the thresholds ``t`` (full load, the preemption rate)."""
    return dashboard(TITLE, UID, "Replicas behind vLLM's router side by side: KV headroom, the load each one "
                     "reports, and where the router sends work.", [
                         ("Where the router can send work: headroom and load per replica", _headroom_row(t)),
                         ("Each replica's own state: KV in use, queue, first-token latency", _replica_state_row(t)),
                         ("Is the router sending work to a replica that preempts?", _routing_row(t)),
                         *router_rows(t),
                     ])
