"""docs/DIAGNOSE.md stays true: its JSON schema is the code's, its example validates, every check is listed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema

from growpage import catalog
from growpage.diagnose.checks import CHECKS
from growpage.diagnose.schema import REPORT_SCHEMA

DOC = Path(__file__).resolve().parents[2] / "docs" / "DIAGNOSE.md"


def json_blocks() -> list[dict]:
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)\n```", DOC.read_text(), re.DOTALL)]


def test_documented_schema_is_the_code_schema():
    example, schema = json_blocks()
    assert schema == REPORT_SCHEMA
    jsonschema.validate(example, REPORT_SCHEMA)


def test_every_check_and_exit_code_is_documented():
    text = DOC.read_text()
    for check in CHECKS:
        assert f"`{check.id}`" in text
    for code, verdict in ((0, "OK"), (1, "WARNING"), (2, "CRITICAL"), (3, "UNKNOWN")):
        assert f"| {code} | `{verdict}` |" in text
    assert "# growpage-snapshot-time: <unix seconds>" in text
    assert catalog.MIN_SUPPORTED_VLLM_VERSION in text and "not a vLLM rule" in text
