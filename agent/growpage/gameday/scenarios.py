"""What each game-day scenario must page, may page and must resolve, and the verdict on what happened.

Pure: the runner (:mod:`growpage.gameday.runner`) drives the real systems and hands the
notifications Alertmanager delivered and ``gpctl diagnose``'s report to :func:`judge`. A firing
notification of an alert the scenario neither requires nor allows is a false page; a required one
that never arrived is a missed page; diagnose agrees when its verdict is the severity the alerts
imply and it names every required alert.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from growpage import catalog
from growpage.gameday.receiver import Notification

TTFT_FAST = "GrowPageVLLMTimeToFirstTokenFastBurn"
TTFT_SLOW = "GrowPageVLLMTimeToFirstTokenSlowBurn"
ITL_FAST = "GrowPageVLLMInterTokenLatencyFastBurn"
ITL_SLOW = "GrowPageVLLMInterTokenLatencySlowBurn"
PREEMPTIONS = "GrowPageVLLMPreemptions"
AVAILABILITY_FAST = "GrowPageVLLMAvailabilityFastBurn"
AVAILABILITY_SLOW = "GrowPageVLLMAvailabilitySlowBurn"
AGENT_DOWN = "GrowPageAgentDown"
METRICS_ABSENT = "GrowPageMetricsAbsent"
# Under KV pressure on a CPU the decode steps of a full batch may or may not pass 100 ms, and a
# preempted request's recompute lands in its inter-token gaps: the latency burns besides TTFT's are
# allowed, never required.
_PRESSURE_SIDE_EFFECTS = (TTFT_SLOW, ITL_FAST, ITL_SLOW, PREEMPTIONS)
# A pod stopped under load ends the requests it was running: vLLM counts them aborted.
_REPLACEMENT_SIDE_EFFECTS = (AVAILABILITY_FAST, AVAILABILITY_SLOW)


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One step of the game day and what the rules must do during it.

    Attributes:
        name: short id (``slow-start``, ``kv-storm``...).
        what: what happens to the pod, in a sentence.
        must_fire: alerts that must be delivered as firing while it runs.
        may_fire: alerts allowed to fire (consequences that depend on the machine's speed).
        must_resolve: alerts that must be delivered as resolved while it runs (the cause is gone).
        diagnose_source: ``prometheus``, ``endpoint`` or empty (diagnose not run: nothing answers yet).
        diagnose_status: the verdict diagnose must give; empty: the severity the required alerts imply.
    """

    name: str
    what: str
    must_fire: tuple[str, ...] = ()
    may_fire: tuple[str, ...] = ()
    must_resolve: tuple[str, ...] = ()
    diagnose_source: str = "prometheus"
    diagnose_status: str = ""

    @property
    def expected_status(self) -> str:
        """``critical`` when a required alert pages, ``warning`` when one tickets, else ``ok``."""
        if self.diagnose_status:
            return self.diagnose_status
        severities = {catalog.SEVERITY_BY_ALERT[name] for name in self.must_fire}
        if catalog.SEVERITY_PAGE in severities:
            return "critical"
        return "warning" if severities else "ok"


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("slow-start", "the pod loads its model: Prometheus scrapes it and nothing answers yet",
             diagnose_source=""),
    Scenario("exporter-failing", "vLLM serves but GrowPage's exporter port is held by a hung process, "
             "then the port frees and the exporter binds it", must_fire=(AGENT_DOWN,), may_fire=(METRICS_ABSENT,),
             must_resolve=(AGENT_DOWN,)),
    Scenario("idle-monitor", "healthy and idle in mode monitor", diagnose_source="endpoint"),
    Scenario("kv-storm", "more long requests than the KV cache holds: vLLM queues and preempts, first "
             "tokens come late", must_fire=(TTFT_FAST,), may_fire=_PRESSURE_SIDE_EFFECTS),
    Scenario("rollback-to-off", "mid-incident the pod is replaced by one with GrowPage in mode off (the "
             "runbooks' rollback) and the storm goes on: the page must page on the new pod's requests (again, or "
             "still open), and the slow burn keep the replaced pod's errors", must_fire=(TTFT_FAST,),
             may_fire=(*_PRESSURE_SIDE_EFFECTS, *_REPLACEMENT_SIDE_EFFECTS)),
    # The storm's tail: burns inhibited behind the TTFT page (the inter-token one, the slow ones)
    # surface when it resolves, and the page's 6h/30m pair may still reach its `for` while the storm
    # leaves its short window. Allowed; every rule of the page must have resolved by the end.
    Scenario("idle-off", "the storm ends; healthy and idle in mode off: the page resolves",
             must_resolve=(TTFT_FAST,), may_fire=(TTFT_FAST, *_PRESSURE_SIDE_EFFECTS, *_REPLACEMENT_SIDE_EFFECTS),
             diagnose_source="endpoint"),
)
SCENARIOS_BY_NAME = {scenario.name: scenario for scenario in SCENARIOS}


