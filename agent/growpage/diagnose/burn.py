"""The multiwindow burn-rate decision: which window pairs of which burn alert the rules raise.

A burn-rate rule (``growpage.monitoring.alert_rules``) holds for one window pair of a
:class:`~growpage.catalog.BurnRateAlert` when the error ratio over the pair's long window AND over
its short window both exceed ``factor x (1 - objective)``; the alert is the OR of its pairs. This
module is that decision as one pure function of the ratios, over the same ``BurnRateAlert`` objects
the rules are generated from, so diagnose and the alerts cannot disagree on what fires.

A ratio is the share of bad events over a window (``1 - good / all``); NaN means no events (the
rule compares NaN, which is never true: nothing burns); a window missing from the ratios was not
covered by the data, and its pairs are not checked.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence

from growpage import catalog


class PairState(enum.StrEnum):
    """What the rules do with one window pair."""

    FIRING = "firing"  # both windows over the limit: the rule's condition holds
    QUIET = "quiet"  # evaluated, not over the limit in both windows
    NOT_CHECKED = "not_checked"  # a window of the pair had no data far enough back


@dataclasses.dataclass(frozen=True)
class PairVerdict:
    """One window pair of one burn alert, judged.

    Attributes:
        alert: the alertname the rule raises, e.g. ``GrowPageVLLMTimeToFirstTokenFastBurn``.
        severity: the alert's row of :data:`catalog.SEVERITY_BY_ALERT` (``page`` or ``ticket``).
        window: the pair (long and short window, factor, ``for``).
        limit: ``factor x (1 - objective)``, the error ratio both windows must exceed.
        long_ratio / short_ratio: the error ratios read; ``None`` where the window was not covered.
    """

    alert: str
    severity: str
    window: catalog.BurnRateWindow
    limit: float
    long_ratio: float | None
    short_ratio: float | None
    state: PairState

    def to_dict(self) -> dict[str, object]:
        return {"alert": self.alert, "severity": self.severity, "long_window": self.window.long_window,
                "short_window": self.window.short_window, "factor": self.window.factor,
                "for": self.window.for_duration, "limit": self.limit, "long_ratio": _plain(self.long_ratio),
                "short_ratio": _plain(self.short_ratio), "state": self.state.value}


def burn_rate_alert_name(stem: str, speed: str) -> str:
    """``("VLLMTimeToFirstToken", "fast")`` -> ``GrowPageVLLMTimeToFirstTokenFastBurn``."""
    return f"GrowPage{stem}{speed.title()}Burn"


def burn_limit(factor: float, objective: float) -> float:
    """``factor x (1 - objective)`` as the rule writes it: both numbers printed with ``:g``, then
    multiplied, so the float compared is the rule's own (``(14.4 * 0.01)``)."""
    budget = round(1 - objective, 10)
    return float(f"{factor:g}") * float(f"{budget:g}")


def judge_burn_pairs(stem: str, alerts: Sequence[catalog.BurnRateAlert], objective: float,
                     error_ratios: Mapping[str, float]) -> tuple[PairVerdict, ...]:
    """Every window pair of ``alerts``, in order, judged as the rules judge it at one instant.

    Args:
        stem: the SLO's alertname stem (``AllocationLatency``, ``VLLMTimeToFirstToken``...).
        alerts: the burn alerts with the deployment's factors (``MixinThresholds.burn_rate_alerts``).
        objective: the SLO's good share, e.g. 0.99 (the error budget is ``1 - objective``).
        error_ratios: window (``"5m"``, ``"1h"``...) -> bad share over it; NaN: no events; a window
            absent was not covered by the data.

    Returns:
        One verdict per pair. The alert fires (once its ``for`` has passed) when any of its pairs is
        firing; a pair that is not checked says nothing either way.
    """
    verdicts = []
    for alert in alerts:
        name = burn_rate_alert_name(stem, alert.speed)
        for window in alert.windows:
            limit = burn_limit(window.factor, objective)
            long_ratio, short_ratio = error_ratios.get(window.long_window), error_ratios.get(window.short_window)
            if long_ratio is None or short_ratio is None:
                state = PairState.NOT_CHECKED
            elif long_ratio > limit and short_ratio > limit:  # NaN compares false: no events never burn
                state = PairState.FIRING
            else:
                state = PairState.QUIET
            verdicts.append(PairVerdict(name, catalog.SEVERITY_BY_ALERT[name], window, limit, long_ratio,
                                        short_ratio, state))
    return tuple(verdicts)


def _plain(value: float | None) -> float | None:
    """JSON has no NaN: no events in the window reads ``None`` (the state says it was checked)."""
    return None if value is None or math.isnan(value) or math.isinf(value) else round(value, 6)
