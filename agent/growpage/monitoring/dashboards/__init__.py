"""The generated Grafana dashboards (grafanalib): ``GrowPage / Overview`` and ``/ Troubleshooting``."""

from __future__ import annotations

from growpage.monitoring.dashboards.common import to_json_text
from growpage.monitoring.dashboards.overview import overview_dashboard
from growpage.monitoring.dashboards.troubleshooting import troubleshooting_dashboard


def dashboards() -> dict[str, dict]:
    """File name under dashboards/ -> Grafana dashboard JSON model."""
    return {
        "growpage-overview.json": overview_dashboard(),
        "growpage-troubleshooting.json": troubleshooting_dashboard(),
    }


__all__ = ["dashboards", "overview_dashboard", "to_json_text", "troubleshooting_dashboard"]
