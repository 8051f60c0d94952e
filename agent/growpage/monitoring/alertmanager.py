"""Alertmanager routing for GrowPage alerts: critical pages, warning makes a ticket.

The generated file is a complete, valid configuration, but it is meant to be merged: copy the
``alertname=~"GrowPage.*"`` route, the two receivers and the inhibit rules into your own config,
and point the webhook URLs (placeholders on the reserved ``.invalid`` domain) at your paging and
ticketing bridges, or swap ``webhook_configs`` for ``pagerduty_configs`` / ``slack_configs``.
"""

from __future__ import annotations

import dataclasses

from growpage import catalog
from growpage.monitoring.alert_rule import burn_rate_alert_name
from growpage.monitoring.alert_rules import alert_names
from growpage.monitoring.mixin import DEFAULT_CONFIG, MixinConfig
from growpage.monitoring.router_rules import AVAILABILITY_STEM, NO_HEALTHY_WORKER
from growpage.monitoring.rules_file import dump_yaml, generated_header

PAGER_RECEIVER = "growpage-pager"
TICKET_RECEIVER = "growpage-ticket"
PLACEHOLDER_WEBHOOK_URLS = {
    PAGER_RECEIVER: "http://growpage-pager.invalid/webhook",
    TICKET_RECEIVER: "http://growpage-ticket.invalid/webhook",
}
RECEIVER_BY_SEVERITY = {catalog.SEVERITY_PAGE: PAGER_RECEIVER, catalog.SEVERITY_TICKET: TICKET_RECEIVER}
# pod last: service-level alerts (SLOs) have none, and group per service. The mixin's cluster label
# leads both the grouping and every inhibition's equal labels (group_by and equal below), so one
# Alertmanager serving several clusters never merges nor silences one cluster's pages by another's.
GROUP_BY = ["alertname", "namespace", catalog.MODEL_LABEL, "pod"]
GROWPAGE_ALERTS_MATCHER = 'alertname=~"GrowPage.*"'
_SERVICE = tuple(catalog.SLO_LABELS)
_POD = ("namespace", "pod")
_NAMESPACE = ("namespace",)


@dataclasses.dataclass(frozen=True)
class InhibitPair:
    """While ``source`` fires, ``target`` is silenced where the ``equal`` labels match."""

    source: str
    target: str
    equal: tuple[str, ...] = _POD


INHIBIT_PAIRS = (
    # The cause explains the symptom: one ticket for over-granting, not two.
    InhibitPair("GrowPageKVOverGranting", "GrowPageKVUtilizationLow", _SERVICE),
    # One latency incident pages once: users' time to first token pages; the inter-token latency
    # page and both slow burns wait behind it.
    InhibitPair(burn_rate_alert_name("fast", "VLLMTimeToFirstToken"),
                burn_rate_alert_name("fast", "VLLMInterTokenLatency"), _SERVICE),
    InhibitPair(burn_rate_alert_name("fast", "VLLMTimeToFirstToken"),
                burn_rate_alert_name("slow", "VLLMTimeToFirstToken"), _SERVICE),
    InhibitPair(burn_rate_alert_name("fast", "VLLMInterTokenLatency"),
                burn_rate_alert_name("slow", "VLLMInterTokenLatency"), _SERVICE),
    InhibitPair(burn_rate_alert_name("fast", "VLLMAvailability"),
                burn_rate_alert_name("slow", "VLLMAvailability"), _SERVICE),
    # Grant latency is a cause, and a ticket: its fast burn stands for the slow burn and the per-pod
    # p99 ticket (which names the pod and the cause).
    InhibitPair(burn_rate_alert_name("fast"), burn_rate_alert_name("slow"), _SERVICE),
    InhibitPair(burn_rate_alert_name("fast"), "GrowPageAllocationLatencyHigh", _SERVICE),
    InhibitPair("GrowPageAllocationLatencyHigh", burn_rate_alert_name("slow"), _SERVICE),
    InhibitPair("GrowPageKVPagesStranded", "GrowPageFragmentationHigh"),
    InhibitPair("GrowPageKVPagesStranded", "GrowPageKVOverGranting"),
    InhibitPair("GrowPageKVPagesStranded", "GrowPageVLLMPreemptions"),
    # GrowPageMetricsAbsent has only a job label: a down target explains absent metrics.
    InhibitPair("GrowPageAgentDown", "GrowPageMetricsAbsent", ("job",)),
    # The router's alerts are per namespace. No healthy worker is why its requests fail: one page.
    InhibitPair(NO_HEALTHY_WORKER, burn_rate_alert_name("fast", AVAILABILITY_STEM), _NAMESPACE),
    InhibitPair(burn_rate_alert_name("fast", AVAILABILITY_STEM), burn_rate_alert_name("slow", AVAILABILITY_STEM),
                _NAMESPACE),
)


