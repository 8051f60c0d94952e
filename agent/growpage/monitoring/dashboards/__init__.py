"""The generated Grafana dashboards (grafanalib): ``GrowPage / Overview``, ``/ Troubleshooting`` and ``/ Fleet``."""

from __future__ import annotations

import re
from typing import Any

from growpage import catalog
from growpage.monitoring.dashboards.common import to_json_text
from growpage.monitoring.dashboards.fleet import fleet_dashboard
from growpage.monitoring.dashboards.overview import overview_dashboard
from growpage.monitoring.dashboards.troubleshooting import troubleshooting_dashboard
from growpage.monitoring.mixin import DEFAULT_CONFIG, MixinConfig

# Where a dashboard holds PromQL: panel targets and variable queries (the config's selectors go there).
_QUERY_KEYS = frozenset({"expr", "query", "definition"})
_RUNBOOK_LINK = re.compile(re.escape(catalog.RUNBOOK_BASE_URL) + r"/(\w+)\.md")


def dashboards(config: MixinConfig = DEFAULT_CONFIG) -> dict[str, dict]:
    """File name under dashboards/ -> Grafana dashboard JSON model, for ``config``."""
    return {
        "growpage-overview.json": configured(overview_dashboard(config.thresholds), config),
        "growpage-troubleshooting.json": configured(troubleshooting_dashboard(config.thresholds), config),
        "growpage-fleet.json": configured(fleet_dashboard(config.thresholds), config),
    }


def configured(document: Any, config: MixinConfig) -> Any:
    """``document`` with the mixin config's runbook URLs, cluster label, scrape job and selectors.

    The panels are built with the config's thresholds; the rest is a rewrite of every string in the
    model: the cluster label is renamed (in selectors, groupings and the variable's query), the scrape
    job of ``/metrics/growpage`` is the config's, runbook links move, and the config's selectors join
    every selector of GrowPage's and vLLM's series in the queries. The default config leaves the
    document as it is.
    """
    if isinstance(document, dict):
        return {key: config.scoped(configured(value, config)) if key in _QUERY_KEYS and isinstance(value, str)
                else configured(value, config) for key, value in document.items()}
    if isinstance(document, list):
        return [configured(value, config) for value in document]
    if not isinstance(document, str):
        return document
    text = _RUNBOOK_LINK.sub(lambda match: config.runbook_url(match.group(1)), document)
    if config.growpage_job != catalog.SCRAPE_JOB:  # the scrape-health panel selects GrowPage's job
        text = text.replace(f'job="{catalog.SCRAPE_JOB}"', f'job="{config.growpage_job}"')
    if config.router_job != catalog.ROUTER_SCRAPE_JOB:  # the router's panels select its job
        text = text.replace(f'job="{catalog.ROUTER_SCRAPE_JOB}"', f'job="{config.router_job}"')
    label = config.cluster_label
    if label != "cluster":
        text = (text.replace('cluster=~"$cluster"', f'{label}=~"$cluster"')
                .replace(", cluster)", f", {label})").replace("by (cluster, ", f"by ({label}, "))
    return text


__all__ = ["configured", "dashboards", "fleet_dashboard", "overview_dashboard", "to_json_text",
           "troubleshooting_dashboard"]
