"""One alerting rule (:class:`AlertRule`) and the multi-window burn-rate rules every SLO alert is made of.

Shared by the rule builders (``alert_rules``, ``router_rules``), the promtool test generator and the
runbooks; it imports none of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from growpage import catalog
from growpage.monitoring.mixin import DEFAULT_CONFIG, MixinConfig

TROUBLESHOOTING_DASHBOARD = "GrowPage / Troubleshooting"  # where most alerts' panels are
FLEET_DASHBOARD = "GrowPage / Fleet"
PERCENT = "{{ $value | humanizePercentage }}"
SERVICE = f"{{{{ $labels.namespace }}}} ({{{{ $labels.{catalog.MODEL_LABEL} }}}}, all pods)"
DIAGNOSE_SERVICE = ("Run: gpctl diagnose --prometheus {{ $externalURL }} --since 1h "
                    "--namespace {{ $labels.namespace }}")


def pct(ratio: float) -> str:
    return f"{ratio * 100:g} %"


@dataclasses.dataclass(frozen=True)
class AlertRule:
    """One Prometheus alerting rule plus what the runbook and the tests need to know about it.

    Burn-rate alerts are one rule per window pair under one alertname: each pair has its own
    ``for`` and carries ``long_window``/``short_window`` labels, so a page says which pair burned.

    Attributes:
        name: the alertname; also the runbook's file name. Its severity comes from
            ``catalog.SEVERITY_TABLE``, the table diagnose and the runbooks read too.
        expr: PromQL; the alert fires for every series it returns for ``for_duration``.
        for_duration: Prometheus ``for:``.
        summary, description: annotations (Prometheus templates).
        dashboard_panel: title of the panel to look at, on :attr:`dashboard`.
        labels: labels besides ``severity`` (the window pair of a burn-rate rule).
        growpage_view: an annotation naming GrowPage's own series for the alert's pod or service,
            on alerts that page on what vLLM users feel.
        dashboard: the title of the dashboard that holds the panel.
        config: the mixin config the rule was built with (its runbook URL pattern).
    """

    name: str
    expr: str
    for_duration: str
    summary: str
    description: str
    dashboard_panel: str
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    growpage_view: str = ""
    dashboard: str = TROUBLESHOOTING_DASHBOARD
    config: MixinConfig = dataclasses.field(default=DEFAULT_CONFIG, compare=False, repr=False)

    @property
    def severity(self) -> str:
        return catalog.SEVERITY_BY_ALERT[self.name]

    @property
    def runbook_url(self) -> str:
        return self.config.runbook_url(self.name)

    def annotations(self) -> dict[str, str]:
        notes = {"summary": self.summary, "description": self.description, "runbook_url": self.runbook_url}
        if self.growpage_view:
            notes["growpage_view"] = self.growpage_view
        return notes

    def to_dict(self, for_override: str | None = None) -> dict:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": for_override or self.for_duration,
            "labels": {"severity": self.severity, **self.labels},
            "annotations": self.annotations(),
        }


def burn_rate_alert_name(speed: str, slo: str = "AllocationLatency") -> str:
    return f"GrowPage{slo}{speed.title()}Burn"


def burn_rules(stem: str, error_ratio: Callable[[str], str], objective: float, summary: str, description: str,
               panel: str, view: str = "", scope: Callable[[str], str] = lambda expr: expr,
               burn_alerts: tuple[catalog.BurnRateAlert, ...] = catalog.ALLOCATION_LATENCY_BURN_RATE_ALERTS,
               where: str = SERVICE, diagnose: str = DIAGNOSE_SERVICE) -> list[AlertRule]:
    """One rule per burn-rate window pair, each with its ``for`` and its window labels.

    Args:
        error_ratio: window -> the recording rule of the error ratio over it.
        scope: wraps the pair's condition (a mode join), where the ratios do not filter already.
        burn_alerts: the window pairs and their factors (the mixin config's thresholds).
        where: what the description names first (the service; the router's namespace).
        diagnose: the command the description ends with.
    """
    budget = round(1 - objective, 10)
    rules = []
    for alert in burn_alerts:
        for burn in alert.windows:
            limit = f"({burn.factor:g} * {budget:g})"
            expr = scope(f"{error_ratio(burn.long_window)} > {limit}\n"
                         f"and\n{error_ratio(burn.short_window)} > {limit}")
            windows = f"{burn.long_window} and {burn.short_window} at {burn.factor:g}x"
            rules.append(AlertRule(
                burn_rate_alert_name(alert.speed, stem), expr, burn.for_duration,
                f"{summary} ({alert.speed} burn)",
                f"{where}: {PERCENT} of {description}; the error budget ({pct(budget)}) burns over "
                f"{windows} the sustainable rate. {diagnose}",
                panel, {"long_window": burn.long_window, "short_window": burn.short_window}, view))
    return rules
