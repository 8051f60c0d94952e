"""What a promtool alert test is made of: scenarios that breach a rule and near misses that must not.

The values are promtool's notation at a 1m evaluation interval, counters from 0, so rates are exact.
"""

from __future__ import annotations

import dataclasses

from growpage import catalog
from growpage.monitoring.promql import duration_seconds, format_duration

SAMPLES = 200  # per series: covers the longest `for` (3h) plus a margin, at 1m


@dataclasses.dataclass(frozen=True)
class Scenario:
    """Input series that breach one rule.

    Attributes:
        series: promtool series selector -> values notation (``'0+60x200'``).
        starts: first evaluation at which the rule's expression returns the alert.
        labels: the alert's labels besides ``severity``.
        value: ``$value`` at the firing evaluation.
        title: what the scenario shows, when a rule has several.
        rule_labels: which rule of a multi-rule alertname it breaches (its window-pair labels).
    """

    series: dict[str, str]
    starts: str
    labels: dict[str, str]
    value: float
    title: str = "breached"
    rule_labels: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class QuietScenario:
    """Input series close to a rule's condition where it must NOT fire.

    Attributes:
        series: promtool series selector -> values notation.
        title: why the alert must stay silent.
    """

    series: dict[str, str]
    title: str


def constant(value: float) -> str:
    """A gauge at ``value`` for every sample."""
    return f"{value:g}x{SAMPLES}"


def counter(per_minute: float) -> str:
    """A counter from 0 growing by ``per_minute`` each minute."""
    return f"0+{per_minute:g}x{SAMPLES}"


@dataclasses.dataclass(frozen=True)
class TimelineScenario:
    """An incident told over time: input series, and whether the alert is firing at each evaluation.

    Checked through the ``ALERTS`` series (promtool's ``promql_expr_test``), so one scenario can say
    that a page is still up long after its cause changed, and that it resolves.

    Attributes:
        series: promtool series selector -> values notation.
        title: what the incident shows.
        labels: the alert's labels besides ``severity`` and the rule's own.
        rule_labels: which rule of a multi-rule alertname it watches (its window-pair labels).
        firing: (evaluation time, firing then) in time order.
    """

    series: dict[str, str]
    title: str
    labels: dict[str, str]
    rule_labels: dict[str, str]
    firing: tuple[tuple[str, bool], ...]


REPLACED_AT_MIN = 30  # when the burning pod goes away and a healthy one takes its traffic
REPLACED_TOTAL, REPLACED_BAD_SHARE = 1000, 0.3  # requests per minute, and the share the old pod fails


def replacement_timeline(old: dict[str, str], new: dict[str, str], burn: catalog.BurnRateWindow, what: str,
                         labels: dict[str, str], extra: dict[str, str] | None = None) -> TimelineScenario:
    """``what`` burns (``old``: counters of a pod failing :data:`REPLACED_BAD_SHARE`) for
    :data:`REPLACED_AT_MIN` minutes and is then replaced by a healthy one (``new``'s counters, from then on).

    The slow pair's long window still holds the old pod's errors (recorded per service, they outlive
    its series), so the alert fires at ``for``, stays up an hour after the replacement and resolves once
    the burn has left the short window.

    Args:
        old, new: series -> counter notation (``0+Nx...``) at a 1m interval, each pod's own.
        extra: further inputs (the old pod's other series, the mode).
    """
    minutes = REPLACED_AT_MIN
    inputs: dict[str, str] = dict(extra or {})
    for name, values in old.items():
        inputs[name] = f"0+{values.split('+')[1].split('x')[0]}x{minutes} stale"
    for name, values in new.items():
        inputs[name] = f"_x{minutes} 0+{values.split('+')[1].split('x')[0]}x{SAMPLES - minutes - 1}"
    fires_min = 1 + duration_seconds(burn.for_duration) // 60
    clears_min = minutes + duration_seconds(burn.short_window) // 60 + 10
    return TimelineScenario(
        inputs, f"{what} burning for {minutes}m, then replaced by a healthy one", labels,
        {"long_window": burn.long_window, "short_window": burn.short_window},
        ((format_duration((fires_min - 1) * 60), False), (format_duration(fires_min * 60), True),
         (format_duration((minutes + 60) * 60), True), (format_duration(clears_min * 60), False)))
