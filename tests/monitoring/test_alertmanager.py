"""The generated Alertmanager config: amtool-clean, each alert reaches its receiver, inhibitions pair up."""

from __future__ import annotations

import pytest
import yaml
from monitoring_paths import ALERTMANAGER_FILE
from support.promstack import run_tool

from growpage.monitoring.alert_rules import alert_names, alert_rules
from growpage.monitoring.alertmanager import INHIBIT_PAIRS, PLACEHOLDER_WEBHOOK_URLS, RECEIVER_BY_SEVERITY


def test_amtool_check_config_is_clean():
    result = run_tool("amtool", "check-config", str(ALERTMANAGER_FILE))
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: rule.name)
def test_each_alert_is_routed_to_the_receiver_of_its_severity(rule):
    receiver = RECEIVER_BY_SEVERITY[rule.severity]
    run_tool("amtool", "config", "routes", "test", f"--config.file={ALERTMANAGER_FILE}",
             f"--verify.receivers={receiver}", f"alertname={rule.name}", f"severity={rule.severity}",
             "namespace=math-reasoning", "pod=vllm-reasoning-0")


def test_inhibit_rules_pair_a_critical_alert_with_its_warning_sibling():
    severity = {rule.name: rule.severity for rule in alert_rules()}
    config = yaml.safe_load(ALERTMANAGER_FILE.read_text())
    assert len(config["inhibit_rules"]) == len(INHIBIT_PAIRS)
    for pair, rule in zip(INHIBIT_PAIRS, config["inhibit_rules"]):
        assert {pair.source, pair.target} <= set(alert_names())
        assert (severity[pair.source], severity[pair.target]) == ("critical", "warning")
        assert rule["source_matchers"] == [f'alertname="{pair.source}"']
        assert rule["equal"] == list(pair.equal)


def test_receivers_are_placeholder_webhooks_and_grouping_is_per_pod():
    config = yaml.safe_load(ALERTMANAGER_FILE.read_text())
    urls = {r["name"]: r["webhook_configs"][0]["url"] for r in config["receivers"]}
    assert urls == PLACEHOLDER_WEBHOOK_URLS and all(".invalid/" in url for url in urls.values())
    assert config["route"]["routes"][0]["group_by"] == ["alertname", "namespace", "pod"]
