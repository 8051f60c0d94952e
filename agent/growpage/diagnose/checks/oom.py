"""Checklist step 4: OOMs or preemptions while KV pages are stranded.

Read inside the KV pool, where the failure happens: the lowest free share of the pool, and the
highest share of granted token slots that held no live token (reserved-but-unwritten pages, tail
slack, eviction holes). The GPU framebuffer is context only: vLLM reserves its KV cache at start-up
(``gpu_memory_utilization``), so on vLLM it is always "full".

In a paged pool, fragmentation is slack inside written pages, not address-space holes:
PagedAttention needs no contiguous pages.
"""

from __future__ import annotations

from growpage import catalog
from growpage.diagnose.checks import advice
from growpage.diagnose.checks.base import Thresholds, evidence, in_modes, missing, pct
from growpage.diagnose.findings import ScopeFinding, Severity, Status, alert_finding
from growpage.diagnose.observations import Scope, Window

NO_GROWPAGE_IN_VLLM_NOTE = advice.NO_GROWPAGE_IN_VLLM_NOTE


def oom_fragmentation(scope: Scope, window: Window, t: Thresholds) -> ScopeFinding:
    metric = catalog.OOM_EVENTS.name
    preempt = scope.decisions.get("preempt") if scope.decisions else None
    fragmentation = scope.fragmentation.max if scope.fragmentation is not None else None
    if (scope.oom_events is None and preempt is None and scope.vllm_preemptions is None
            and fragmentation is None):
        return missing(scope, metric, window, f"{metric}, growpage_decisions_total{{decision=\"preempt\"}}, "
                       f"{catalog.VLLM_PREEMPTIONS} or {catalog.FRAGMENTATION.name}")
    ooms, preemptions, vllm_preemptions = scope.oom_events or 0.0, preempt or 0.0, scope.vllm_preemptions or 0.0
    free_min, stranded = scope.pool_free_fraction_min, scope.stranded_slots_max
    limits = t.checklist
    per_s = (vllm_preemptions / window.duration_s if window.kind != "lifetime" and window.duration_s > 0
             else None)
    proof = _evidence(scope, window, t, preemptions, per_s, fragmentation)
    if not in_modes(scope, catalog.MODES_OBSERVING):
        return ScopeFinding(Status.OK, "mode off: GrowPage observes no page here", proof)
    failures = ooms + preemptions + vllm_preemptions
    events = f"{ooms:,.0f} OOM events, {preemptions + vllm_preemptions:,.0f} preemptions"
    growpage_full = free_min is not None and free_min <= limits.pool_free_low
    vllm_full = (scope.vllm_kv_cache_usage_max is not None
                 and scope.vllm_kv_cache_usage_max >= limits.vllm_kv_cache_usage_full
                 and (scope.vllm_queue_growth or 0) > 0)
    is_stranded = stranded is not None and stranded >= limits.stranded_slots_high
    short = free_min is not None and free_min < limits.fragmentation_pool_free_max
    alerts: list[str] = []
    parts: list[str] = []
    steps: list[str] = []
    if failures > 0 and (growpage_full or vllm_full) and is_stranded:
        alerts.append("GrowPageKVPagesStranded")
        where = (f"the pool had no free page (down to {pct(free_min)})" if growpage_full else
                 f"vLLM's KV cache was {pct(scope.vllm_kv_cache_usage_max)} used with its queue growing")
        parts.append(f"{events} while {where} and {pct(stranded)} of the granted token slots held no live "
                     "token: pages are stranded, not used")
        steps += advice.stranded_pages(scope, t)
    if per_s is not None and per_s > t.alerting.vllm_preemptions_per_s_high:
        alerts.append("GrowPageVLLMPreemptions")
        parts.append(f"vLLM preempted {per_s:.2f} requests per second (> {t.alerting.vllm_preemptions_per_s_high:g})")
        if not is_stranded:
            steps += advice.genuinely_full(scope, t)
        if (routing := fleet_routing(scope, t)) is not None:
            alerts.append("GrowPageFleetRoutesToPreemptingReplica")
            parts.append(routing)
            steps.append("A router sends work to a replica that says it is full: see runbook "
                         "GrowPageFleetRoutesToPreemptingReplica.md.")
    if fragmentation is not None and fragmentation > limits.fragmentation_high and short:
        alerts.append("GrowPageFragmentationHigh")
        parts.append(f"fragmentation {fragmentation:.2f} (> {limits.fragmentation_high}) while the pool is down "
                     f"to {pct(free_min)} free")
        steps.append("High fragmentation strands pages before the pool is empty: see runbook "
                     "GrowPageFragmentationHigh.md.")
    if alerts:
        return alert_finding(tuple(alerts), "; ".join(parts), proof, tuple(dict.fromkeys(steps)))
    if failures == 0:
        return ScopeFinding(Status.OK, "no OOM or preemption in the window", proof)
    return _unpaged_failures(scope, t, events, proof, growpage_full or vllm_full, is_stranded)


