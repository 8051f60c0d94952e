"""The JSON Schema of ``gpctl diagnose --output json`` (schema_version 2), as documented.

``status`` is the worst of the checks that could run; a check that could not run has status
``unknown`` and says in ``not_checked`` what to scrape or save to run it. The report's status is
``unknown`` (exit 3) only when no check could run.

``docs/DIAGNOSE.md`` embeds this exact document and a test keeps the two equal. Additive changes
(a new evidence key, a new check) keep the schema_version; renaming or removing a field, or changing
a meaning, bumps it.
"""

from __future__ import annotations

_STATUS = {"enum": ["ok", "warning", "critical", "unknown"]}
_SEVERITY = {"enum": ["none", "info", "warning", "critical"]}
_EVIDENCE = {
    "type": "object",
    "required": ["metric", "value", "threshold", "window"],
    "properties": {
        "metric": {"type": "string"},
        "value": {"type": ["number", "null"]},
        "threshold": {"type": ["number", "null"]},
        "window": {"type": "string"},
    },
}
_STRINGS = {"type": "array", "items": {"type": "string"}}
_NOT_CHECKED_FIELDS = {"reason": {"type": "string"}, "to_check": {"type": "string"}}
# What could not be evaluated, and what to scrape, save or run so that it can be: the whole check
# when its status is unknown, else a part of it.
_NOT_CHECKED = {"oneOf": [{"type": "null"},
                          {"type": "object", "required": ["reason", "to_check"], "properties": _NOT_CHECKED_FIELDS}]}
# What a check reports, and what each scope of its breakdown reports.
_FINDING_PROPERTIES = {
    "status": _STATUS,
    "severity": _SEVERITY,
    "summary": {"type": "string"},
    "evidence": _EVIDENCE,
    "remediation": _STRINGS,
    "alerts": _STRINGS,
    "not_checked": _NOT_CHECKED,
}
_CHECK_IDS = ["vllm-latency", "slo-utilization", "slo-compress-ratio", "slo-allocation-latency", "over-granting",
              "allocation-latency", "oom-fragmentation", "rollout", "agent-health"]

REPORT_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "gpctl diagnose report",
    "type": "object",
    "required": ["schema_version", "status", "exit_code", "source", "counts", "notes", "not_checked", "checks"],
    "properties": {
        "schema_version": {"const": 2},
        "status": _STATUS,
        "exit_code": {"enum": [0, 1, 2, 3]},
        "source": {
            "type": "object",
            "required": ["kind", "target", "window"],
            "properties": {
                "kind": {"enum": ["endpoint", "prometheus", "snapshot"]},
                "target": {"type": "string"},
                "window": {
                    "type": "object",
                    "required": ["kind", "start", "end", "duration_s", "num_samples", "description"],
                    "properties": {
                        "kind": {"enum": ["scrapes", "snapshots", "range", "lifetime"]},
                        "start": {"type": "string"},
                        "end": {"type": "string"},
                        "duration_s": {"type": "number"},
                        "num_samples": {"type": ["integer", "null"]},
                        "description": {"type": "string"},
                    },
                },
            },
        },
        "counts": {
            "type": "object",
            "required": ["ok", "warning", "critical", "unknown"],
            "additionalProperties": {"type": "integer"},
        },
        "notes": _STRINGS,
        # The checks that could not run (in_part false: status unknown, left out of the verdict), then
        # those that ran in part; in checklist order.
        "not_checked": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "title", "in_part", "reason", "to_check"],
                "properties": {"id": {"enum": _CHECK_IDS}, "title": {"type": "string"},
                               "in_part": {"type": "boolean"}, **_NOT_CHECKED_FIELDS},
            },
        },
        "checks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "title", "status", "severity", "summary", "evidence", "remediation",
                             "runbook_url", "breakdown", "alerts", "not_checked"],
                "properties": {
                    "id": {"enum": _CHECK_IDS},
                    "title": {"type": "string"},
                    **_FINDING_PROPERTIES,
                    "runbook_url": {"type": "string"},
                    "breakdown": {
                        "oneOf": [
                            {"type": "null"},
                            {
                                "type": "object",
                                "required": ["label", "scopes"],
                                "properties": {
                                    "label": {"enum": ["namespace", "pod"]},
                                    "scopes": {
                                        "type": "object",
                                        "additionalProperties": {
                                            "type": "object",
                                            "required": ["status", "severity", "summary", "evidence",
                                                         "remediation"],
                                            "properties": _FINDING_PROPERTIES,
                                        },
                                    },
                                },
                            },
                        ],
                    },
                },
            },
        },
    },
}
