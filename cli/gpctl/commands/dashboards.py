"""``gpctl dashboards build``: regenerate the Grafana dashboards from the catalog, or check them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from growpage.monitoring.artefacts import build, find_repo_root

app = typer.Typer(help="Grafana dashboards generated from growpage.catalog.", no_args_is_help=True)

CheckOption = Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 if a file is stale.")]
RootOption = Annotated[Path | None, typer.Option(help="The GrowPage checkout (default: found from here).")]


def run_build(kind: str, check: bool, root: Path | None) -> None:
    """Shared by ``dashboards build`` and ``alerts build``: one line out, exit 1 when stale."""
    checkout = find_repo_root(root)
    result = build(kind, checkout, check)
    if check:
        if result.stale:
            typer.echo(f"stale {kind} files: {', '.join(result.stale)}; run `gpctl {kind} build` "
                       "and commit the result", err=True)
            raise typer.Exit(1)
        typer.echo(f"{kind}: up to date")
        return
    typer.echo(f"{kind}: wrote {', '.join(result.written)}" if result.written else f"{kind}: up to date")


@app.command(name="build")
def build_dashboards(check: CheckOption = False, root: RootOption = None) -> None:
    """Write dashboards/*.json and deploy/components/monitoring/grafana-dashboards.yaml (Grafana sidecar ConfigMaps)."""
    run_build("dashboards", check, root)
