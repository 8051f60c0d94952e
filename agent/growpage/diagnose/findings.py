"""Result types of a diagnosis: statuses, one finding per check, the report, and the verdict.

Every type is a frozen dataclass with a ``to_dict`` that produces the documented JSON (see
``docs/DIAGNOSE.md``); renderers read these and nothing else.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from growpage import catalog


class Status(enum.StrEnum):
    """Outcome of one check, and the overall verdict."""

    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"
    UNKNOWN = "unknown"


class Severity(enum.StrEnum):
    """How urgently a finding asks for action (the label an alert of this kind would carry).

    ``info`` is an OK (or unknown) check that still has advice worth reading, e.g. a namespace
    ready for rollout phase 2 or a block size that differs from GrowPage's recommendation.
    """

    NONE = "none"
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


# Of Report.to_dict(); see growpage.diagnose.schema. 2: the verdict is the worst of the checks that
# could run (unknown only when none could), and not_checked says what could not.
SCHEMA_VERSION = 2

# Exit codes of `gpctl diagnose` (documented): 3 is "could not diagnose at all" (nothing was read,
# or no check could run).
EXIT_CODES = {Status.OK: 0, Status.WARNING: 1, Status.CRITICAL: 2, Status.UNKNOWN: 3}
EXIT_CANNOT_DIAGNOSE = 3

_VERDICT_RANK = {Status.OK: 0, Status.UNKNOWN: 1, Status.WARNING: 2, Status.CRITICAL: 3}


def worst(statuses: list[Status] | tuple[Status, ...]) -> Status:
    """The worst of ``statuses``: critical > warning > unknown > ok (ok when empty)."""
    return max(statuses, key=_VERDICT_RANK.__getitem__, default=Status.OK)


def verdict(statuses: list[Status] | tuple[Status, ...]) -> Status:
    """The report's verdict: the worst of the checks that could run (unknown = not checked).

    NOTE: a check that could not run never decides the verdict: a healthy pod whose vLLM metrics
    were not saved is ok, and the report lists what was not checked. Unknown only when nothing could
    be checked at all.
    """
    checked: list[Status] = [status for status in statuses if status is not Status.UNKNOWN]
    return worst(checked) if checked else Status.UNKNOWN


@dataclasses.dataclass(frozen=True)
class NotChecked:
    """What a check could not evaluate, and what to scrape, save or run so that it can.

    Attributes:
        reason: why (e.g. "none of vLLM's latency histograms found").
        to_check: the fix, one sentence (e.g. "save vLLM's /metrics beside /metrics/growpage").
    """

    reason: str
    to_check: str

    def to_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "to_check": self.to_check}


def alert_finding(alerts: tuple[str, ...], summary: str, evidence: Mapping[str, Any],
                  remediation: tuple[str, ...] = ()) -> ScopeFinding:
    """A finding that is the condition of ``alerts``: status and severity from ``catalog.SEVERITY_TABLE``
    (the worst of them), the table the alert rules and the runbooks read, so they cannot disagree."""
    critical = any(catalog.SEVERITY_BY_ALERT[name] == catalog.SEVERITY_PAGE for name in alerts)
    status = Status.CRITICAL if critical else Status.WARNING
    return ScopeFinding(status, summary, evidence, remediation, alerts=tuple(alerts))


def default_severity(status: Status, has_advice: bool) -> Severity:
    if status is Status.CRITICAL:
        return Severity.CRITICAL
    if status is Status.WARNING:
        return Severity.WARNING
    return Severity.INFO if has_advice else Severity.NONE


@dataclasses.dataclass(frozen=True)
class ScopeFinding:
    """What one check found in one scope (the whole source, a namespace, or a pod).

    Attributes:
        status: the outcome in this scope.
        summary: one sentence a human reads first (numbers included).
        evidence: ``metric``, ``value``, ``threshold``, ``window`` and check-specific extras; plain
            JSON values only (numbers in base units: seconds, ratios 0-1, pages, tokens).
        remediation: steps, most likely fix first; empty when there is nothing to do.
        severity: ``None`` derives it from ``status`` (info when ok with remediation).
        alerts: the alerts whose condition this finding is (``catalog.SEVERITY_TABLE``): what
            would page or ticket for it, so a report and the alerts never disagree.
        not_checked: what could not be evaluated and how to evaluate it: the whole check when the
            status is unknown, else a part of it (e.g. burn-rate pairs whose long window the data
            does not cover).
    """

    status: Status
    summary: str
    evidence: Mapping[str, Any]
    remediation: tuple[str, ...] = ()
    severity: Severity | None = None
    alerts: tuple[str, ...] = ()
    not_checked: NotChecked | None = None

    def __post_init__(self) -> None:
        assert self.status is not Status.UNKNOWN or self.not_checked is not None, "say how to check it"

    @property
    def resolved_severity(self) -> Severity:
        if self.severity is not None:
            return self.severity
        return default_severity(self.status, bool(self.remediation))


@dataclasses.dataclass(frozen=True)
class Finding:
    """One row of the report: a checklist item evaluated over the source (and its breakdown)."""

    id: str
    title: str
    status: Status
    severity: Severity
    summary: str
    evidence: Mapping[str, Any]
    remediation: tuple[str, ...]
    runbook_url: str
    # Per namespace (or pod) results, keyed by the label value; only scopes that are not ok are
    # shown by the text renderer, all are in the JSON.
    breakdown_label: str | None = None
    breakdown: Mapping[str, ScopeFinding] = dataclasses.field(default_factory=dict)
    alerts: tuple[str, ...] = ()
    not_checked: NotChecked | None = None

    def to_dict(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "id": self.id,
            "title": self.title,
            "status": self.status.value,
            "severity": self.severity.value,
            "summary": self.summary,
            "evidence": dict(self.evidence),
            "remediation": list(self.remediation),
            "runbook_url": self.runbook_url,
            "breakdown": None,
            "alerts": list(self.alerts),
            "not_checked": self.not_checked.to_dict() if self.not_checked else None,
        }
        if self.breakdown_label is not None:
            document["breakdown"] = {
                "label": self.breakdown_label,
                "scopes": {
                    name: {
                        "status": scope.status.value,
                        "severity": scope.resolved_severity.value,
                        "summary": scope.summary,
                        "evidence": dict(scope.evidence),
                        "remediation": list(scope.remediation),
                        "alerts": list(scope.alerts),
                        "not_checked": scope.not_checked.to_dict() if scope.not_checked else None,
                    }
                    for name, scope in sorted(self.breakdown.items())
                },
            }
        return document


@dataclasses.dataclass(frozen=True)
class Report:
    """A whole diagnosis: the verdict, where the data came from, and one finding per check."""

    source: Mapping[str, Any]
    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = ()

    @property
    def status(self) -> Status:
        return verdict([finding.status for finding in self.findings])

    @property
    def not_checked(self) -> tuple[Finding, ...]:
        """The checks that could not run (unknown), then those that ran in part, in checklist order."""
        whole = [f for f in self.findings if f.status is Status.UNKNOWN]
        return (*whole, *(f for f in self.findings if f.status is not Status.UNKNOWN and f.not_checked))

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def counts(self) -> dict[str, int]:
        return {status.value: sum(f.status is status for f in self.findings) for status in Status}

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "status": self.status.value,
            "exit_code": self.exit_code,
            "source": dict(self.source),
            "counts": self.counts(),
            "notes": list(self.notes),
            "not_checked": [{"id": f.id, "title": f.title, "in_part": f.status is not Status.UNKNOWN,
                             **f.not_checked.to_dict()} for f in self.not_checked if f.not_checked],
            "checks": [finding.to_dict() for finding in self.findings],
        }

