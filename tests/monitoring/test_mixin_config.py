"""The mixin config: its thresholds and selectors reach every generated rule and panel, and only those.

The generated rules are parsed (YAML) and compared rule by rule with the default build: a custom
config must change exactly the rules that read what it changes, and only in those numbers or matchers.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import yaml
from monitoring_paths import REPO_ROOT

from growpage import catalog
from growpage.errors import ConfigError
from growpage.monitoring import alert_rules as alerts
from growpage.monitoring.alert_tests import alert_test_files
from growpage.monitoring.dashboards import dashboards
from growpage.monitoring.mixin import DEFAULT_CONFIG, GROWPAGE_SERIES, VLLM_SERIES, MixinConfig
from growpage.monitoring.mixin_file import mixin_config_from
from growpage.monitoring.rules_file import dump_yaml, rules_yaml
from support.promstack import promtool_test_rules, run_tool

# Numbers on purpose on the same side of every fixture value the checklist's promtool tests use, so
# the generated promtool tests hold for this config too; the burn-rate fixtures follow the factors.
CUSTOM = mixin_config_from({"thresholds": {
    "vllm_ttft_s": 5.0, "burn_rate_factors": [10, 5, 2, 1], "fleet_load_full": 90,
    "checklist": {"fragmentation_high": 0.6, "throttle_saturation": 0.55}}}, "test")
VLLM_MATCHER = 'namespace=~"llm-.*"'
GROWPAGE_MATCHER = 'tier="gpu", release!="canary"'
SCOPED = MixinConfig(vllm_selector=VLLM_MATCHER, growpage_selector=GROWPAGE_MATCHER)


def _rules(config: MixinConfig) -> dict[tuple, dict]:
    """(group, record or alert, window labels) -> the rule, from the generated YAML."""
    rules = {}
    for group in yaml.safe_load(rules_yaml(config=config))["groups"]:
        for rule in group["rules"]:
            name = rule.get("record") or rule["alert"]
            rules[(group["name"], name, tuple(sorted(rule.get("labels", {}).items())))] = rule
    return rules


def _changed(config: MixinConfig, field: str = "expr") -> dict[tuple, tuple[str, str]]:
    default, custom = _rules(DEFAULT_CONFIG), _rules(config)
    assert default.keys() == custom.keys()
    return {key: (default[key].get(field), custom[key].get(field)) for key in default
            if default[key].get(field) != custom[key].get(field)}


def _window(key: tuple) -> str:
    return dict(key[2]).get("long_window", "")


def test_custom_thresholds_change_exactly_the_rules_that_read_them():
    changed = _changed(CUSTOM)
    ttft_ratios = {key for key in changed if key[1].startswith(f"namespace_model_name:{catalog.SLO_VLLM_TTFT.name}:")}
    burns = {key for key in changed if key[1].endswith("Burn")}
    assert {key[1] for key in burns} == {name for name in catalog.SEVERITY_BY_ALERT if name.endswith("Burn")}
    # Only the recorded good-event rate reads the threshold: every window's ratio is built from it.
    assert {key[1] for key in ttft_ratios} == {f"namespace_model_name:{catalog.SLO_VLLM_TTFT.name}:good_rate5m"}
    others = {key[1] for key in set(changed) - ttft_ratios - burns}
    assert others == {"GrowPageFragmentationHigh", "GrowPageGrowthThrottled", "GrowPageFleetRoutesToPreemptingReplica"}
    for key in ttft_ratios:
        assert changed[key][1] == changed[key][0].replace('le="2.5"', 'le="5.0"')
    factors = dict(zip(("1h", "6h", "1d", "3d"), ("10", "5", "2", "1"), strict=True))
    default_factors = dict(zip(("1h", "6h", "1d", "3d"), ("14.4", "6", "3", "1"), strict=True))
    for key in burns:
        old, new = default_factors[_window(key)], factors[_window(key)]
        assert changed[key][1] == changed[key][0].replace(f"({old} * ", f"({new} * "), key
    for key in set(changed) - ttft_ratios - burns:
        default, custom = changed[key]
        assert custom in (default.replace("> 0.5\n", "> 0.6\n"), default.replace("> 0.5", "> 0.55"),
                          default.replace(">= 100\n", ">= 90\n").replace("< 100", "< 90")), key


def test_custom_thresholds_reach_summaries_dashboards_and_titles():
    summaries = _changed(CUSTOM, "annotations")
    fragmentation = next(new for key, (_, new) in summaries.items() if key[1] == "GrowPageFragmentationHigh")
    assert fragmentation["summary"] == "Page table fragmentation above 60 % while the pool runs short"
    board = dashboards(CUSTOM)["growpage-troubleshooting.json"]
    panels = [p for row in board["panels"] for p in [row, *row.get("panels", [])]]
    [panel] = [p for p in panels if p.get("title") == alerts.PANEL_FRAGMENTATION]
    assert [step["value"] for step in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [None, 0.6]
    fleet = dashboards(CUSTOM)["growpage-fleet.json"]
    steps = [p["fieldConfig"]["defaults"]["thresholds"]["steps"] for p in fleet["panels"]
             if p.get("title") == alerts.PANEL_FLEET_LOAD]
    assert steps == [[{"color": "green", "value": None}, {"color": "red", "value": 90}]]


def test_custom_rules_pass_promtool_and_their_own_unit_tests(tmp_path):
    """The promtool tests of every alert the config changes, generated for it, pass against its rules."""
    (tmp_path / "growpage-rules.yaml").write_text(rules_yaml(config=CUSTOM))
    run_tool("promtool", "check", "rules", str(tmp_path / "growpage-rules.yaml"))
    (tmp_path / "tests").mkdir()
    changed = {key[1] for key in _changed(CUSTOM) if not key[1].startswith("namespace")}
    assert len(changed) == 13  # every SLO's burns (the router's availability too) and three checklist alerts
    paths = []
    for name, document in alert_test_files(CUSTOM).items():
        if name in changed:
            paths.append(tmp_path / "tests" / f"{name}.test.yaml")
            paths[-1].write_text(dump_yaml(document))
    assert promtool_test_rules(paths).count("SUCCESS") == len(paths) == len(changed)


def _series_selectors(expr: str, names: frozenset[str]) -> list[str]:
    """The label matchers of every selector of ``names`` in ``expr`` (empty string: none)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: m.group(0) if "{" not in m.group(0) else '""', expr)
    found = []
    for match in re.finditer(r"(?<![\w:.$\"])([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?", text):
        if match.group(1) in names and not text[match.end():].lstrip().startswith("("):
            found.append(match.group(2) or "")
    return found


