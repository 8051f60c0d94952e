"""Render a :class:`~growpage.diagnose.findings.Report`: a rich text report, or the documented JSON.

The text report leads with the verdict and its exit code, then one row per check: status, summary,
evidence (metric = value, threshold, window, extras), per-namespace problems, fix steps and the
runbook page. It wraps at the console width and stays readable at 80 columns without colour.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from growpage import catalog
from growpage.diagnose.findings import Finding, Report, Severity, Status

STATUS_STYLES = {Status.OK: "bold green", Status.WARNING: "bold yellow", Status.CRITICAL: "bold red",
                 Status.UNKNOWN: "bold magenta"}
# A check's row: unknown means it could not run (left out of the verdict); the verdict says UNKNOWN.
ROW_LABELS = {Status.OK: "OK", Status.WARNING: "WARNING", Status.CRITICAL: "CRITICAL", Status.UNKNOWN: "NOT CHECKED"}
_CORE_EVIDENCE = ("metric", "value", "threshold", "window")
_JSON_ONLY_EVIDENCE = ("burn_pairs",)  # every pair judged: the summary names the firing ones


def to_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, allow_nan=False)


def render_text(report: Report, console: Console) -> None:
    """Print the report on ``console`` (its width decides the wrapping)."""
    status = report.status
    counts = report.counts()
    tally = ", ".join(f"{counts[s.value]} {ROW_LABELS[s].lower()}" for s in (Status.CRITICAL, Status.WARNING,
                                                                             Status.OK, Status.UNKNOWN)
                      if counts[s.value])
    advised = sum(f.status is Status.OK and f.severity is Severity.INFO for f in report.findings)
    if advised:
        tally += f" ({advised} with advice)"
    verdict = Text.assemble(("VERDICT: ", "bold"), (status.value.upper(), STATUS_STYLES[status]),
                            f" (exit {report.exit_code}): {tally}")
    console.print(verdict)
    source = report.source
    selector = source.get("selector")
    target = f"{source.get('kind')} {source.get('target')}" + (f" {selector}" if selector not in (None, "{}") else "")
    console.print(Text(f"Source: {target}"))
    if source.get("dcgm"):
        console.print(Text(f"DCGM: {source['dcgm']}"))
    console.print(Text(f"Window: {source['window']['description']}"))
    for note in report.notes:
        console.print(Text(f"Note: {note}", style="yellow"))
    table = Table(box=box.SIMPLE_HEAD, show_lines=True, expand=True, pad_edge=False)
    table.add_column("Status", no_wrap=True, width=8)
    table.add_column("Check and evidence", ratio=1, overflow="fold")
    for finding in report.findings:
        label = ROW_LABELS[finding.status].replace(" ", "\n")  # NOT CHECKED on two lines: the column stays 8 wide
        table.add_row(Text(label, style=STATUS_STYLES[finding.status]), _row(finding))
    console.print(table)
    _not_checked(report, console)
    console.print(Text("Runbook pages (\"runbook:\" above) are under:"))
    console.print(Text(f"  {catalog.RUNBOOK_BASE_URL}/"))


def _not_checked(report: Report, console: Console) -> None:
    """What could not be checked (left out of the verdict) and how to check it."""
    if not report.not_checked:
        return
    console.print(Text("Not checked (left out of the verdict), and how to check it:", style="bold"))
    for finding in report.not_checked:
        assert finding.not_checked is not None
        part = " (in part)" if finding.status is not Status.UNKNOWN else ""
        console.print(Text(f"  [{finding.id}]{part} {finding.not_checked.reason}; to check it: "
                           f"{finding.not_checked.to_check}"))


def _row(finding: Finding) -> Group:
    parts = [Text.assemble((finding.title, "bold"), (f" [{finding.id}]", "dim")), Text(finding.summary)]
    parts.append(Text("evidence: " + _core_evidence(finding.evidence)))
    # Details only where someone has to act or read advice; the JSON always has everything.
    if finding.status is not Status.OK or finding.severity is not Severity.NONE:
        extras = _extra_evidence(finding.evidence)
        if extras:
            parts.append(Text("  " + extras, style="dim"))
    for name, scope in sorted(finding.breakdown.items()):
        if scope.status is not Status.OK or scope.resolved_severity is Severity.INFO:
            parts.append(Text.assemble(f"{finding.breakdown_label} {name}: ",
                                       (ROW_LABELS[scope.status], STATUS_STYLES[scope.status]),
                                       f" {scope.summary}"))
    quiet = [name for name, scope in finding.breakdown.items()
             if scope.status is Status.OK and scope.resolved_severity is not Severity.INFO]
    if quiet:
        parts.append(Text(f"{finding.breakdown_label}s ok: {', '.join(sorted(quiet))}", style="dim"))
    for number, step in enumerate(finding.remediation, start=1):
        parts.append(Text(f"fix {number}. {step}"))
    page = finding.runbook_url.rsplit("/", 1)[-1]
    parts.append(Text.assemble("runbook: ", (page, f"link {finding.runbook_url}")))
    return Group(*parts)


def _core_evidence(evidence: Mapping[str, Any]) -> str:
    threshold = evidence.get("threshold")
    bound = f"threshold {_format(threshold)}; " if threshold is not None else ""
    return f"{evidence.get('metric')} = {_format(evidence.get('value'))} ({bound}window {evidence.get('window')})"


def _extra_evidence(evidence: Mapping[str, Any]) -> str:
    items = [f"{key}={_format(value)}" for key, value in evidence.items()
             if key not in (*_CORE_EVIDENCE, *_JSON_ONLY_EVIDENCE) and value not in (None, [], {}, "")]
    return "  ".join(items)


def _format(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:g}" if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    text = str(value)
    return json.dumps(text) if " " in text else text  # quote values with spaces: key="NVIDIA H100"
