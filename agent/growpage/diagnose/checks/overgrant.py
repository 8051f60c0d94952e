"""Checklist step 2: utilization below 0.40 for the whole window means grants are too large.

The suggested ``base_pages`` is the largest grant a median request still fills to the SLO:

    suggested_base_pages = max(1, floor(p50_tokens / (utilization_slo x block_size)))

A request of median length then uses >= 65 % of its admission grant; longer requests grow page by
page, which is what GrowPage is for. It is an estimate from finished requests' lengths (a request
holds fewer tokens while it decodes): re-run diagnose after the change.
"""

from __future__ import annotations

import math

from growpage import catalog
from growpage.diagnose.checks.base import Thresholds, evidence, idle, idle_reason, in_modes, is_idle, missing, pct
from growpage.diagnose.findings import ScopeFinding, Status, alert_finding
from growpage.diagnose.observations import Scope, Window

FORMULA = "max(1, floor(p50_tokens / (utilization_slo x block_size)))"


def suggest_base_pages(p50_tokens: float, block_size: int, utilization_slo: float) -> int:
    """The largest ``base_pages`` whose grant a median request fills to ``utilization_slo``."""
    return max(1, math.floor(p50_tokens / (utilization_slo * block_size)))


def over_granting(scope: Scope, window: Window, t: Thresholds) -> ScopeFinding:
    metric = catalog.UTILIZATION.name
    limit = t.checklist.utilization_sustained_low
    # What GrowPageKVOverGranting reads: live tokens over granted slots at the samples where pages
    # were granted. The gauge reads 0 whenever nothing is granted, so an engine sampled between
    # bursts of short requests would look over-granted while it merely had nothing to hold.
    stats = scope.pooled_utilization or scope.utilization
    if stats is None:
        return missing(scope, metric, window, threshold=limit)
    if is_idle(scope):
        return idle(metric, idle_reason(window), window, limit)
    if scope.pooled_utilization is None and scope.requests_running_max == 0:
        # Utilization is undefined between requests: the alert reads running pods only.
        return idle(metric, f"no request held KV pages at any sample ({window.describe()})", window, limit)
    highest = stats.max
    base_pages, block_size = scope.build_value("base_pages"), scope.build_value("block_size")
    tokens = scope.request_tokens
    p50, p90, p99 = ((tokens.quantile(0.5), tokens.quantile(0.9), tokens.quantile(0.99))
                     if tokens is not None and tokens.count > 0 else (None, None, None))
    grant_tokens = base_pages * block_size if base_pages and block_size else None
    suggested = suggest_base_pages(p50, block_size, t.utilization_slo) if p50 and block_size else None
    proof = evidence(
        metric, highest, limit, window, statistic=_statistic(scope), mean=stats.mean, base_pages=base_pages,
        block_size=block_size, grant_tokens=grant_tokens,
        request_tokens_p50=p50, request_tokens_p90=p90, request_tokens_p99=p99,
        requests_finished=tokens.count if tokens is not None else None,
        suggested_base_pages=suggested, suggested_base_pages_formula=FORMULA,
        base_pages_values=list(scope.build_values("base_pages")))
    homes = scope.build_values("engine")
    if homes and not any(home in catalog.HOMES_GRANTING_BASE_PAGES for home in homes):
        return ScopeFinding(Status.OK, f"home {', '.join(homes)}: pages are granted on demand and base_pages is a "
                            "compaction floor, so low utilization is slack (oom-fragmentation), not over-granting",
                            proof)
    if not in_modes(scope, catalog.MODES_OBSERVING):
        return ScopeFinding(Status.OK, "mode off: GrowPage grants nothing here", proof)
    if highest >= limit:
        return ScopeFinding(Status.OK, f"utilization reached {highest:.2f} (>= {limit}): not over-granting",
                            proof)
    one_sample = " (one snapshot: cannot tell whether it is sustained)" if window.num_samples == 1 else ""
    lengths = (f"; p50/p90/p99 request {p50:.0f}/{p90:.0f}/{p99:.0f} tokens" if p50 is not None else "")
    grant = f" vs a {grant_tokens:,}-token grant ({base_pages} x {block_size})" if grant_tokens else ""
    summary = f"utilization never above {highest:.2f} (< {limit}){one_sample}{lengths}{grant}"
    # Below the checklist limit all window is the GrowPageKVOverGranting condition.
    return alert_finding(("GrowPageKVOverGranting",), summary, proof,
                         _remediation(base_pages, block_size, p50, suggested, t))


def _statistic(scope: Scope) -> str:
    if scope.pooled_utilization is not None:
        return ("max over the window (sustained = never above) of sum of live tokens / sum of granted token "
                "slots, at the samples where pages were granted")
    return "max over the window (sustained = never above)"


def _remediation(base_pages: int | None, block_size: int | None, p50: float | None, suggested: int | None,
                 t: Thresholds) -> tuple[str, ...]:
    if suggested is None:
        missing = [name for name, value in (("base_pages/block_size (growpage_build_info)", block_size),
                                            ("request lengths (growpage_request_tokens)", p50)) if not value]
        return (f"Lower base_pages (now {base_pages or 'unknown'}): cannot suggest a value without "
                f"{' and '.join(missing)}.",)
    arithmetic = (f"floor({p50:.0f} / ({t.utilization_slo} x {block_size})) = {suggested}")
    if base_pages is not None and suggested >= base_pages:
        return (f"Request lengths fit the grant ({arithmetic} >= base_pages {base_pages}): utilization is low "
                "for another reason.",
                "Check reserved-but-unwritten pages (growpage_pool_pages{state=\"reserved\"}) and the "
                "oom-fragmentation check (tail slack, eviction holes).")
    return (f"Set base_pages to {suggested} (now {base_pages or 'unknown'}): {arithmetic}, so a median request "
            f"fills >= {pct(t.utilization_slo)} of its grant; longer requests grow page by page.",
            "Requests are mostly short for this grant: re-run diagnose after the change to confirm.")
