"""The game day's verdicts: a false page, a missed page, a missing resolution and a disagreeing
diagnose each fail a scenario; what a scenario allows does not."""

from __future__ import annotations

from growpage import catalog
from growpage.gameday.receiver import Notification
from growpage.gameday.scenarios import (
    AGENT_DOWN,
    PREEMPTIONS,
    SCENARIOS,
    SCENARIOS_BY_NAME,
    TTFT_FAST,
    DiagnoseOutcome,
    judge,
    summarize,
)


def _delivered(alertname: str, status: str = "firing", receiver: str = "pager") -> Notification:
    return Notification(0.0, receiver, status, alertname, {"alertname": alertname})


def test_every_alert_a_scenario_names_exists_and_diagnose_expects_the_severity_it_implies():
    for scenario in SCENARIOS:
        for name in (*scenario.must_fire, *scenario.may_fire, *scenario.must_resolve):
            assert name in catalog.SEVERITY_BY_ALERT, (scenario.name, name)
    assert SCENARIOS_BY_NAME["kv-storm"].expected_status == "critical"  # the TTFT fast burn pages
    assert SCENARIOS_BY_NAME["exporter-failing"].expected_status == "warning"  # AgentDown is a ticket
    assert SCENARIOS_BY_NAME["idle-off"].expected_status == "ok"


def test_the_storm_passes_with_its_page_and_an_allowed_ticket():
    storm = SCENARIOS_BY_NAME["kv-storm"]
    verdict = judge(storm, [_delivered(TTFT_FAST), _delivered(PREEMPTIONS, receiver="ticket")],
                    DiagnoseOutcome("critical", 2, (TTFT_FAST, PREEMPTIONS)))
    assert verdict.passed and verdict.received == (f"{PREEMPTIONS} (ticket)", f"{TTFT_FAST} (pager)")


def test_a_page_nobody_expects_is_false_and_a_required_one_that_never_came_is_missed():
    idle = SCENARIOS_BY_NAME["idle-monitor"]
    verdict = judge(idle, [_delivered(TTFT_FAST)], DiagnoseOutcome("ok", 0, ()))
    assert not verdict.passed and verdict.false_pages == (TTFT_FAST,)
    failing = SCENARIOS_BY_NAME["exporter-failing"]
    verdict = judge(failing, [], DiagnoseOutcome("warning", 1, (AGENT_DOWN,)))
    assert not verdict.passed and verdict.missed == (AGENT_DOWN,) and verdict.unresolved == (AGENT_DOWN,)


def test_a_page_that_never_resolves_or_a_diagnose_that_disagrees_fails_the_scenario():
    failing = SCENARIOS_BY_NAME["exporter-failing"]
    fired = [_delivered(AGENT_DOWN, receiver="ticket")]
    assert judge(failing, fired, DiagnoseOutcome("warning", 1, (AGENT_DOWN,))).unresolved == (AGENT_DOWN,)
    resolved = [*fired, _delivered(AGENT_DOWN, "resolved", "ticket")]
    assert judge(failing, resolved, DiagnoseOutcome("warning", 1, (AGENT_DOWN,))).passed
    wrong_severity = judge(failing, resolved, DiagnoseOutcome("critical", 2, (AGENT_DOWN,)))
    not_named = judge(failing, resolved, DiagnoseOutcome("warning", 1, ()))
    assert wrong_severity.diagnose_agrees is False and not_named.diagnose_agrees is False
    assert not wrong_severity.passed and not not_named.passed
    assert not judge(failing, resolved, DiagnoseOutcome("warning", 1, (AGENT_DOWN,)),
                     {"the exporter bound its port": False}).passed


def test_the_summary_counts_pages_false_and_missed_and_diagnose_agreement():
    storm, idle = SCENARIOS_BY_NAME["kv-storm"], SCENARIOS_BY_NAME["idle-monitor"]
    verdicts = [judge(storm, [_delivered(TTFT_FAST)], DiagnoseOutcome("critical", 2, (TTFT_FAST,))),
                judge(idle, [_delivered(PREEMPTIONS)], DiagnoseOutcome("warning", 1, (PREEMPTIONS,))),
                judge(SCENARIOS_BY_NAME["slow-start"], [], None)]
    summary = summarize(verdicts)
    assert (summary.scenarios, summary.passed, summary.pages_expected, summary.pages_received) == (3, 2, 1, 1)
    assert (summary.false_pages, summary.missed_pages) == (1, 0)
    assert (summary.diagnose_runs, summary.diagnose_agreements, summary.diagnose_agreement) == (2, 1, 0.5)


def test_a_page_still_open_from_before_counts_once_it_fires_on_the_scenarios_own_data():
    rollback = SCENARIOS_BY_NAME["rollback-to-off"]
    diagnosed = DiagnoseOutcome("critical", 2, (TTFT_FAST,))
    held = judge(rollback, [], diagnosed, held=frozenset({TTFT_FAST}))
    assert held.passed and held.held == (TTFT_FAST,) and held.missed == () and held.received == ()
    assert summarize([held]).pages_received == 1
    neither = judge(rollback, [], diagnosed)
    assert not neither.passed and neither.missed == (TTFT_FAST,)
    delivered_again = judge(rollback, [_delivered(TTFT_FAST)], diagnosed, held=frozenset({TTFT_FAST}))
    assert delivered_again.passed and delivered_again.held == ()  # a delivery needs no hold
    # holding an alert the scenario does not require excuses nothing else
    other = judge(rollback, [], diagnosed, held=frozenset({PREEMPTIONS}))
    assert other.held == () and other.missed == (TTFT_FAST,)
