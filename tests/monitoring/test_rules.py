"""The generated Prometheus rules: promtool-clean, and a promtool unit test for every alert."""

from __future__ import annotations

import re

import yaml
from monitoring_paths import ALERT_TESTS_DIR, RULES_FILE

from growpage import catalog
from growpage.monitoring import router_rules
from growpage.monitoring.alert_rules import alert_rules
from growpage.monitoring.alert_tests import alert_test_files, quiet_scenarios, scenarios, timeline_scenarios
from growpage.monitoring.mixin import MixinConfig
from growpage.monitoring.promql import duration_seconds
from growpage.monitoring.rules_file import dump_yaml, rules_yaml
from support.promstack import promtool_test_rules, run_tool

RULE_NAME = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")  # level:metric:operations


def _groups() -> list[dict]:
    return yaml.safe_load(RULES_FILE.read_text())["groups"]


def test_promtool_check_rules_is_clean():
    result = run_tool("promtool", "check", "rules", str(RULES_FILE))
    assert "SUCCESS" in result.stdout and "WARNING" not in result.stdout + result.stderr


def test_promtool_unit_tests_pass_for_every_alert():
    files = sorted(ALERT_TESTS_DIR.glob("*.test.yaml"))
    assert {f.name.removesuffix(".test.yaml") for f in files} == {r.name for r in alert_rules()}
    stdout = promtool_test_rules(files)
    assert stdout.count("SUCCESS") == len(files), stdout


def test_each_unit_test_checks_silence_before_for_and_firing_after_with_exact_annotations():
    rules = {r.name: r for r in alert_rules()}
    for path in ALERT_TESTS_DIR.glob("*.test.yaml"):
        rule = rules[path.name.removesuffix(".test.yaml")]  # the severity and annotations of every pair
        document = yaml.safe_load(path.read_text())
        firing_tests = [t for t in document["tests"] if len(t.get("alert_rule_test", [])) == 2]
        assert len(firing_tests) == len(scenarios()[rule.name])
        for test in firing_tests:
            silent, firing = test["alert_rule_test"]
            gap_s = duration_seconds(firing["eval_time"]) - duration_seconds(silent["eval_time"])
            assert gap_s == duration_seconds(document["evaluation_interval"])
            assert silent["exp_alerts"] == []
            [alert] = firing["exp_alerts"]
            assert alert["exp_labels"]["severity"] == rule.severity
            assert set(alert["exp_annotations"]) - {"growpage_view"} == {"summary", "description", "runbook_url"}
            assert "{{" not in alert["exp_annotations"]["description"]


def test_every_alert_has_a_case_where_its_condition_is_false():
    longest: dict[str, float] = {}
    for rule in alert_rules():
        longest[rule.name] = max(longest.get(rule.name, 0.0), duration_seconds(rule.for_duration))
    for path in ALERT_TESTS_DIR.glob("*.test.yaml"):
        name = path.name.removesuffix(".test.yaml")
        quiet = [t for t in yaml.safe_load(path.read_text())["tests"] if len(t.get("alert_rule_test", [])) == 1]
        assert len(quiet) == len(quiet_scenarios()[name]) >= 1, name
        for test in quiet:
            [check] = test["alert_rule_test"]
            assert check["exp_alerts"] == []
            assert duration_seconds(check["eval_time"]) > longest[name]


def test_every_alert_that_reads_growpage_has_a_mode_off_near_miss():
    # A pod in mode off exports build info and nothing GrowPage says about it may page or ticket.
    mode_free = {"GrowPageAgentDown", "GrowPageMetricsAbsent", "GrowPageAgentErrors",  # any mode
                 *(rule.name for rule in router_rules.alerts())}  # the router's own series: no GrowPage mode
    for name, quiet in quiet_scenarios().items():
        if name in mode_free:
            continue
        assert any('mode="off"' in series for scenario in quiet for series in scenario.series), name


