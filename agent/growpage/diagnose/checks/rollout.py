"""Checklist step 5: the staged rollout (monitor -> enforce where it pays -> everywhere).

A monitored scope is a phase-2 candidate (advice: status ok, severity info) where monitor's forecast
of enforce says enforce would save vLLM more time than it costs (:func:`growpage.rollout.recommend`,
the rule ``gpctl calibrate`` writes too); where the forecast says it would not, the scope stays in
monitor whatever its entropy, and the finding says why. Without a forecast (a GrowPage older than
it, or the reference engine) the seed's proxy decides: median finished-request LTS entropy above
2.5. In enforce mode, growth refused by ``max_growth_rate`` in more than half of the attempts means
the limit is too tight for the traffic.
"""

from __future__ import annotations

from growpage import catalog
from growpage.diagnose.checks.base import Thresholds, evidence, pct, throttle_share, to_read, unknown
from growpage.diagnose.findings import ScopeFinding, Severity, Status, alert_finding
from growpage.diagnose.observations import Scope, Window
from growpage.rollout import COST_COUNTERS, ENFORCE, ForecastEvidence, forecast_evidence, recommend

THROTTLE_METRIC = 'growpage_decisions_total{decision="throttled"} / (allocate + throttled)'


def rollout(scope: Scope, window: Window, t: Thresholds) -> ScopeFinding:
    metric = catalog.LTS_ENTROPY.name
    limit = t.checklist.rollout_entropy
    modes = scope.build_values("mode")
    if not modes:
        return unknown(metric, "growpage_build_info not found: the mode is unknown", window,
                       to_read(catalog.BUILD_INFO.name, window), limit)
    mode = modes[0] if len(modes) == 1 else "mixed"
    entropy = scope.lts_entropy
    p50 = entropy.quantile(0.5) if entropy is not None and entropy.count > 0 else None
    throttled = throttle_share(scope)
    finished = entropy.count if entropy else None
    if mode == "enforce":
        proof = evidence(THROTTLE_METRIC, throttled, t.checklist.throttle_saturation, window, mode=mode,
                         lts_entropy_p50=p50, requests_finished=finished)
        if throttled is not None and throttled > t.checklist.throttle_saturation:
            return alert_finding(
                ("GrowPageGrowthThrottled",), f"enforced; growth throttled in {pct(throttled)} of attempts "
                f"(> {pct(t.checklist.throttle_saturation)}): max_growth_rate is too tight", proof,
                ("Raise max_growth_rate (default 0.3 = +30 % pages per second per request) or lower "
                 "base_pages so fewer requests hit the limit.",))
        return ScopeFinding(Status.OK, f"enforced (phase 2/3); growth throttled in {pct(throttled)} of "
                            "attempts", proof)
    proof = evidence(metric, p50, limit, window, statistic="p50 of finished requests (nats)", mode=mode,
                     modes=list(modes), requests_finished=finished, throttled_share=throttled)
    if mode == "off":
        return ScopeFinding(Status.OK, "mode off: GrowPage observes nothing; start with mode=monitor (phase 1)",
                            proof, ("Set mode=monitor to collect LTS entropy before enabling growth.",),
                            Severity.INFO)
    if mode == "mixed":
        return ScopeFinding(Status.OK, f"modes differ here ({', '.join(modes)}): judged per namespace/pod "
                            "where a breakdown exists", proof)
    forecast = _forecast(scope)
    if forecast is not None:
        advice = recommend(forecast, mode)
        proof = {**proof, "forecast_verdict": advice.verdict, "forecast": advice.to_dict()["forecast"]}
        entropy_note = f" (LTS entropy p50 {p50:.2f} nats)" if p50 is not None else ""
        if advice.verdict == ENFORCE:
            return ScopeFinding(Status.OK, f"mode {mode}; monitor's forecast says enforce pays here{entropy_note}: "
                                f"{advice.reason}", proof,
                                ("Enable mode=enforce here (phase 2): list it in enforce_namespaces, then compare "
                                 "answers and latency against the monitored rest (gpctl calibrate writes the "
                                 "settings).",), Severity.INFO)
        return ScopeFinding(Status.OK, f"mode {mode}; stay in monitor{entropy_note}: {advice.reason}", proof)
    if p50 is None:
        return ScopeFinding(Status.OK, f"mode {mode}; no finished requests in {metric} ({window.describe()}): "
                            "phase 2 waits for traffic to judge its entropy", proof)
    if p50 > limit:
        return ScopeFinding(Status.OK, f"mode {mode}; LTS entropy p50 {p50:.2f} nats > {limit}: a phase-2 "
                            "candidate", proof,
                            ("Enable mode=enforce here (phase 2): its requests are hard enough to benefit "
                             "from growth.",), Severity.INFO)
    return ScopeFinding(Status.OK, f"mode {mode}; LTS entropy p50 {p50:.2f} nats <= {limit}: stay in "
                        "monitor for now", proof)


def _forecast(scope: Scope) -> ForecastEvidence | None:
    """Monitor's forecast of enforce over the window, with what monitor itself cost (None: no forecast)."""
    if not scope.forecast_counters:
        return None
    own, hooked = (spec.name for spec in COST_COUNTERS)
    return forecast_evidence({**scope.forecast_counters, own: scope.own_seconds, hooked: scope.hooked_seconds})