@dataclasses.dataclass(frozen=True)
class RouteTiming:
    """Alertmanager's batching delays (tests use seconds)."""

    group_wait: str = "30s"
    group_interval: str = "5m"
    page_repeat_interval: str = "1h"  # a page nobody acknowledged comes back within the hour
    ticket_repeat_interval: str = "12h"


def _receiver(name: str, url: str) -> dict:
    return {"name": name, "webhook_configs": [{"url": url, "send_resolved": True}]}


def group_by(config: MixinConfig = DEFAULT_CONFIG) -> list[str]:
    """The labels one notification groups by: the cluster, then :data:`GROUP_BY`."""
    return [config.cluster_label, *GROUP_BY]


def inhibit_equal(pair: InhibitPair, config: MixinConfig = DEFAULT_CONFIG) -> list[str]:
    """The labels source and target must share for ``pair`` to silence: the cluster, then the pair's own.

    Alertmanager treats a label absent on both sides as equal, so a single-cluster set-up without the
    label inhibits exactly as before.
    """
    return [config.cluster_label, *pair.equal]


def alertmanager_config(webhook_urls: dict[str, str] | None = None,
                        timing: RouteTiming = RouteTiming(), config: MixinConfig = DEFAULT_CONFIG) -> dict:
    """The configuration as a dict.

    Args:
        webhook_urls: receiver name -> URL; defaults to the placeholders.
        timing: group_wait / group_interval / repeat intervals.
        config: the mixin config (its cluster label).
    """
    known = set(alert_names())
    for pair in INHIBIT_PAIRS:
        missing = {pair.source, pair.target} - known
        if missing:
            raise ValueError(f"inhibit pair names unknown alerts: {sorted(missing)}")
    urls = {**PLACEHOLDER_WEBHOOK_URLS, **(webhook_urls or {})}
    severity_routes = [
        {"matchers": [f'severity="{catalog.SEVERITY_PAGE}"'], "receiver": PAGER_RECEIVER,
         "repeat_interval": timing.page_repeat_interval},
        {"matchers": [f'severity="{catalog.SEVERITY_TICKET}"'], "receiver": TICKET_RECEIVER,
         "repeat_interval": timing.ticket_repeat_interval},
    ]
    return {
        "route": {
            # Anything that is not GrowPage's falls through to the root (a ticket, here).
            "receiver": TICKET_RECEIVER,
            "group_by": group_by(config),
            "group_wait": timing.group_wait,
            "group_interval": timing.group_interval,
            "repeat_interval": timing.ticket_repeat_interval,
            "routes": [{"matchers": [GROWPAGE_ALERTS_MATCHER], "group_by": group_by(config),
                        "receiver": TICKET_RECEIVER, "routes": severity_routes}],
        },
        "receivers": [_receiver(name, urls[name]) for name in (PAGER_RECEIVER, TICKET_RECEIVER)],
        "inhibit_rules": [
            {"source_matchers": [f'alertname="{pair.source}"'],
             "target_matchers": [f'alertname="{pair.target}"'], "equal": inhibit_equal(pair, config)}
            for pair in INHIBIT_PAIRS
        ],
    }


def alertmanager_yaml(config: MixinConfig = DEFAULT_CONFIG) -> str:
    header = generated_header("alerts build") + (
        "# Placeholder webhook URLs (.invalid): point them at your pager / ticket bridges when you\n"
        "# merge this route, its receivers and inhibit rules into your Alertmanager config.\n")
    return dump_yaml(alertmanager_config(config=config), header)
