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

_RUNBOOK_LINK = re.compile(re.escape(catalog.RUNBOOK_BASE_URL) + r"/(\w+)\.md")


def dashboards(config: MixinConfig = DEFAULT_CONFIG) -> dict[str, dict]:
    """File name under dashboards/ -> Grafana dashboard JSON model, for ``config``."""
    return {
        "growpage-overview.json": configured(overview_dashboard(), config),
        "growpage-troubleshooting.json": configured(troubleshooting_dashboard(), config),
        "growpage-fleet.json": configured(fleet_dashboard(), config),
    }


def configured(document: Any, config: MixinConfig) -> Any:
    """``document`` with the mixin config's runbook URLs and cluster label.

    The panels are written once, against the default config; a deployment's config only renames
    the cluster label (in selectors, groupings and the variable's query) and moves runbook links,
    so the rewrite is a pure function of every string in the model. The default config leaves the
    document as it is.
    """
    if isinstance(document, dict):
        return {key: configured(value, config) for key, value in document.items()}
    if isinstance(document, list):
        return [configured(value, config) for value in document]
    if not isinstance(document, str):
        return document
    text = _RUNBOOK_LINK.sub(lambda match: config.runbook_url(match.group(1)), document)
    label = config.cluster_label
    if label != "cluster":
        text = (text.replace('cluster=~"$cluster"', f'{label}=~"$cluster"')
                .replace(", cluster)", f", {label})").replace("by (cluster, ", f"by ({label}, "))
    return text


__all__ = ["configured", "dashboards", "fleet_dashboard", "overview_dashboard", "to_json_text",
           "troubleshooting_dashboard"]
