"""Runbooks: one per alert, reachable from its runbook_url, with the sections and commands an SRE needs."""

from __future__ import annotations

import re

import pytest
from monitoring_paths import RUNBOOKS_DIR

from growpage import catalog
from growpage.monitoring import router_rules
from growpage.monitoring.alert_rules import alert_rules
from growpage.monitoring.panel_queries import run_panel_queries
from growpage.monitoring.promql import metric_names
from growpage.monitoring.recording_rules import recording_rule_names
from growpage.monitoring.runbook_sections import BEGIN, END, INDEX

SECTIONS = ("## Meaning", "## Impact", "## Diagnosis", "## Mitigation", "## Verify the fix", "## Escalation")
PARAMETERS = ("$NAMESPACE", "$PROMETHEUS", "$ALERTMANAGER")
PROMQL_BLOCK = re.compile(r"```promql\n(.*?)\n```", re.DOTALL)
KNOWN_METRICS = ({n for spec in (*catalog.METRICS, *catalog.ROUTER_METRICS, *catalog.VLLM_HOME_METRICS)
                  for n in spec.series_names}
                 | recording_rule_names() | {rule.record for rule in router_rules.recording_rules()}
                 | set(catalog.ROUTER_METRICS_SERIES)
                 | {"up", catalog.DCGM_FB_USED, catalog.DCGM_FB_FREE, catalog.DCGM_GPU_UTIL, *catalog.VLLM_METRICS})


def _resolve(runbook_url: str):
    """Maps RUNBOOK_BASE_URL onto the runbooks/ folder, as the repository serves it."""
    assert runbook_url.startswith(catalog.RUNBOOK_BASE_URL + "/")
    return RUNBOOKS_DIR / runbook_url.removeprefix(catalog.RUNBOOK_BASE_URL + "/")


def test_every_alert_has_a_runbook_its_url_resolves_to():
    for rule in alert_rules():
        assert _resolve(rule.runbook_url).is_file(), rule.runbook_url


def test_every_runbook_belongs_to_an_alert_or_is_the_index():
    names = {rule.name for rule in alert_rules()}
    for path in RUNBOOKS_DIR.glob("*.md"):
        assert path.name == INDEX or path.stem in names, f"{path.name} has no alert"


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: rule.name)
def test_runbook_has_the_sections_the_rule_and_the_diagnose_command(rule):
    text = _resolve(rule.runbook_url).read_text()
    assert text.startswith(f"# {rule.name}\n")
    positions = [text.index(section) for section in SECTIONS]
    assert positions == sorted(positions)
    generated = text[text.index(BEGIN):text.index(END)]
    assert rule.expr in generated and f"`{rule.for_duration}`" in generated
    assert "gpctl diagnose --" in text
    assert "kubectl" in text or rule.severity == catalog.SEVERITY_TICKET
    # Parameterised: no deployment name or Prometheus address of one cluster baked in.
    assert all(parameter in text for parameter in PARAMETERS), rule.name
    assert "vllm-reasoning" not in text and ":9090" not in text, rule.name
    verify = text[text.index("## Verify the fix"):]
    assert f"alertname={rule.name}" in verify and "gpctl diagnose" in verify


def test_index_lists_every_alert_and_names_the_real_minimum_vllm_version():
    text = (RUNBOOKS_DIR / INDEX).read_text()
    for rule in alert_rules():
        assert f"[{rule.name}]({rule.name}.md)" in text
    assert f"vLLM >= {catalog.MIN_SUPPORTED_VLLM_VERSION}" in text
    assert "No vLLM release contains GrowPage" in text


def _promql_blocks() -> list[tuple[str, str]]:
    return [(path.name, block) for path in sorted(RUNBOOKS_DIR.glob("*.md"))
            for block in PROMQL_BLOCK.findall(path.read_text())]


def test_runbook_promql_reads_only_known_metrics():
    for name, block in _promql_blocks():
        assert not metric_names(block) - KNOWN_METRICS, f"{name}: {metric_names(block) - KNOWN_METRICS}"


def test_runbook_promql_runs_on_prometheus(backfilled_prometheus):
    board = {"title": "runbooks", "panels": [
        {"id": i, "title": name, "targets": [{"refId": "A", "expr": block}]}
        for i, (name, block) in enumerate(_promql_blocks())]}
    failures = [str(r) for r in run_panel_queries(backfilled_prometheus.url, [board], backfilled_prometheus.at)
                if not r.ok]
    assert not failures, "\n".join(failures)


def test_every_diagnose_check_links_an_existing_runbook_page():
    for check_id, page in catalog.CHECK_RUNBOOKS.items():
        file_name, _, anchor = page.partition("#")
        path = RUNBOOKS_DIR / file_name
        assert path.is_file(), f"check {check_id} links {page}, which does not exist"
        if anchor:
            headings = [line.lstrip("#").strip().lower() for line in path.read_text().splitlines()
                        if line.startswith("#")]
            slugs = {"-".join("".join(c for c in h if c.isalnum() or c in " -").split()) for h in headings}
            assert anchor in slugs, f"check {check_id} links #{anchor}, not a heading of {file_name}"


def test_runbook_commands_take_parameters_not_literal_names():
    # `kubectl logs POD` would be run as typed: commands use $POD, set from the alert's labels.
    for path in RUNBOOKS_DIR.glob("*.md"):
        assert not re.search(r"(?<![$\w`])POD(?![\w`])", path.read_text()), path.name


def test_runbooks_name_the_severity_the_table_gives():
    for rule in alert_rules():
        text = _resolve(rule.runbook_url).read_text()
        escalation = text[text.index("## Escalation"):]
        lead = "It pages:" if rule.severity == catalog.SEVERITY_PAGE else "It is a ticket:"
        assert lead in escalation and f"`{rule.severity}`" in text, rule.name