def test_every_page_stays_silent_for_a_healthy_idle_pod():
    for name in (rule.name for rule in alert_rules() if rule.severity == catalog.SEVERITY_PAGE):
        assert any("idle" in quiet.title for quiet in quiet_scenarios()[name]), name


def test_what_users_feel_pages_whatever_growpage_does_and_a_starting_pod_pages_nobody():
    # The rollback (mode off) and a dead exporter must not silence vLLM's SLO pages; a pod loading
    # its model (neither target answers) must not page at all, AgentDown included.
    for name in (rule.name for rule in alert_rules() if rule.name.startswith("GrowPageVLLM") and "Burn" in rule.name):
        titles = [scenario.title for scenario in scenarios()[name]]
        assert any("rolled back to off" in title for title in titles), name
        assert any("no GrowPage series" in title for title in titles), name
    for name in ("GrowPageAgentDown", "GrowPageMetricsAbsent",
                 *(rule.name for rule in alert_rules() if rule.severity == catalog.SEVERITY_PAGE
                   and rule.name.startswith("GrowPageVLLM"))):
        assert any("loading its model" in quiet.title for quiet in quiet_scenarios()[name]), name


def test_a_replaced_pod_keeps_its_burn_in_every_slow_budget():
    timelines = timeline_scenarios()
    slow = {rule.name for rule in alert_rules() if rule.name.endswith("SlowBurn")}
    assert set(timelines) == slow
    for name in slow:
        [timeline] = timelines[name]
        # fires after the pod is gone, stays up an hour later, and resolves
        assert [firing for _, firing in timeline.firing] == [False, True, True, False], name


def test_burn_rate_pairs_have_their_own_for_and_window_labels():
    burns = [rule for rule in alert_rules() if rule.name.endswith("Burn")]
    assert {rule.name for rule in burns} >= {"GrowPageVLLMTimeToFirstTokenFastBurn",
                                             "GrowPageVLLMInterTokenLatencyFastBurn"}
    for rule in burns:
        assert set(rule.labels) == {"long_window", "short_window"}
        assert f"rate{rule.labels['long_window']}" in rule.expr and f"rate{rule.labels['short_window']}" in rule.expr
    pairs = {(rule.name, rule.labels["long_window"]): rule.for_duration for rule in burns}
    fast_burn = "GrowPageVLLMTimeToFirstTokenFastBurn"
    assert pairs[(fast_burn, "1h")] != pairs[(fast_burn, "6h")]


def test_severities_come_from_the_one_table():
    for rule in alert_rules():
        assert rule.severity == catalog.SEVERITY_BY_ALERT[rule.name]
    pages = {rule.name for rule in alert_rules() if rule.severity == catalog.SEVERITY_PAGE}
    assert pages == {"GrowPageVLLMTimeToFirstTokenFastBurn", "GrowPageVLLMInterTokenLatencyFastBurn",
                     "GrowPageVLLMAvailabilityFastBurn", "GrowPageKVPagesStranded",
                     "GrowPageRouterNoHealthyWorker", "GrowPageRouterAvailabilityFastBurn"}


def test_the_page_for_stranded_pages_ignores_the_framebuffer_vllm_keeps_full():
    # vLLM reserves its KV cache at start-up: the framebuffer stays ~90 % full whatever happens.
    [rule] = [r for r in alert_rules() if r.name == "GrowPageKVPagesStranded"]
    assert catalog.DCGM_FB_USED not in rule.expr and "framebuffer" not in rule.expr
    assert catalog.VLLM_PREEMPTIONS in rule.expr and catalog.VLLM_KV_CACHE_USAGE in rule.expr
    titles = [scenario.title for scenario in scenarios()[rule.name]]
    assert any("framebuffer 92 %" in title for title in titles)


def test_slo_alerts_are_per_service_across_pods():
    slo_names = {"GrowPageKVUtilizationLow", "GrowPageCompressRatioLow", "GrowPageAllocationLatencyFastBurn",
                 "GrowPageAllocationLatencySlowBurn", "GrowPageVLLMTimeToFirstTokenFastBurn",
                 "GrowPageVLLMInterTokenLatencySlowBurn"}
    for scenario_list in (scenarios()[name] for name in slo_names):
        for scenario in scenario_list:
            assert "pod" not in scenario.labels and set(catalog.SLO_LABELS) <= set(scenario.labels)


