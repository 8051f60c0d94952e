"""Burn-rate verdicts of the latency SLOs, reached as the alerts reach them.

Each service's error ratios over the burn windows (``Scope.burn_ratios``, read by the Prometheus
source at the window's end) go through :func:`growpage.diagnose.burn.judge_burn_pairs`, the rules'
own decision: a finding names exactly the alert and window pair the rules would raise, with the
severity of ``catalog.SEVERITY_BY_ALERT``. The share within the SLO over ``--since`` is context in
the summary and never a verdict: a 30-minute burn at 7x is no fast burn when its 6-hour window is
quiet. A burn alert Prometheus reports firing whose pairs no longer hold at the window's end (its
short window fell back since the rule last ran) is still named (:func:`paged_not_holding`): the
report read right after a page never reads milder than the page. Scrapes and snapshots hold no
history: there the burns are not checked, and the report says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from growpage import catalog
from growpage.diagnose.burn import PairState, PairVerdict, judge_burn_pairs
from growpage.diagnose.checks.base import Thresholds, no_history
from growpage.diagnose.findings import NotChecked, ScopeFinding, Status, alert_finding
from growpage.diagnose.observations import Scope, Window
from growpage.monitoring.alert_rules import VLLM_SLO_ALERT_STEMS
from growpage.monitoring.promql import duration_seconds


@dataclasses.dataclass(frozen=True)
class BurnSLO:
    """A latency SLO as its burn alerts see it: ``name`` keys ``Scope.burn_ratios``, ``stem`` names
    the alerts (``GrowPage<stem>FastBurn``)."""

    name: str
    stem: str
    objective: float


@dataclasses.dataclass(frozen=True)
class _Judged:
    service: str
    slo: BurnSLO
    verdict: PairVerdict

    def to_dict(self) -> dict[str, object]:
        return {"slo": self.slo.name, "service": self.service, **self.verdict.to_dict()}

    def describe(self) -> str:
        v = self.verdict
        ratios = "/".join(f"{(r or 0.0) * 100:.2f}" for r in (v.long_ratio, v.short_ratio))
        return (f"{v.alert} ({v.window.long_window}/{v.window.short_window}: {ratios} % bad > "
                f"{v.limit * 100:.2f} %, {self.service})")


def judge(scope: Scope, slos: Sequence[BurnSLO], t: Thresholds) -> list[_Judged]:
    """Every window pair of every service of ``slos`` in ``scope`` (``burn_ratios`` must be read)."""
    assert scope.burn_ratios is not None
    return [_Judged(service.describe(), slo, verdict)
            for slo in slos for service in scope.burn_ratios.get(slo.name, ())
            for verdict in judge_burn_pairs(slo.stem, t.alerting.burn_rate_alerts, slo.objective, service.ratios)]


@dataclasses.dataclass(frozen=True)
class _Paged:
    """A burn alert Prometheus has firing for a service whose window pairs the ratios read at the
    window's end no longer hold: a rule's ``for`` was met at its last evaluation, and its short
    window has fallen back since (or the recordings moved on before the rule ran again)."""

    alert: str
    service: str

    def to_dict(self) -> dict[str, object]:
        return {"alert": self.alert, "service": self.service}

    def describe(self) -> str:
        return (f"{self.alert} (firing in Prometheus, {self.service}; its windows read under the limit now: "
                "it resolves once its rule sees them so)")


def paged_not_holding(scope: Scope, slos: Sequence[BurnSLO], judged: Sequence[_Judged]) -> list[_Paged]:
    """The burn alerts of ``slos`` firing in Prometheus (``ServiceErrorRatios.firing``) that no
    judged pair holds now: diagnose names the page that woke the on-call, whatever the ratios
    read a second later."""
    assert scope.burn_ratios is not None
    names: dict[tuple[str, str], set[str]] = {}
    for item in judged:
        names.setdefault((item.slo.name, item.service), set()).add(item.verdict.alert)
    holding = {(item.verdict.alert, item.service) for item in judged if item.verdict.state is PairState.FIRING}
    return [_Paged(alert, service.describe())
            for slo in slos for service in scope.burn_ratios.get(slo.name, ())
            for alert in sorted(service.firing & names.get((slo.name, service.describe()), set()))
            if (alert, service.describe()) not in holding]


def burn_finding(scope: Scope, window: Window, t: Thresholds, slos: Sequence[BurnSLO], reading: str,
                 proof: dict[str, object], remediation: tuple[str, ...]) -> ScopeFinding:
    """The finding of ``slos``' burn alerts; ``reading`` (the window's shares) leads the summary."""
    if scope.burn_ratios is None:
        skipped = no_history(window) if window.kind != "range" else NotChecked(
            "burn rates are judged per service (namespace, model), as the alerts judge them, not per pod",
            "read the overall row of this report")
        return ScopeFinding(Status.UNKNOWN, f"{reading}; {skipped.reason}", proof, not_checked=skipped)
    judged = judge(scope, slos, t)
    paged = paged_not_holding(scope, slos, judged)
    proof = {**proof, "burn_pairs": [item.to_dict() for item in judged],
             "firing_in_prometheus": [item.to_dict() for item in paged]}
    unchecked = [item for item in judged if item.verdict.state is PairState.NOT_CHECKED]
    if (not judged or len(unchecked) == len(judged)) and not paged:
        return ScopeFinding(Status.UNKNOWN, f"{reading}; no burn-rate window pair could be evaluated",
                            proof, not_checked=_uncovered(unchecked, window))
    partial = _uncovered(unchecked, window) if unchecked else None
    firing = [item for item in judged if item.verdict.state is PairState.FIRING]
    checked = len(judged) - len(unchecked)
    if not firing and not paged:
        return ScopeFinding(Status.OK, f"{reading}; no burn-rate alert holds ({checked} window pairs quiet at "
                            f"the window's end)", proof, not_checked=partial)
    alerts = tuple(dict.fromkeys([item.verdict.alert for item in firing] + [item.alert for item in paged]))
    burning = [item.describe() for item in firing] + [item.describe() for item in paged]
    summary = f"{reading}; burning: {'; '.join(burning)}"
    return dataclasses.replace(alert_finding(alerts, summary, proof, remediation), not_checked=partial)


def _uncovered(unchecked: list[_Judged], window: Window) -> NotChecked:
    if not unchecked:
        return NotChecked(f"no series of these histograms in Prometheus ({window.describe()})",
                          "scrape the histograms' metrics into this Prometheus")
    pairs = sorted({f"{item.verdict.alert} {item.verdict.window.long_window}/{item.verdict.window.short_window}"
                    for item in unchecked})
    longest = max((item.verdict.window for item in unchecked), key=lambda w: duration_seconds(w.long_window))
    return NotChecked(f"Prometheus holds no sample from the start of these pairs' windows before the evaluation "
                      f"time: {', '.join(pairs)}",
                      f"diagnose again once Prometheus holds that much history (up to {longest.long_window}), or "
                      "query a Prometheus with longer retention")


def vllm_burn_slos(t: Thresholds) -> tuple[BurnSLO, ...]:
    """vLLM's SLOs with burn alerts: time to first token, inter-token latency, availability."""
    slos = (*t.alerting.vllm_latency_slos, t.alerting.vllm_availability_slo)
    return tuple(BurnSLO(slo.name, VLLM_SLO_ALERT_STEMS[slo.name], slo.objective) for slo in slos)


def allocation_burn_slo(t: Thresholds) -> BurnSLO:
    return BurnSLO(catalog.SLO_ALLOCATION_LATENCY.name, "AllocationLatency", t.latency_slo_objective)
