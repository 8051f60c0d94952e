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


SCHEMA_VERSION = 1  # of Report.to_dict(); see growpage.diagnose.schema

# Exit codes of `gpctl diagnose` (documented): 3 also covers "could not diagnose at all".
EXIT_CODES = {Status.OK: 0, Status.WARNING: 1, Status.CRITICAL: 2, Status.UNKNOWN: 3}
EXIT_CANNOT_DIAGNOSE = 3

# NOTE: unknown ranks below warning and critical: a problem we did find is never hidden by a check
# we could not evaluate; but it ranks above ok, because "ok" must mean every check was evaluated.
_VERDICT_RANK = {Status.OK: 0, Status.UNKNOWN: 1, Status.WARNING: 2, Status.CRITICAL: 3}


def worst(statuses: list[Status] | tuple[Status, ...]) -> Status:
    """The verdict over ``statuses``: critical > warning > unknown > ok (ok when empty)."""
    return max(statuses, key=_VERDICT_RANK.__getitem__, default=Status.OK)


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
    """

    status: Status
    summary: str
    evidence: Mapping[str, Any]
    remediation: tuple[str, ...] = ()
    severity: Severity | None = None
    alerts: tuple[str, ...] = ()

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
        return worst([finding.status for finding in self.findings])

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
            "checks": [finding.to_dict() for finding in self.findings],
        }