def _without(expr: str, matcher: str) -> str:
    return expr.replace(f", {matcher}", "").replace(f"{{{matcher}}}", "")


def test_selectors_join_every_selector_of_their_series_and_change_nothing_else(tmp_path):
    default, scoped = _rules(DEFAULT_CONFIG), _rules(SCOPED)
    seen = {"vllm": 0, "growpage": 0}
    for key, rule in scoped.items():
        expr = rule["expr"]
        assert _without(_without(expr, VLLM_MATCHER), GROWPAGE_MATCHER) == default[key]["expr"], key
        for kind, names, matcher in (("vllm", VLLM_SERIES, VLLM_MATCHER), ("growpage", GROWPAGE_SERIES,
                                                                           GROWPAGE_MATCHER)):
            selectors = _series_selectors(expr, names)
            assert all(matcher in found for found in selectors), (key, selectors)
            seen[kind] += len(selectors)
    assert seen["vllm"] >= 10 and seen["growpage"] >= 30, seen
    (tmp_path / "rules.yaml").write_text(rules_yaml(config=SCOPED))
    run_tool("promtool", "check", "rules", str(tmp_path / "rules.yaml"))


def test_selectors_reach_dashboard_queries():
    text = json.dumps(dashboards(SCOPED))
    queries = [json.loads(f'"{q}"') for q in re.findall(r'"expr": "((?:[^"\\]|\\.)*)"', text)]
    vllm = [s for q in queries for s in _series_selectors(q, VLLM_SERIES)]
    growpage = [s for q in queries for s in _series_selectors(q, GROWPAGE_SERIES)]
    assert vllm and growpage
    assert all(VLLM_MATCHER in s for s in vllm) and all(GROWPAGE_MATCHER in s for s in growpage)


def test_the_scrape_job_reaches_the_scrape_health_panel():
    default_text = json.dumps(dashboards(DEFAULT_CONFIG))
    assert f'job=\\"{catalog.SCRAPE_JOB}\\"' in default_text
    text = json.dumps(dashboards(dataclasses.replace(DEFAULT_CONFIG, growpage_job="growpage-prod")))
    assert 'job=\\"growpage-prod\\"' in text and f'job=\\"{catalog.SCRAPE_JOB}\\"' not in text


