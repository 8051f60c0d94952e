"""The burn-rate decision (``growpage.diagnose.burn``): the alerts' multiwindow logic, pure.

Checked against the rules the alert generator writes from the same ``BurnRateAlert`` objects: one
rule per pair, in the same order, comparing both windows with the same limit.
"""

from __future__ import annotations

import math

import pytest

from growpage import catalog
from growpage.diagnose.burn import PairState, burn_limit, judge_burn_pairs
from growpage.monitoring.alert_rules import alert_rules
from growpage.monitoring.mixin import MixinConfig

ALERTS = catalog.MIXIN_THRESHOLDS.burn_rate_alerts
TTFT = "VLLMTimeToFirstToken"


def states(ratios: dict[str, float], alerts=ALERTS, objective: float = 0.99) -> dict[tuple[str, str, str], str]:
    return {(v.alert, v.window.long_window, v.window.short_window): v.state.value
            for v in judge_burn_pairs(TTFT, alerts, objective, ratios)}


def test_a_30_minute_burn_at_7x_raises_no_fast_burn():
    # 7 % bad for the last 30 minutes of a quiet day: the 6h window holds 30m of 7 % (0.58 % overall),
    # the 1h window half of it. The 30m short window is over 6x, its long window is not: no page.
    ratios = {"5m": 0.07, "30m": 0.07, "1h": 0.035, "2h": 0.0175, "6h": 0.07 / 12, "1d": 0.07 / 48,
              "3d": 0.07 / 144}
    found = states(ratios)
    assert found[("GrowPageVLLMTimeToFirstTokenFastBurn", "6h", "30m")] == "quiet"
    assert found[("GrowPageVLLMTimeToFirstTokenFastBurn", "1h", "5m")] == "quiet"
    assert "firing" not in found.values()


def test_a_pair_fires_only_when_both_windows_exceed_its_limit():
    base = {"5m": 0.0, "30m": 0.0, "1h": 0.0, "2h": 0.0, "6h": 0.0, "1d": 0.0, "3d": 0.0}
    both = states({**base, "1h": 0.15, "5m": 0.15})
    assert both[("GrowPageVLLMTimeToFirstTokenFastBurn", "1h", "5m")] == "firing"
    assert list(both.values()).count("firing") == 1
    assert states({**base, "1h": 0.15})[("GrowPageVLLMTimeToFirstTokenFastBurn", "1h", "5m")] == "quiet"
    assert states({**base, "5m": 0.15})[("GrowPageVLLMTimeToFirstTokenFastBurn", "1h", "5m")] == "quiet"
    # Exactly at the limit is not over it (the rule says ">").
    at_limit = burn_limit(14.4, 0.99)
    assert states({**base, "1h": at_limit, "5m": at_limit})[
        ("GrowPageVLLMTimeToFirstTokenFastBurn", "1h", "5m")] == "quiet"


def test_no_events_never_burn_and_an_uncovered_window_is_not_checked():
    found = states({"5m": math.nan, "1h": math.nan, "30m": 0.5, "6h": 0.5})
    assert found[("GrowPageVLLMTimeToFirstTokenFastBurn", "1h", "5m")] == "quiet"
    assert found[("GrowPageVLLMTimeToFirstTokenFastBurn", "6h", "30m")] == "firing"
    assert found[("GrowPageVLLMTimeToFirstTokenSlowBurn", "1d", "2h")] == "not_checked"
    assert found[("GrowPageVLLMTimeToFirstTokenSlowBurn", "3d", "6h")] == "not_checked"


def test_severity_comes_from_the_severity_table():
    verdicts = judge_burn_pairs("AllocationLatency", ALERTS, 0.99, {})
    assert {v.alert: v.severity for v in verdicts} == {
        "GrowPageAllocationLatencyFastBurn": catalog.SEVERITY_BY_ALERT["GrowPageAllocationLatencyFastBurn"],
        "GrowPageAllocationLatencySlowBurn": catalog.SEVERITY_BY_ALERT["GrowPageAllocationLatencySlowBurn"]}
    assert all(v.state is PairState.NOT_CHECKED for v in verdicts)


@pytest.mark.parametrize("factors", [catalog.MIXIN_THRESHOLDS.burn_rate_factors, (10.0, 5.0, 2.0, 1.0)])
def test_the_pairs_and_limits_are_the_generated_rules(factors):
    thresholds = catalog.MixinThresholds(burn_rate_factors=factors, vllm_ttft_objective=0.995)
    rules = [rule for rule in alert_rules(MixinConfig(thresholds=thresholds))
             if rule.name.startswith(f"GrowPage{TTFT}")]
    verdicts = judge_burn_pairs(TTFT, thresholds.burn_rate_alerts, thresholds.vllm_ttft_objective, {})
    assert [(rule.name, rule.labels["long_window"], rule.labels["short_window"], rule.for_duration)
            for rule in rules] == [(v.alert, v.window.long_window, v.window.short_window, v.window.for_duration)
                                   for v in verdicts]
    for rule, verdict in zip(rules, verdicts, strict=True):
        factor, budget = rule.expr.rsplit("> (", 1)[1].rstrip(")").split(" * ")
        assert float(factor) * float(budget) == verdict.limit, rule.expr
        assert rule.expr.count(f"> ({factor} * {budget})") == 2, rule.expr  # long AND short
