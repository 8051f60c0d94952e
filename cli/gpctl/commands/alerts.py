"""``gpctl alerts build``: regenerate rules, promtool tests, Alertmanager config, PrometheusRule."""

from __future__ import annotations

import typer

from gpctl.commands.dashboards import (
    CheckOption,
    ClusterLabelOption,
    RootOption,
    RunbookUrlOption,
    mixin_config,
    run_build,
)
from gpctl.sources import MixinConfigOption

app = typer.Typer(help="Prometheus rules and Alertmanager routing generated from growpage.catalog.",
                  no_args_is_help=True)


@app.command(name="build")
def build_alerts(check: CheckOption = False, root: RootOption = None, config: MixinConfigOption = None,
                 cluster_label: ClusterLabelOption = None, runbook_url: RunbookUrlOption = None) -> None:
    """Write alerts/growpage-rules.yaml, alerts/tests/*.test.yaml, alerts/alertmanager.yaml,
    deploy/components/monitoring/prometheusrule.yaml and the generated block of each runbook."""
    run_build("alerts", check, root, mixin_config(config, cluster_label, runbook_url))
