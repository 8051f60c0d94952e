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
from growpage.diagnose.checks.base import Thresholds, evidence, missing, pct
from growpage.diagnose.findings import ScopeFinding, Severity, Status
from growpage.diagnose.observations import Scope, Window

NO_GROWPAGE_IN_VLLM_NOTE = advice.NO_GROWPAGE_IN_VLLM_NOTE


def oom_fragmentation(scope: Scope, window: Window, t: Thresholds) -> ScopeFinding:
    metric = catalog.OOM_EVENTS.name
    preempt = scope.decisions.get("preempt") if scope.decisions else None
    if scope.oom_events is None and (preempt is None or metric in scope.non_finite):
        return missing(scope, metric, window, f"{metric} or growpage_decisions_total{{decision=\"preempt\"}}")
    ooms, preemptions = scope.oom_events or 0.0, preempt or 0.0
    free_min, stranded = scope.pool_free_fraction_min, scope.stranded_slots_max
    fragmentation = scope.fragmentation.max if scope.fragmentation is not None else None
    limits = t.checklist
    proof = evidence(
        metric, ooms, 0, window, preemptions=preemptions, pool_free_fraction_min=free_min,
        pool_free_low_threshold=limits.pool_free_low, stranded_slots_max=stranded,
        stranded_slots_threshold=limits.stranded_slots_high, fragmentation_max=fragmentation,
        fragmentation_threshold=limits.fragmentation_high,
        gpu_framebuffer_used_max=scope.gpu_framebuffer_used_max, mode=scope.build_value("mode"),
        base_pages=scope.build_value("base_pages"), block_size=scope.build_value("block_size"))
    short = free_min is not None and free_min <= limits.fragmentation_pool_free_max
    if ooms == 0 and preemptions == 0:
        if fragmentation is not None and fragmentation >= limits.fragmentation_high and short:
            return ScopeFinding(Status.OK, f"no OOM or preemption; fragmentation is high ({fragmentation:.2f} "
                                f">= {limits.fragmentation_high}) while the pool is down to {pct(free_min)} free, "
                                "watch it", proof,
                                ("High fragmentation strands pages before the pool is empty: see the runbook.",),
                                Severity.INFO)
        return ScopeFinding(Status.OK, "no OOM or preemption in the window", proof)
    events = f"{ooms:,.0f} OOM events, {preemptions:,.0f} preemptions"
    if free_min is None or stranded is None:
        unknown_parts = [name for name, value in (("free pages (growpage_pool_pages)", free_min),
                                                  ("stranded slots (growpage_kv_live_tokens / "
                                                   "growpage_kv_granted_token_slots)", stranded)) if value is None]
        return ScopeFinding(Status.WARNING, f"{events}; cannot tell why: {' and '.join(unknown_parts)} unknown",
                            proof, ("Export the pool gauges (an agent of this version does) and re-run diagnose.",))
    no_free_page = free_min <= limits.pool_free_low
    if no_free_page and stranded >= limits.stranded_slots_high:
        return ScopeFinding(
            Status.CRITICAL, f"{events} while the pool had no free page (down to {pct(free_min)}) and "
            f"{pct(stranded)} of the granted token slots held no live token: pages are stranded, not used",
            proof, advice.stranded_pages(scope, t))
    if no_free_page:
        return ScopeFinding(
            Status.WARNING, f"{events}; the pool had no free page and {pct(1 - stranded)} of the granted "
            "slots held live tokens: memory is genuinely full", proof, advice.genuinely_full(scope, t))
    return ScopeFinding(
        Status.WARNING, f"{events} while the pool still had {pct(free_min)} free pages: not a shortage of "
        "GrowPage pages", proof,
        ("Requests failed for another reason: check vLLM's own KV cache (vllm:kv_cache_usage_perc, "
         "vllm:num_preemptions_total) and growth throttling (the rollout check).",))
