"""The generated Prometheus rules: promtool-clean, and a promtool unit test for every alert."""

from __future__ import annotations

import re

import yaml
from monitoring_paths import ALERT_TESTS_DIR, RULES_FILE
from support.promstack import run_tool

from growpage import catalog
from growpage.monitoring.alert_rules import alert_rules
from growpage.monitoring.alert_tests import scenarios
from growpage.monitoring.promql import duration_seconds

RULE_NAME = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")  # level:metric:operations


def _groups() -> list[dict]:
    return yaml.safe_load(RULES_FILE.read_text())["groups"]


def test_promtool_check_rules_is_clean():
    result = run_tool("promtool", "check", "rules", str(RULES_FILE))
    assert "SUCCESS" in result.stdout and "WARNING" not in result.stdout + result.stderr


def test_promtool_unit_tests_pass_for_every_alert():
    files = sorted(ALERT_TESTS_DIR.glob("*.test.yaml"))
    assert {f.name.removesuffix(".test.yaml") for f in files} == {r.name for r in alert_rules()}
    result = run_tool("promtool", "test", "rules", *map(str, files))
    assert result.stdout.count("SUCCESS") == len(files), result.stdout


def test_each_unit_test_checks_silence_before_for_and_firing_after_with_exact_annotations():
    rules = {r.name: r for r in alert_rules()}
    for path in ALERT_TESTS_DIR.glob("*.test.yaml"):
        rule = rules[path.name.removesuffix(".test.yaml")]
        document = yaml.safe_load(path.read_text())
        assert len(document["tests"]) == len(scenarios()[rule.name])
        for test in document["tests"]:
            silent, firing = test["alert_rule_test"]
            gap_s = duration_seconds(firing["eval_time"]) - duration_seconds(silent["eval_time"])
            assert gap_s == duration_seconds(document["evaluation_interval"])
            assert silent["exp_alerts"] == []
            [alert] = firing["exp_alerts"]
            assert alert["exp_labels"]["severity"] == rule.severity
            assert set(alert["exp_annotations"]) == {"summary", "description", "runbook_url"}
            assert "{{" not in alert["exp_annotations"]["description"]


def test_recording_rules_follow_the_naming_convention_and_come_before_their_alerts():
    for group in _groups():
        kinds = ["record" if "record" in rule else "alert" for rule in group["rules"]]
        assert kinds == sorted(kinds, key=lambda kind: kind != "record"), group["name"]
        for rule in group["rules"]:
            if "record" in rule:
                assert RULE_NAME.match(rule["record"]), rule["record"]


def test_every_alert_has_severity_annotations_and_a_runbook_url():
    alerts = [rule for group in _groups() for rule in group["rules"] if "alert" in rule]
    assert len({a["alert"] for a in alerts}) == len(alerts)  # promtool 2.42 needs unique names
    for alert in alerts:
        assert alert["labels"]["severity"] in (catalog.SEVERITY_PAGE, catalog.SEVERITY_TICKET)
        assert alert["annotations"]["runbook_url"] == f"{catalog.RUNBOOK_BASE_URL}/{alert['alert']}.md"
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
        assert duration_seconds(alert["for"]) > 0


def test_slo_and_checklist_thresholds_come_from_the_catalog():
    exprs = {r.name: r.expr for r in alert_rules()}
    assert f"< {catalog.SLO_UTILIZATION.objective}" in exprs["GrowPageKVUtilizationLow"]
    assert f"< {catalog.CHECKLIST.utilization_sustained_low}" in exprs["GrowPageKVUtilizationCritical"]
    assert f"< {catalog.SLO_COMPRESS_RATIO.objective}" in exprs["GrowPageCompressRatioLow"]
    assert f"> {catalog.CHECKLIST.allocation_latency_p99_critical_s}" in exprs["GrowPageAllocationLatencyHigh"]
    assert f"< {catalog.CHECKLIST.gpu_framebuffer_used_low}" in exprs["GrowPageOOMWithFreeGPUMemory"]
    assert f"> {catalog.CHECKLIST.throttle_saturation}" in exprs["GrowPageGrowthThrottled"]
    fast = exprs["GrowPageAllocationLatencyFastBurn"]
    assert "(14.4 * 0.01)" in fast and "rate1h" in fast and "rate5m" in fast and "rate6h" in fast
    assert 'le="0.015"' in RULES_FILE.read_text()
