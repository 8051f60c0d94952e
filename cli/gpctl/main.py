"""The ``gpctl`` entry point: the root typer app and the list of commands.

Adding a command is one line here: ``app.command(name=...)(module.function)`` for a single
command, or ``app.add_typer(module.app, name=...)`` for a group of them.
"""

from __future__ import annotations

from typing import Annotated

import typer

from gpctl.commands import alerts, bench, calibrate, dashboards, demo, diagnose, fleet, gameday, kv_size, model, serve
from gpctl.errors import GrowPageGroup
from growpage import __version__

app = typer.Typer(
    cls=GrowPageGroup,
    rich_markup_mode="rich",
    no_args_is_help=True,
    help="[bold]gpctl[/bold]: size, inspect and troubleshoot GrowPage's elastic per-request KV cache.",
)


def _print_version(requested: bool) -> None:
    if requested:
        typer.echo(f"gpctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the gpctl version and exit.",
        ),
    ] = False,
) -> None:
    """Root options shared by every command."""


app.command(name="kv-size")(kv_size.kv_size)
app.command(name="serve")(serve.serve)
app.command(name="fleet")(fleet.fleet)
app.command(name="demo")(demo.demo)
bench.app.command(name="fleet")(fleet.bench_fleet)
app.add_typer(bench.app, name="bench")
app.add_typer(model.app, name="model")
app.command(name="diagnose")(diagnose.diagnose)
app.add_typer(dashboards.app, name="dashboards")
app.add_typer(alerts.app, name="alerts")
app.command(name="calibrate")(calibrate.calibrate)
app.command(name="gameday")(gameday.gameday)


def main() -> None:
    """Console-script entry point (``gpctl``); user errors exit 2 via :class:`GrowPageGroup`."""
    app(prog_name="gpctl")
