"""``gpctl dashboards build``: regenerate the Grafana dashboards from the catalog, or check them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from gpctl.sources import MixinConfigOption
from gpctl.sources import mixin_config as load_config
from growpage.monitoring.artefacts import build, find_repo_root
from growpage.monitoring.mixin import DEFAULT_CONFIG, MixinConfig

app = typer.Typer(help="Grafana dashboards generated from growpage.catalog.", no_args_is_help=True)

CheckOption = Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 if a file is stale.")]
RootOption = Annotated[Path | None, typer.Option(help="The GrowPage checkout (default: found from here).")]
ClusterLabelOption = Annotated[str | None, typer.Option(
    "--cluster-label", show_default=False,
    help=f"Label that tells clusters apart; every aggregation keeps it. Wins over --mixin-config "
         f"(default: {DEFAULT_CONFIG.cluster_label}).")]
RunbookUrlOption = Annotated[str | None, typer.Option(
    "--runbook-url", show_default=False,
    help="Runbook URL pattern; {alert} is replaced by the alertname. Wins over --mixin-config "
         "(default: the runbooks/ folder on GitHub).")]


def mixin_config(path: Path | None, cluster_label: str | None = None, runbook_url: str | None = None) -> MixinConfig:
    """The mixin config of a build: the file's (or the defaults), with what the command line changes."""
    if runbook_url is not None and "{alert}" not in runbook_url:
        raise typer.BadParameter("must contain {alert}", param_hint="--runbook-url")
    config = load_config(path)
    try:
        return dataclasses.replace(config, cluster_label=cluster_label or config.cluster_label,
                                   runbook_url_pattern=runbook_url or config.runbook_url_pattern)
    except ValueError as error:  # a label that is no Prometheus label name
        raise typer.BadParameter(str(error), param_hint="--cluster-label") from None


def run_build(kind: str, check: bool, root: Path | None, config: MixinConfig = DEFAULT_CONFIG) -> None:
    """Shared by ``dashboards build`` and ``alerts build``: one line out, exit 1 when stale."""
    checkout = find_repo_root(root)
    result = build(kind, checkout, check, config)
    if check:
        if result.stale:
            same = "" if config == DEFAULT_CONFIG else " with the same options"
            typer.echo(f"stale {kind} files: {', '.join(result.stale)}; run `gpctl {kind} build`{same} "
                       "and commit the result", err=True)
            raise typer.Exit(1)
        typer.echo(f"{kind}: up to date")
        return
    typer.echo(f"{kind}: wrote {', '.join(result.written)}" if result.written else f"{kind}: up to date")


@app.command(name="build")
def build_dashboards(check: CheckOption = False, root: RootOption = None, config: MixinConfigOption = None,
                     cluster_label: ClusterLabelOption = None, runbook_url: RunbookUrlOption = None) -> None:
    """Write dashboards/*.json and deploy/components/monitoring/grafana-dashboards.yaml (Grafana
    sidecar ConfigMaps). The committed files use the default config; --check compares with the
    config given."""
    run_build("dashboards", check, root, mixin_config(config, cluster_label, runbook_url))
