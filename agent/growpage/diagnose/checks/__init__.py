"""The troubleshooting checklist, in order, and how one check becomes one report row.

Titles state the healthy condition, so "OK <title>" always reads true.

Each check is a pure function of one :class:`~growpage.diagnose.observations.Scope`. It runs on the
whole source and on each namespace (or pod) of the breakdown; a breakdown scope that is worse than
the whole escalates the row (one over-granting namespace is a finding even when the fleet is fine),
while a breakdown scope that is merely unknown (e.g. a namespace without traffic) does not.
"""

from __future__ import annotations

import dataclasses

from growpage import catalog
from growpage.diagnose.checks import advice
from growpage.diagnose.checks.base import Check, Thresholds, pct
from growpage.diagnose.checks.health import agent_health
from growpage.diagnose.checks.latency import allocation_latency
from growpage.diagnose.checks.oom import oom_fragmentation
from growpage.diagnose.checks.overgrant import over_granting
from growpage.diagnose.checks.rollout import rollout
from growpage.diagnose.checks.slo import allocation_latency_slo, compress_ratio, utilization
from growpage.diagnose.checks.vllm import vllm_latency
from growpage.diagnose.findings import Finding, Report, ScopeFinding, Severity, Status, worst
from growpage.diagnose.observations import Observations

CHECKS: tuple[Check, ...] = (
    Check("vllm-latency",
          lambda t: f"vLLM users: time to first token and inter-token latency within their SLOs "
                    f"({t.alerting.vllm_ttft_s:g} s, {t.alerting.vllm_itl_s * 1000:g} ms)", vllm_latency),
    Check("slo-utilization", lambda t: f"SLO: KV page utilization >= {t.utilization_slo}", utilization),
    Check("slo-compress-ratio", lambda t: f"SLO: compress ratio >= {t.compress_ratio_slo}x", compress_ratio),
    Check("slo-allocation-latency",
          lambda t: f"SLO: {t.latency_slo_objective * 100:g} % of page grants <= "
                    f"{t.latency_slo_threshold_s * 1000:g} ms", allocation_latency_slo),
    Check("over-granting",
          lambda t: f"Grants fit the traffic: utilization not < {t.checklist.utilization_sustained_low} all window",
          over_granting),
    Check("allocation-latency",
          lambda t: f"Allocation latency p99 <= {t.checklist.allocation_latency_p99_critical_s * 1000:g} ms "
                    "(else: why)", allocation_latency),
    Check("oom-fragmentation",
          lambda t: "No preemption or OOM from stranded pages; no fragmentation while pages run short",
          oom_fragmentation),
    Check("rollout", lambda t: "Rollout: mode, phase-2 candidates, throttling", rollout),
    Check("agent-health", lambda t: f"Agent healthy: no faults, build info, scraped, its own cost "
                                    f"<= {pct(t.checklist.own_share_high)} of vLLM's step", agent_health),
)
assert {check.id for check in CHECKS} == set(catalog.CHECK_RUNBOOKS), "every check needs a runbook page"
assert set(catalog.CHECK_BY_ALERT.values()) <= set(catalog.CHECK_RUNBOOKS), "every alert needs a check"

_SEVERITY_RANK = {Severity.NONE: 0, Severity.INFO: 1, Severity.WARNING: 2, Severity.CRITICAL: 3}


def runbook_url(check_id: str) -> str:
    return f"{catalog.RUNBOOK_BASE_URL}/{catalog.CHECK_RUNBOOKS[check_id]}"


def run_checks(observations: Observations, thresholds: Thresholds | None = None) -> Report:
    """Evaluate :data:`CHECKS` over ``observations``: the report, its verdict and its exit code."""
    thresholds = thresholds or Thresholds.from_catalog()
    window = observations.window
    overall = reconcile([check.evaluate(observations.overall, window, thresholds) for check in CHECKS])
    breakdowns: list[dict[str, ScopeFinding]] = [{} for _ in CHECKS]
    for name, scope in observations.breakdown.items():
        for index, found in enumerate(reconcile([check.evaluate(scope, window, thresholds) for check in CHECKS])):
            breakdowns[index][name] = found
    findings = tuple(_finding(check, overall[index], breakdowns[index], observations, thresholds)
                     for index, check in enumerate(CHECKS))
    notes = list(observations.notes)
    if observations.window.kind == "lifetime":
        notes.append("One snapshot: counters are totals since the agent started, not rates; pass two "
                     "snapshots taken apart for rates.")
    return Report(source={**observations.source, "window": observations.window.to_dict()},
                  findings=findings, notes=tuple(notes))


def reconcile(found: list[ScopeFinding]) -> list[ScopeFinding]:
    """One recommendation per setting across the checks of one scope.

    The most severe finding (then checklist order) keeps its step for a setting; the same setting's
    steps in other findings are dropped, so a report never says "set --block-size 32" and "lower
    block_size" together.
    """
    order = sorted(range(len(found)), key=lambda i: (-_SEVERITY_RANK[found[i].resolved_severity], i))
    claimed: dict[str, str] = {}
    result = list(found)
    for index in order:
        kept = []
        for step in found[index].remediation:
            setting = advice.setting_of(step)
            if setting is not None and claimed.setdefault(setting, step) != step:
                continue
            kept.append(step)
        if len(kept) != len(found[index].remediation):
            result[index] = dataclasses.replace(found[index], remediation=tuple(kept))
    return result


def _finding(check: Check, overall: ScopeFinding, breakdown: dict[str, ScopeFinding],
             observations: Observations, thresholds: Thresholds) -> Finding:
    problems = {name: found for name, found in breakdown.items()
                if found.status in (Status.WARNING, Status.CRITICAL)}
    # OK scopes with advice (e.g. a phase-2 candidate namespace) contribute their steps too.
    advised = {name: found for name, found in breakdown.items()
               if found.status is Status.OK and found.resolved_severity is Severity.INFO}
    status = worst([overall.status, *(found.status for found in problems.values())])
    label = observations.breakdown_label
    summary = overall.summary
    if problems and overall.status is Status.OK:
        summary = f"{label} {_worst_summary(problems)}; overall: {overall.summary}"
    elif problems:
        summary = f"{overall.summary} ({label}s affected: {', '.join(sorted(problems))})"
    if advised:
        summary += f"; advice for {label} {', '.join(sorted(advised))}"
    remediation = list(overall.remediation)
    for name, found in sorted({**problems, **advised}.items()):
        for step in found.remediation:
            if step not in overall.remediation:
                remediation.append(f"{label} {name}: {step}")
    severities = [overall.resolved_severity, *(found.resolved_severity for found in breakdown.values())]
    severity = max(severities, key=_SEVERITY_RANK.__getitem__)
    alerts = tuple(dict.fromkeys(name for found in (overall, *problems.values()) for name in found.alerts))
    return Finding(id=check.id, title=check.title_for(thresholds), status=status, severity=severity, summary=summary,
                   evidence=overall.evidence, remediation=tuple(remediation),
                   runbook_url=runbook_url(check.id), breakdown_label=observations.breakdown_label,
                   breakdown=breakdown, alerts=alerts, not_checked=overall.not_checked)


def _worst_summary(problems: dict[str, ScopeFinding]) -> str:
    """``name: summary`` of the worst scope (critical first, then by name), and how many others."""
    name, found = min(problems.items(), key=lambda item: (item[1].status is not Status.CRITICAL, item[0]))
    others = len(problems) - 1
    return f"{name}: {found.summary}" + (f" (+{others} more)" if others else "")
