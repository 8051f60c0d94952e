"""What vLLM's users feel: time to first token, inter-token latency and availability against their SLOs.

Read from vLLM's own series (``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
``vllm:request_success_total``), the ones the burn-rate pages read. The verdict is the burn-rate
alerts' own (:mod:`growpage.diagnose.checks.burns`): with Prometheus, each window pair's long and
short error ratios at the window's end; the latency shares over the window are the summary's
context. As for the alerts, GrowPage's mode does not matter: users feel a pod rolled back to off too.
"""

from __future__ import annotations

from growpage import catalog
from growpage.diagnose.checks.base import Thresholds, evidence, pct_floor, to_read, unknown
from growpage.diagnose.checks.burns import burn_finding, vllm_burn_slos
from growpage.diagnose.findings import ScopeFinding, Status
from growpage.diagnose.observations import HistogramCounts, Scope, Window

VLLM_HOME = "vllm"  # growpage_build_info{home} inside vLLM
_REMEDIATION = (
    "Read GrowPage's view of the same window: compression headroom (quantize/evict decisions), denied "
    "growth and stranded slots (the oom-fragmentation check); in mode monitor they say what enforce would "
    "change.",
    "If pages are stranded or growth is denied, see runbook GrowPageKVPagesStranded.md; if the KV cache is "
    "genuinely full, add replicas or KV memory.")


def _histogram(scope: Scope, slo: catalog.LatencySLO) -> HistogramCounts | None:
    return scope.vllm_ttft if slo.name == catalog.SLO_VLLM_TTFT.name else scope.vllm_itl


def vllm_latency(scope: Scope, window: Window, t: Thresholds) -> ScopeFinding:
    metric = catalog.SLO_VLLM_TTFT.histogram
    slos = t.alerting.vllm_latency_slos
    homes = scope.build_values("engine")
    if homes and VLLM_HOME not in homes:
        return ScopeFinding(Status.OK, f"home {', '.join(homes)}: no vLLM serves here, its latency SLOs do not apply",
                            evidence(metric, None, slos[0].objective, window, homes=list(homes)))
    judged = scope.burn_ratios is not None and any(scope.burn_ratios.get(slo.name) for slo in vllm_burn_slos(t))
    if not judged and all(_histogram(scope, slo) is None for slo in slos):
        return unknown(metric, f"none of vLLM's latency histograms found ({', '.join(s.histogram for s in slos)})",
                       window, to_read(metric, window))
    shares: dict[str, float] = {}
    burns: dict[str, float] = {}
    for slo in slos:
        histogram = _histogram(scope, slo)
        within = histogram.fraction_at_or_below(slo.threshold_s) if histogram is not None else None
        if within is not None:
            shares[slo.name] = within
            burns[slo.name] = (1 - within) / (1 - slo.objective)
    proof = evidence(metric, shares.get(catalog.SLO_VLLM_TTFT.name), slos[0].objective, window,
                     within_slo=shares, window_burn_rate=burns, mode=scope.build_value("mode"))
    reading = "; ".join(f"{pct_floor(shares[slo.name])} within {slo.threshold_s:g} s ({slo.name}, "
                        f"{window.describe()})" for slo in slos if slo.name in shares) or \
        f"no requests in vLLM's histograms ({window.describe()})"
    return burn_finding(scope, window, t, vllm_burn_slos(t), reading, proof, _REMEDIATION)