def test_recording_rules_follow_the_naming_convention_and_come_before_their_alerts():
    for group in _groups():
        kinds = ["record" if "record" in rule else "alert" for rule in group["rules"]]
        assert kinds == sorted(kinds, key=lambda kind: kind != "record"), group["name"]
        for rule in group["rules"]:
            if "record" in rule:
                assert RULE_NAME.match(rule["record"]), rule["record"]


def test_every_alert_has_severity_annotations_and_a_runbook_url():
    alerts = [rule for group in _groups() for rule in group["rules"] if "alert" in rule]
    # Rules that share a name (burn-rate pairs) differ in their labels, so promtool tells them apart.
    keys = [(a["alert"], tuple(sorted(a["labels"].items()))) for a in alerts]
    assert len(set(keys)) == len(keys)
    for alert in alerts:
        assert alert["labels"]["severity"] in (catalog.SEVERITY_PAGE, catalog.SEVERITY_TICKET)
        assert alert["annotations"]["runbook_url"] == f"{catalog.RUNBOOK_BASE_URL}/{alert['alert']}.md"
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
        assert duration_seconds(alert["for"]) > 0


def test_slo_and_checklist_thresholds_come_from_the_catalog():
    exprs: dict[str, str] = {}
    for rule in alert_rules():
        exprs[rule.name] = exprs.get(rule.name, "") + rule.expr
    assert f"< {catalog.SLO_UTILIZATION.objective}" in exprs["GrowPageKVUtilizationLow"]
    assert f"< {catalog.CHECKLIST.utilization_sustained_low}" in exprs["GrowPageKVOverGranting"]
    assert f"< {catalog.SLO_COMPRESS_RATIO.objective}" in exprs["GrowPageCompressRatioLow"]
    assert f"> {catalog.CHECKLIST.allocation_latency_p99_critical_s}" in exprs["GrowPageAllocationLatencyHigh"]
    assert f"<= {catalog.CHECKLIST.pool_free_low}" in exprs["GrowPageKVPagesStranded"]
    assert f">= {catalog.CHECKLIST.stranded_slots_high}" in exprs["GrowPageKVPagesStranded"]
    assert f"< {catalog.CHECKLIST.fragmentation_pool_free_max}" in exprs["GrowPageFragmentationHigh"]
    assert f"> {catalog.CHECKLIST.throttle_saturation}" in exprs["GrowPageGrowthThrottled"]
    fast = exprs["GrowPageAllocationLatencyFastBurn"]
    assert "(14.4 * 0.01)" in fast and "rate1h" in fast and "rate5m" in fast and "rate6h" in fast
    assert 'le="0.015"' in RULES_FILE.read_text()


def test_a_mixin_config_keeps_its_cluster_label_and_passes_promtool(tmp_path):
    config = MixinConfig(cluster_label="k8s_cluster", runbook_url_pattern="https://rb.example/{alert}.html")
    (tmp_path / "growpage-rules.yaml").write_text(rules_yaml(config=config))
    tests = tmp_path / "tests"
    tests.mkdir()
    files = []
    for name, document in alert_test_files(config).items():
        if name.startswith(("GrowPageVLLMTimeToFirstToken", "GrowPageKVPagesStranded", "GrowPageAgentDown")):
            files.append(tests / f"{name}.test.yaml")
            files[-1].write_text(dump_yaml(document))
    stdout = promtool_test_rules(files)
    assert stdout.count("SUCCESS") == len(files) == 4, stdout
    text = (tmp_path / "growpage-rules.yaml").read_text()
    assert "cluster, namespace" not in text.replace("k8s_cluster, namespace", "")
    assert "https://rb.example/GrowPageAgentDown.html" in text