def test_the_default_config_leaves_every_expression_as_written():
    assert DEFAULT_CONFIG.scoped('rate(vllm:num_preemptions_total[5m])') == 'rate(vllm:num_preemptions_total[5m])'
    assert SCOPED.scoped('label_replace(vllm:num_requests_waiting, "pod", "$1", "exported_pod", "(.+)")') == (
        f'label_replace(vllm:num_requests_waiting{{{VLLM_MATCHER}}}, "pod", "$1", "exported_pod", "(.+)")')


def test_a_file_with_every_default_spelled_out_is_the_default_config():
    document = json.loads(json.dumps(dataclasses.asdict(DEFAULT_CONFIG)))
    assert mixin_config_from(document) == DEFAULT_CONFIG
    assert mixin_config_from(None) == DEFAULT_CONFIG


@pytest.mark.parametrize(("document", "words"), [
    ({"thresholds": {"checklist": {"fragmentaton_high": 0.6}}}, ["unknown key thresholds.checklist.fragmentaton_high",
                                                                 "fragmentation_high"]),
    ({"cluster": "x"}, ["unknown key cluster", "cluster_label"]),
    ({"thresholds": {"vllm_ttft_s": "5s"}}, ["thresholds.vllm_ttft_s must be a number"]),
    ({"thresholds": {"vllm_itl_objective": 99}}, ["vllm_itl_objective", "between 0 and 1"]),
    ({"thresholds": {"allocation_latency_s": 0.012}}, ["allocation_latency_s", "bucket bound"]),
    ({"thresholds": {"burn_rate_factors": [14.4]}}, ["burn_rate_factors", "4 positive factors"]),
    ({"vllm_selector": "{job='vllm'}"}, ["vllm_selector", "label matchers without braces"]),
    ({"runbook_url_pattern": "https://x/"}, ["{alert}"]),
    (["cluster_label"], ["must be a mapping"]),
])
def test_a_bad_config_names_the_key_and_the_fix(document, words):
    with pytest.raises(ValueError) as raised:
        mixin_config_from(document, "mixin.yaml")
    message = str(raised.value)
    assert message.startswith("mixin.yaml: ") and "\n" not in message
    assert all(word in message for word in words), message


def test_committed_default_artefacts_are_unchanged_by_an_explicit_default_file():
    assert rules_yaml(config=mixin_config_from({})) == (REPO_ROOT / "alerts" / "growpage-rules.yaml").read_text()


def test_the_documented_example_is_a_valid_config_and_every_key_is_documented():
    text = (REPO_ROOT / "docs" / "MONITORING.md").read_text()
    [example] = [block for block in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL) if "growpage-mixin.yaml" in block]
    config = mixin_config_from(yaml.safe_load(example), "docs/MONITORING.md")
    assert config.cluster_label == "k8s_cluster" and config.thresholds.checklist.fragmentation_high == 0.6
    for field in dataclasses.fields(MixinConfig):  # thresholds: by its keys, below
        assert field.name == "thresholds" or f"`{field.name}`" in text, field.name
    for field in dataclasses.fields(catalog.MixinThresholds):
        assert re.search(rf"`(thresholds\.)?{field.name}[`.]", text), field.name


def test_a_time_scaled_config_shortens_every_range_and_for_and_passes_promtool(tmp_path):
    # What a game day runs: the real rules at 1/60, an hour-long window read over a minute.
    from growpage.monitoring.promql import scale_durations
    assert scale_durations('rate(x{le="5m"}[5m]) offset 1h + max_over_time(y[1h:1m])', 1 / 60) == \
        'rate(x{le="5m"}[5s]) offset 1m + max_over_time(y[1m:1s])'
    scaled = MixinConfig(time_scale=1 / 60)
    path = tmp_path / "growpage-rules.yaml"
    path.write_text(rules_yaml(config=scaled))
    run_tool("promtool", "check", "rules", str(path))
    real = {rule.get("alert", rule.get("record")): rule for group in yaml.safe_load(rules_yaml())["groups"]
            for rule in group["rules"]}
    fast = {rule.get("alert", rule.get("record")): rule for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"]}
    assert fast.keys() == real.keys()  # names keep the real windows
    assert fast["GrowPageAgentDown"]["for"] == "5s" and real["GrowPageAgentDown"]["for"] == "5m"
    ratio = f"namespace_model_name:{catalog.SLO_VLLM_TTFT.name}:slo_error_ratio_rate3d"
    assert "[72m]" in fast[ratio]["expr"] and "[3d]" in real[ratio]["expr"]
    with pytest.raises(ConfigError, match="time_scale must be in"):
        mixin_config_from({"time_scale": 2})
