"""``gpctl diagnose``: walk the troubleshooting checklist against live or saved GrowPage metrics.

Layers, one direction: ``sources`` (endpoint, Prometheus, snapshots) -> :class:`Observations`
-> pure ``checks`` -> :class:`Report` -> ``render`` (rich text, JSON) and ``bundle``. See
``docs/DIAGNOSE.md`` for the checks, the JSON schema and the exit codes.
"""

from growpage.diagnose.checks import CHECKS, run_checks
from growpage.diagnose.errors import DiagnoseError
from growpage.diagnose.findings import EXIT_CANNOT_DIAGNOSE, Finding, Report, Severity, Status
from growpage.diagnose.observations import Observations, Scope, Window
from growpage.diagnose.request import DiagnoseRequest, diagnose, parse_duration_s, parse_label_map, parse_time_s

__all__ = [
    "CHECKS", "EXIT_CANNOT_DIAGNOSE", "DiagnoseError", "DiagnoseRequest", "Finding", "Observations", "Report",
    "Scope", "Severity", "Status", "Window", "diagnose", "parse_duration_s", "parse_label_map", "parse_time_s",
    "run_checks",
]
