"""The source options ``gpctl calibrate`` and ``gpctl diagnose`` share: a live agent, Prometheus, or
saved snapshots (choose one); and ``--mixin-config``, which ``gpctl diagnose`` shares with ``gpctl
alerts build`` and ``gpctl dashboards build``.

Declared once so the commands name, group and parse them alike; each command adds only what the
source means for it (one scrape or two, rates or bucket increases). The options that mean the same in
both (``--since``, ``--at``, ``--timeout``, the snapshot files, the mixin config) are whole
``Annotated`` aliases.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from growpage import catalog
from growpage.errors import GrowPageError
from growpage.monitoring.mixin import DEFAULT_CONFIG, MixinConfig
from growpage.monitoring.mixin_file import load_mixin_config

SOURCES_PANEL = "Sources (choose one)"
ADVANCED_PANEL = "Advanced"


def snapshot_files_argument() -> Any:
    """The files after ``--snapshot FILE``: a shell glob (``--snapshot snaps/*.prom``) expands to many."""
    return typer.Argument(metavar="FILE", show_default=False,
                          help="More snapshot files after --snapshot (so --snapshot snaps/*.prom works).")


def endpoint_option(reads: str) -> Any:
    """``--endpoint URL``; ``reads`` says what the command does with the agent."""
    return typer.Option(metavar="URL", rich_help_panel=SOURCES_PANEL, show_default=False,
                        help=f"Live agent (the path defaults to {catalog.METRICS_PATH}): {reads}")


def prometheus_option(reads: str) -> Any:
    """``--prometheus URL``; ``reads`` says what the command queries over ``--since``."""
    return typer.Option(metavar="URL", rich_help_panel=SOURCES_PANEL, show_default=False,
                        help=f"Prometheus base URL, e.g. http://prometheus:9090: {reads}")


def snapshot_option(reads: str) -> Any:
    """``--snapshot FILE`` (repeatable); ``reads`` says what the command makes of several."""
    return typer.Option(metavar="FILE", rich_help_panel=SOURCES_PANEL, show_default=False,
                        help=f"Saved {catalog.METRICS_PATH} exposition(s){reads}")


def snapshot_paths(snapshot: Sequence[Path] | None, files: Sequence[Path] | None,
                   error: type[GrowPageError] = GrowPageError) -> tuple[Path, ...]:
    """Every snapshot file, ``--snapshot``'s first, in the order given.

    Raises:
        error: files without ``--snapshot`` (a stray argument, most likely a typo); the command
            chooses the error type, since each maps its own to an exit code.
    """
    if files and not snapshot:
        raise error(f"unexpected argument {files[0]}: snapshot files go after --snapshot")
    return tuple(snapshot or ()) + tuple(files or ())


SnapshotFiles = Annotated[list[Path] | None, snapshot_files_argument()]
SinceOption = Annotated[str, typer.Option(metavar="DURATION", help="With --prometheus: the window to read.")]
AtOption = Annotated[str | None, typer.Option(
    metavar="TIME", rich_help_panel=ADVANCED_PANEL, show_default=False,
    help="With --prometheus: the window's end (unix seconds or ISO 8601), e.g. an incident's end; default now.")]
TimeoutOption = Annotated[str, typer.Option(metavar="DURATION", rich_help_panel=ADVANCED_PANEL,
                                            help="Per HTTP request, from connecting to the last byte.")]
MixinConfigOption = Annotated[Path | None, typer.Option(
    "--mixin-config", metavar="FILE", show_default=False, envvar="GPCTL_MIXIN_CONFIG",
    help="Your installation's mixin config (YAML or JSON): cluster label, selectors, runbook URL pattern, "
         "thresholds; keys left out keep the defaults (docs/MONITORING.md). Alerts, dashboards and "
         "diagnose read the same file, so they agree.")]


def mixin_config(path: Path | None) -> MixinConfig:
    """The config in ``path`` (``--mixin-config``), or the default one.

    Raises:
        ConfigError: the file cannot be read, or has an unknown key or a bad value (one line, with the fix).
    """
    return DEFAULT_CONFIG if path is None else load_mixin_config(path)