@dataclasses.dataclass(frozen=True)
class DiagnoseOutcome:
    """What ``gpctl diagnose`` said during a scenario: its verdict and every alert its findings name."""

    status: str
    exit_code: int
    alerts: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What happened in one scenario against what it required.

    Attributes:
        scenario: the scenario's name.
        expected: its required alerts (firing), then its required resolutions.
        received: the alerts delivered as firing during it, with their receivers.
        held: required alerts delivered firing before it that never resolved and fired on what
            happened during it alone (a page still open needs no second delivery).
        false_pages: firing deliveries of alerts it neither requires nor allows.
        missed: required alerts never delivered as firing.
        unresolved: required resolutions never delivered.
        diagnose: diagnose's outcome, None where the scenario runs none.
        diagnose_agrees: verdict as expected and every required alert named; None without diagnose.
        checks: extra checks the runner made (name -> passed), e.g. the slow burn across the replacement.
    """

    scenario: str
    expected: tuple[str, ...]
    received: tuple[str, ...]
    held: tuple[str, ...]
    false_pages: tuple[str, ...]
    missed: tuple[str, ...]
    unresolved: tuple[str, ...]
    diagnose: DiagnoseOutcome | None
    diagnose_agrees: bool | None
    checks: dict[str, bool] = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return (not self.false_pages and not self.missed and not self.unresolved
                and self.diagnose_agrees is not False and all(self.checks.values()))


def judge(scenario: Scenario, notifications: Sequence[Notification], diagnose: DiagnoseOutcome | None,
          checks: dict[str, bool] | None = None, still_firing: frozenset[str] = frozenset(),
          held: frozenset[str] = frozenset()) -> Verdict:
    """The verdict on ``scenario`` from the changes delivered while it ran (an alert starting to fire,
    or resolving), the alerts still firing when it ended, diagnose's outcome, and the required alerts
    ``held``: open on the pager since before it, never resolved, and firing on its own data (the
    runner checks that in Prometheus). A required alert is missed when it was neither delivered nor
    held. A required resolution holds when the alert was delivered resolved and none of its rules
    still fires."""
    firing = [n for n in notifications if n.status == "firing"]
    resolved = {n.alertname for n in notifications if n.status == "resolved"} - set(still_firing)
    fired = {n.alertname for n in firing}
    allowed = {*scenario.must_fire, *scenario.may_fire}
    agrees = None
    if diagnose is not None:
        agrees = diagnose.status == scenario.expected_status and set(scenario.must_fire) <= set(diagnose.alerts)
    return Verdict(
        scenario=scenario.name,
        expected=(*scenario.must_fire, *(f"{name} resolved" for name in scenario.must_resolve)),
        received=tuple(sorted({f"{n.alertname} ({n.receiver})" for n in firing})),
        held=tuple(name for name in scenario.must_fire if name in held and name not in fired),
        false_pages=tuple(sorted({n.alertname for n in firing if n.alertname not in allowed})),
        missed=tuple(name for name in scenario.must_fire if name not in fired and name not in held),
        unresolved=tuple(name for name in scenario.must_resolve if name not in resolved),
        diagnose=diagnose, diagnose_agrees=agrees, checks=dict(checks or {}))


@dataclasses.dataclass(frozen=True)
class GamedaySummary:
    """The numbers the game day reports: scenarios, pages expected and received, false and missed."""

    scenarios: int
    passed: int
    pages_expected: int
    pages_received: int
    false_pages: int
    missed_pages: int
    diagnose_runs: int
    diagnose_agreements: int

    @property
    def diagnose_agreement(self) -> float | None:
        return self.diagnose_agreements / self.diagnose_runs if self.diagnose_runs else None


def summarize(verdicts: Sequence[Verdict]) -> GamedaySummary:
    expected = sum(len(v.expected) for v in verdicts)
    missed = sum(len(v.missed) + len(v.unresolved) for v in verdicts)
    with_diagnose = [v for v in verdicts if v.diagnose_agrees is not None]
    return GamedaySummary(
        scenarios=len(verdicts), passed=sum(v.passed for v in verdicts), pages_expected=expected,
        pages_received=expected - missed, false_pages=sum(len(v.false_pages) for v in verdicts),
        missed_pages=missed, diagnose_runs=len(with_diagnose),
        diagnose_agreements=sum(bool(v.diagnose_agrees) for v in with_diagnose))
