"""Checklist step 5: the staged rollout (monitor -> enforce where LTS entropy > 2.5 -> everywhere).

A scope not yet enforced whose median finished-request LTS entropy is above 2.5 is a phase-2
candidate (advice: status ok, severity info). In enforce mode, growth refused by
``max_growth_rate`` in more than half of the attempts means the limit is too tight for the traffic.
"""

from __future__ import annotations

from growpage import catalog
from growpage.diagnose.checks.base import Thresholds, evidence, pct, throttle_share, to_read, unknown
from growpage.diagnose.findings import ScopeFinding, Severity, Status, alert_finding
from growpage.diagnose.observations import Scope, Window

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