def fleet_routing(scope: Scope, t: Thresholds) -> str | None:
    """Why a router in front of the scope's replicas sends new requests to one that says it is full
    (its lowest ``growpage_router_load`` all window at the fleet_load_full threshold or more) while another says it
    has room, or None. Read over the scope (a namespace), not per pod: it goes with the preemption
    finding, which is the scope's too."""
    loads, full = scope.router_load_min_by_pod, t.alerting.fleet_load_full
    arrivals = scope.vllm_ttft.count if scope.vllm_ttft is not None else 0.0
    if not loads or not arrivals:
        return None
    full_pods = sorted(pod for pod, load in loads.items() if load >= full)
    if not full_pods or all(load >= full for load in loads.values()):
        return None
    return (f"{arrivals:,.0f} new requests arrived while {', '.join(full_pods)} reported a router load of "
            f"{full:g} or more all window and another replica reported room")


def _evidence(scope: Scope, window: Window, t: Thresholds, preemptions: float, vllm_preemptions_per_s: float | None,
              fragmentation: float | None) -> dict[str, object]:
    """What the finding shows: failures, both pools' fullness, stranded slots, fragmentation, the build."""
    limits = t.checklist
    return evidence(
        catalog.OOM_EVENTS.name, scope.oom_events or 0.0, 0, window, preemptions=preemptions,
        vllm_preemptions=scope.vllm_preemptions or 0.0, vllm_preemptions_per_s=vllm_preemptions_per_s,
        vllm_preemptions_per_s_threshold=t.alerting.vllm_preemptions_per_s_high,
        vllm_kv_cache_usage_max=scope.vllm_kv_cache_usage_max,
        vllm_kv_cache_usage_threshold=limits.vllm_kv_cache_usage_full, vllm_queue_growth=scope.vllm_queue_growth,
        pool_free_fraction_min=scope.pool_free_fraction_min,
        pool_free_low_threshold=limits.pool_free_low, stranded_slots_max=scope.stranded_slots_max,
        stranded_slots_threshold=limits.stranded_slots_high, fragmentation_max=fragmentation,
        fragmentation_threshold=limits.fragmentation_high,
        gpu_framebuffer_used_max=scope.gpu_framebuffer_used_max, mode=scope.build_value("mode"),
        home=scope.build_value("engine"), base_pages=scope.build_value("base_pages"),
        block_size=scope.build_value("block_size"))


def _unpaged_failures(scope: Scope, t: Thresholds, events: str, proof: dict[str, object], full: bool,
                      is_stranded: bool) -> ScopeFinding:
    """Failures the alerts do not page for: advice, not a finding (severity info)."""
    if full:
        why = (f"{events}; the KV cache was full of live tokens: memory is genuinely full, a capacity question"
               if not is_stranded else f"{events}")
        return ScopeFinding(Status.OK, why, proof, advice.genuinely_full(scope, t), Severity.INFO)
    return ScopeFinding(
        Status.OK, f"{events} while the pool still had free pages: not a shortage of GrowPage pages", proof,
        ("Requests failed for another reason: check vLLM's own KV cache (vllm:kv_cache_usage_perc, "
         "vllm:num_preemptions_total) and growth throttling (the rollout check).",), Severity.INFO)
