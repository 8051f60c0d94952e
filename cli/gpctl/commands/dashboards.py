"""``gpctl dashboards build``: regenerate the Grafana dashboards from the catalog, or check them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from growpage.monitoring.artefacts import build, find_repo_root
from growpage.monitoring.mixin import DEFAULT_CONFIG, MixinConfig

app = typer.Typer(help="Grafana dashboards generated from growpage.catalog.", no_args_is_help=True)

CheckOption = Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 if a file is stale.")]
RootOption = Annotated[Path | None, typer.Option(help="The GrowPage checkout (default: found from here).")]
ClusterLabelOption = Annotated[str, typer.Option(
    "--cluster-label", help="Label that tells clusters apart; every aggregation keeps it.")]
RunbookUrlOption = Annotated[str, typer.Option(
    "--runbook-url", help="Runbook URL pattern; {alert} is replaced by the alertname.")]


def mixin_config(cluster_label: str, runbook_url: str) -> MixinConfig:
    """The mixin config of a build: the defaults, with what the command line changes."""
    if "{alert}" not in runbook_url:
        raise typer.BadParameter("must contain {alert}", param_hint="--runbook-url")
    return MixinConfig(cluster_label=cluster_label, runbook_url_pattern=runbook_url)


def run_build(kind: str, check: bool, root: Path | None, config: MixinConfig = DEFAULT_CONFIG) -> None:
    """Shared by ``dashboards build`` and ``alerts build``: one line out, exit 1 when stale."""
    checkout = find_repo_root(root)
    result = build(kind, checkout, check, config)
    if check:
        if result.stale:
            typer.echo(f"stale {kind} files: {', '.join(result.stale)}; run `gpctl {kind} build` "
                       "and commit the result", err=True)
            raise typer.Exit(1)
        typer.echo(f"{kind}: up to date")
        return
    typer.echo(f"{kind}: wrote {', '.join(result.written)}" if result.written else f"{kind}: up to date")


@app.command(name="build")
def build_dashboards(check: CheckOption = False, root: RootOption = None,
                     cluster_label: ClusterLabelOption = DEFAULT_CONFIG.cluster_label,
                     runbook_url: RunbookUrlOption = DEFAULT_CONFIG.runbook_url_pattern) -> None:
    """Write dashboards/*.json and deploy/components/monitoring/grafana-dashboards.yaml (Grafana
    sidecar ConfigMaps). The committed files use the default config; --check compares with it."""
    run_build("dashboards", check, root, mixin_config(cluster_label, runbook_url))
