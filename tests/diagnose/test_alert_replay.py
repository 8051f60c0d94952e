"""Every promtool fixture of every alert, replayed through ``gpctl diagnose``: the two must agree.

A fixture (``alerts/tests/<Alert>.test.yaml``) gives input series in promtool's values notation and
the evaluation times at which the alert fires or must stay silent. The replay samples those series
once per evaluation interval over diagnose's default window (30 minutes, or from the start when the
fixture is shorter) ending at each evaluation time, hands the samples to diagnose as snapshots
(counters become increases between them, exactly as for saved expositions) and runs the checklist.

Agreement, per test case: where the alert fires, the diagnose check that ``catalog.SEVERITY_TABLE``
maps it to names the alert and has the alert's severity (and the matching status); where it stays
silent, that check does not name the alert. Both sides read the same series, vLLM's included.

A deployment that changes thresholds (the mixin config) gets the same agreement: the fixtures
generated for such a config replay through diagnose given the same config, and a threshold moved
past a firing fixture's value silences both promtool and diagnose.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest
import yaml

from growpage import catalog
from growpage.diagnose.checks import run_checks
from growpage.diagnose.checks.base import Thresholds
from growpage.diagnose.exposition import Exposition, Sample
from growpage.diagnose.findings import Finding
from growpage.diagnose.observations import Observations, ServiceErrorRatios
from growpage.diagnose.scrapes import observations_from_expositions
from growpage.diagnose.sources.prometheus_burns import burn_windows, for_namespace, slo_events
from growpage.monitoring.alert_tests import alert_test_files, scenarios
from growpage.monitoring.mixin_file import mixin_config_from
from growpage.monitoring.promql import duration_seconds
from growpage.monitoring.rules_file import dump_yaml, rules_yaml
from support.promstack import run_tool

ALERT_TESTS_DIR = Path(__file__).resolve().parents[2] / "alerts" / "tests"
WINDOW_S = 30 * 60  # gpctl diagnose --since default
_SELECTOR = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?$')
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"(?P<value>(?:[^"\\]|\\.)*)"')
_EXPANDING = re.compile(r"^(?P<start>-?[0-9.e+]+)(?P<sign>[+-])(?P<step>[0-9.e+]+)x(?P<times>\d+)$")
_REPEAT = re.compile(r"^(?P<value>-?[0-9.e+]+|_)x(?P<times>\d+)$")


def parse_selector(series: str) -> tuple[str, dict[str, str]]:
    """``name{a="b", ...}`` -> (name, labels); labels with empty values are absent, as in Prometheus."""
    match = _SELECTOR.match(series.strip())
    assert match, series
    labels = {m["key"]: m["value"] for m in _LABEL.finditer(match["labels"] or "")}
    return match["name"], {key: value for key, value in labels.items() if value}


def expand_values(notation: str) -> list[float | None]:
    """promtool's values notation: ``a+bxn`` (n+1 values), ``axn`` (n+1 copies), ``_`` (missing), numbers."""
    values: list[float | None] = []
    for term in notation.split():
        if expanding := _EXPANDING.match(term):
            start, step = float(expanding["start"]), float(expanding["step"])
            step = step if expanding["sign"] == "+" else -step
            values += [start + step * i for i in range(int(expanding["times"]) + 1)]
        elif repeat := _REPEAT.match(term):
            value = None if repeat["value"] == "_" else float(repeat["value"])
            values += [value] * (int(repeat["times"]) + 1)
        else:
            values.append(None if term in ("_", "stale") else float(term))
    return values


Series = list[tuple[str, dict[str, str], list[float | None]]]
_SERVICE = ("namespace", catalog.MODEL_LABEL)  # the SLO labels the fixtures carry


def _value_at(values: list[float | None], step: int) -> float | None:
    return values[step] if 0 <= step < len(values) else None


def _matches(labels: dict[str, str], name: str, matcher: str) -> bool:
    """Whether a series with ``labels`` matches one PromQL matcher: ``le="2.5"`` or ``reason!~"a|b"``."""
    label, operator, value = re.fullmatch(r'(\w+)(=|!~)"(.*)"', matcher).groups()  # type: ignore[union-attr]
    return labels.get(label) == value if operator == "=" else not re.fullmatch(value, labels.get(label, ""))


