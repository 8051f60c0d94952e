"""What vLLM's users feel: time to first token and inter-token latency against their SLOs.

Read from vLLM's own histograms (``vllm:time_to_first_token_seconds``,
``vllm:inter_token_latency_seconds``), the same series the burn-rate pages read. The window's error
ratio over the SLO's error budget is its burn rate; it matches the fast-burn page when it exceeds the
lowest factor of the fast window pairs, and the slow-burn ticket when it exceeds the lowest factor of
the slow ones. One window stands in for the alerts' long/short pairs: diagnose is a look at a span
of time, not a rule evaluated every minute. A pod in mode off is not GrowPage's to page for.
"""

from __future__ import annotations

from growpage import catalog
from growpage.diagnose.checks.base import Thresholds, evidence, is_mode_off, pct_floor, unknown
from growpage.diagnose.findings import ScopeFinding, Status, alert_finding
from growpage.diagnose.observations import HistogramCounts, Scope, Window

VLLM_HOME = "vllm"  # growpage_build_info{home} inside vLLM
_STEMS = {catalog.SLO_VLLM_TTFT.name: "VLLMTimeToFirstToken", catalog.SLO_VLLM_ITL.name: "VLLMInterTokenLatency"}


def burn_alerts(stem: str, burn: float, t: Thresholds) -> tuple[str, ...]:
    """The burn-rate alerts of ``stem`` whose lowest window factor ``burn`` exceeds."""
    return tuple(f"GrowPage{stem}{alert.speed.title()}Burn" for alert in t.alerting.burn_rate_alerts
                 if burn > min(window.factor for window in alert.windows))


def _histogram(scope: Scope, slo: catalog.LatencySLO) -> HistogramCounts | None:
    return scope.vllm_ttft if slo.name == catalog.SLO_VLLM_TTFT.name else scope.vllm_itl


def vllm_latency(scope: Scope, window: Window, t: Thresholds) -> ScopeFinding:
    metric = catalog.SLO_VLLM_TTFT.histogram
    slos = t.alerting.vllm_latency_slos
    homes = scope.build_values("engine")
    if homes and VLLM_HOME not in homes:
        return ScopeFinding(Status.OK, f"home {', '.join(homes)}: no vLLM serves here, its latency SLOs do not apply",
                            evidence(metric, None, slos[0].objective, window, homes=list(homes)))
    if all(_histogram(scope, slo) is None for slo in slos):
        return unknown(metric, f"none of vLLM's latency histograms found ({', '.join(s.histogram for s in slos)}): "
                       "scrape vLLM's /metrics too (snapshots: save it into the same file)", window)
    shares: dict[str, float] = {}
    burns: dict[str, float] = {}
    alerts: list[str] = []
    for slo in slos:
        histogram = _histogram(scope, slo)
        within = histogram.fraction_at_or_below(slo.threshold_s) if histogram is not None else None
        if within is None:
            continue
        shares[slo.name] = within
        burns[slo.name] = (1 - within) / (1 - slo.objective)
        alerts += burn_alerts(_STEMS[slo.name], burns[slo.name], t)
    fast, slow = t.alerting.burn_rate_alerts
    proof = evidence(metric, shares.get(catalog.SLO_VLLM_TTFT.name), slos[0].objective, window,
                     within_slo=shares, burn_rate=burns, mode=scope.build_value("mode"),
                     fast_burn_factor=min(w.factor for w in fast.windows),
                     slow_burn_factor=min(w.factor for w in slow.windows))
    if not shares:
        return unknown(metric, f"no requests in vLLM's histograms ({window.describe()}): nothing to time", window)
    reading = "; ".join(f"{pct_floor(shares[slo.name])} within {slo.threshold_s:g} s ({slo.name}, burn "
                        f"{burns[slo.name]:.1f}x)" for slo in slos if slo.name in shares)
    if is_mode_off(scope):
        return ScopeFinding(Status.OK, f"mode off: GrowPage does not run here, its rotation is not paged; {reading}",
                            proof)
    if not alerts:
        return ScopeFinding(Status.OK, reading, proof)
    return alert_finding(tuple(alerts), reading, proof, (
        "Read GrowPage's view of the same window: compression headroom (quantize/evict decisions), denied "
        "growth and stranded slots (the oom-fragmentation check); in mode monitor they say what enforce would "
        "change.",
        "If pages are stranded or growth is denied, see runbook GrowPageKVPagesStranded.md; if the KV cache is "
        "genuinely full, add replicas or KV memory."))