def burn_ratios(series: Series, at_s: float, interval_s: float,
                thresholds: catalog.MixinThresholds) -> dict[str, tuple[ServiceErrorRatios, ...]]:
    """Each service's error ratio over every burn window ending at ``at_s``, as the rules compute it
    (good events over all, every pod); a window that starts before the fixture's first sample is left
    out (not covered)."""
    step = int(at_s // interval_s)
    found: dict[str, tuple[ServiceErrorRatios, ...]] = {}
    for slo in slo_events(thresholds):
        services: dict[tuple[str, ...], dict[str, list[float]]] = {}
        for name, labels, values in series:
            kinds = [index for index, (wanted, matcher) in enumerate(((slo.good, slo.good_matcher), (slo.total, "")))
                     if name == wanted and (not matcher or _matches(labels, name, matcher))]
            if not kinds:
                continue
            by_window = services.setdefault(tuple(labels.get(label, "") for label in _SERVICE), {})
            for window in burn_windows(thresholds):
                start = step - int(duration_seconds(window) // interval_s)
                end_value, start_value = _value_at(values, step), _value_at(values, start)
                if start < 0 or end_value is None or start_value is None:
                    continue
                for kind in kinds:
                    by_window.setdefault(window, [0.0, 0.0])[kind] += end_value - start_value
        found[slo.name] = tuple(ServiceErrorRatios(dict(zip(_SERVICE, key, strict=True)),
                                                   {w: 1 - g / n if n else math.nan for w, (g, n) in windows.items()})
                                for key, windows in sorted(services.items()))
    return found


def _with_burns(observations: Observations, burns: dict[str, tuple[ServiceErrorRatios, ...]]) -> Observations:
    breakdown = {name: dataclasses.replace(scope, burn_ratios=for_namespace(burns, name))
                 for name, scope in observations.breakdown.items()}
    return dataclasses.replace(observations, overall=dataclasses.replace(observations.overall, burn_ratios=burns),
                               breakdown=breakdown)


def replay(test: dict, at_s: float, thresholds: Thresholds | None = None) -> list[Finding]:
    """Diagnose over the window ending at ``at_s`` of one promtool test's input series, with
    ``thresholds`` (default: the catalog's).

    The burn windows' ratios are read from the whole fixture, as Prometheus would hold it: what the
    Prometheus source gives the burn checks (snapshots alone hold no history)."""
    interval_s = duration_seconds(test.get("interval", "1m"))
    series = [(*parse_selector(item["series"]), expand_values(item["values"])) for item in test["input_series"]]
    start_s = max(0.0, at_s - WINDOW_S)
    expositions = []
    for step in range(int(start_s // interval_s), int(at_s // interval_s) + 1):
        samples = tuple(Sample(name, labels, values[step]) for name, labels, values in series
                        if step < len(values) and values[step] is not None)
        expositions.append(Exposition(f"fixture@{step}", step * interval_s, samples, ""))
    observations = observations_from_expositions(
        expositions, [e for e in expositions if e.has_dcgm], {"kind": "snapshot", "target": "promtool fixture"},
        sample_noun="snapshots")
    burns = burn_ratios(series, at_s, interval_s, (thresholds or Thresholds.from_catalog()).alerting)
    return list(run_checks(_with_burns(observations, burns), thresholds).findings)


def _cases(documents: dict[str, dict] | None = None) -> list[tuple[str, str, dict, float, bool]]:
    """(alertname, test name, test, evaluation time, fires) for every check of every fixture: the
    committed files, or ``documents`` (alertname -> test file document)."""
    if documents is None:
        documents = {path.name.removesuffix(".test.yaml"): yaml.safe_load(path.read_text())
                     for path in sorted(ALERT_TESTS_DIR.glob("*.test.yaml"))}
    cases = []
    for alert, document in documents.items():
        for test in document["tests"]:
            for check in test.get("alert_rule_test", ()):
                fires = bool(check["exp_alerts"])
                if fires or len(test["alert_rule_test"]) == 1:  # firing checks and near misses
                    cases.append((alert, test["name"], test, duration_seconds(check["eval_time"]), fires))
    return cases


CASES = _cases()
# diagnose has no router check yet (catalog.UNDIAGNOSED_ALERTS): those fixtures are promtool's alone
REPLAYED = [case for case in CASES if case[0] not in catalog.UNDIAGNOSED_ALERTS]


def test_every_alert_has_fixtures_and_a_row_in_the_severity_table():
    alerts = {alert for alert, *_ in CASES}
    assert alerts == set(catalog.SEVERITY_BY_ALERT)
    assert {alert for alert, _, _, _, fires in CASES if fires} == alerts
    assert {alert for alert, _, _, _, fires in CASES if not fires} == alerts


@pytest.mark.parametrize(("alert", "name", "test", "at_s", "fires"), REPLAYED, ids=[case[1] for case in REPLAYED])
def test_diagnose_agrees_with_the_alert(alert: str, name: str, test: dict, at_s: float, fires: bool):
    _assert_agrees(alert, test, at_s, fires)


def _assert_agrees(alert: str, test: dict, at_s: float, fires: bool, thresholds: Thresholds | None = None) -> None:
    check_id = catalog.CHECK_BY_ALERT[alert]
    [finding] = [f for f in replay(test, at_s, thresholds) if f.id == check_id]
    named = set(finding.alerts) | {a for scope in finding.breakdown.values() for a in scope.alerts}
    if fires and alert not in finding.alerts:
        # The one way diagnose may differ: it does not judge a burn pair whose long window starts
        # before the data (the rule rates the part it has), and says so; it never says "quiet".
        expected = _firing_pairs(test, at_s)
        states = {(p["long_window"], p["short_window"]): p["state"] for p in finding.evidence.get("burn_pairs", ())
                  if p["alert"] == alert}
        assert expected and all(states.get(pair) == "not_checked" for pair in expected), (finding.summary, states)
        assert finding.not_checked is not None
    elif fires:
        severity = catalog.SEVERITY_BY_ALERT[alert]
        assert alert in finding.alerts, (finding.status, finding.summary)
        assert finding.severity.value == severity and finding.status.value == severity, finding.summary
    else:
        assert alert not in named, finding.summary


def _firing_pairs(test: dict, at_s: float) -> set[tuple[str, str]]:
    """The burn window pairs the fixture expects to fire at ``at_s`` (from their labels)."""
    return {(alert["exp_labels"]["long_window"], alert["exp_labels"]["short_window"])
            for check in test["alert_rule_test"] if duration_seconds(check["eval_time"]) == at_s
            for alert in check["exp_alerts"] if "long_window" in alert.get("exp_labels", {})}


def test_promtool_values_notation():
    assert expand_values("0+60x2") == [0.0, 60.0, 120.0]
    assert expand_values("5x2 _ 1") == [5.0, 5.0, 5.0, None, 1.0]
    assert expand_values("10-1x1") == [10.0, 9.0]
    assert parse_selector('up{job="a", reason=""}') == ("up", {"job": "a"})


# A deployment's thresholds, other than the catalog's: the burn-rate fixtures generated for it follow
# its SLO thresholds, objectives and factors (promtool passes them: tests/monitoring/test_mixin_config.py).
CUSTOM = mixin_config_from({"thresholds": {
    "vllm_ttft_s": 5.0, "vllm_itl_s": 0.25, "vllm_itl_objective": 0.995, "allocation_latency_s": 0.02,
    "allocation_latency_objective": 0.98, "burn_rate_factors": [10, 5, 2, 1]}}, "test")
CUSTOM_CASES = [case for case in _cases(alert_test_files(CUSTOM)) if case[0] not in catalog.UNDIAGNOSED_ALERTS]


@pytest.mark.parametrize(("alert", "name", "test", "at_s", "fires"), CUSTOM_CASES,
                         ids=[case[1] for case in CUSTOM_CASES])
def test_diagnose_agrees_with_the_alert_under_a_custom_config(alert: str, name: str, test: dict, at_s: float,
                                                              fires: bool):
    _assert_agrees(alert, test, at_s, fires, Thresholds.from_catalog(CUSTOM.thresholds))


def test_the_custom_fixtures_need_the_custom_thresholds():
    # With the catalog's numbers diagnose reads the custom fixtures wrong (no 5 s TTFT bucket, other
    # budgets and factors): the agreement above comes from passing the config, not from the fixtures.
    ttft = [case for case in CUSTOM_CASES if case[0] == "GrowPageVLLMTimeToFirstTokenFastBurn" and case[4]]
    assert ttft and all('le="5.0"' in str(case[2]["input_series"]) for case in ttft)
    assert sum(_disagrees_with_defaults(case) for case in CUSTOM_CASES) >= len(ttft)


def _disagrees_with_defaults(case: tuple[str, str, dict, float, bool]) -> bool:
    """Whether the catalog's thresholds read the case otherwise than the custom ones: a different
    verdict, or other burn ratios for the same pairs (a pair whose window the fixture does not cover
    is not checked under both, so its ratios are compared instead of its verdict)."""
    alert, _, test, at_s, fires = case
    try:
        _assert_agrees(alert, test, at_s, fires)
    except AssertionError:
        return True
    check_id = catalog.CHECK_BY_ALERT[alert]
    [default] = [f for f in replay(test, at_s) if f.id == check_id]
    [custom] = [f for f in replay(test, at_s, Thresholds.from_catalog(CUSTOM.thresholds)) if f.id == check_id]
    return (default.status, default.evidence.get("value")) != (custom.status, custom.evidence.get("value"))


# A threshold moved past the value a firing fixture holds: the alert stays silent in promtool, and
# diagnose, given the same config, does not name it.
FLIPS = [
    ("GrowPageKVUtilizationLow", {"utilization_objective": 0.45}),
    ("GrowPageKVOverGranting", {"checklist": {"utilization_sustained_low": 0.25}}),
    ("GrowPageCompressRatioLow", {"compress_ratio_objective": 1.9}),
    ("GrowPageAllocationLatencyHigh", {"checklist": {"allocation_latency_p99_critical_s": 0.06}}),
    ("GrowPageFragmentationHigh", {"checklist": {"fragmentation_high": 0.7}}),
    ("GrowPageKVPagesStranded", {"checklist": {"stranded_slots_high": 0.9}}),
    ("GrowPageVLLMPreemptions", {"vllm_preemptions_per_s_high": 0.2}),
    ("GrowPageFleetRoutesToPreemptingReplica", {"fleet_load_full": 160}),
    ("GrowPageGrowthThrottled", {"checklist": {"throttle_saturation": 0.7}}),
]


@pytest.mark.parametrize(("alert", "thresholds"), FLIPS, ids=[alert for alert, _ in FLIPS])
def test_a_raised_threshold_silences_the_alert_and_diagnose_alike(alert: str, thresholds: dict, tmp_path: Path):
    config = mixin_config_from({"thresholds": thresholds}, "test")
    (tmp_path / "rules.yaml").write_text(rules_yaml(config=config))
    firing = alert_test_files(config)[alert]["tests"]
    assert len(firing) > len(scenarios()[alert]) >= 1
    silenced = [_silent(test) for test in firing[:len(scenarios()[alert])]]
    (tmp_path / "silent.test.yaml").write_text(dump_yaml({"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
                                                          "tests": silenced}))
    assert "SUCCESS" in run_tool("promtool", "test", "rules", str(tmp_path / "silent.test.yaml")).stdout
    for test in silenced:
        for check in test["alert_rule_test"]:
            _assert_agrees(alert, test, duration_seconds(check["eval_time"]), False,
                           Thresholds.from_catalog(config.thresholds))
        # The default thresholds still fire on the same series: the config, not the fixture, silenced it.
        _assert_agrees(alert, test, duration_seconds(test["alert_rule_test"][-1]["eval_time"]), True)


def _silent(test: dict) -> dict:
    """A firing test case turned around: the alert silent where it fired (and well after)."""
    fired_at = duration_seconds(test["alert_rule_test"][-1]["eval_time"])
    checks = [{"eval_time": f"{int(at_s // 60)}m", "alertname": test["alert_rule_test"][-1]["alertname"],
               "exp_alerts": []} for at_s in (fired_at, fired_at + 1800)]
    return {**test, "name": f"silent: {test['name']}", "alert_rule_test": checks}

