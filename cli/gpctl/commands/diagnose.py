"""``gpctl diagnose``: the troubleshooting checklist against a live agent, Prometheus or snapshots.

Exit codes: 0 ok, 1 warning, 2 critical, 3 could not diagnose (source unreachable, bad input, or a
check could not be evaluated and nothing worse was found). Input and transport problems print one
line and exit 3 here, so the root group's generic exit 2 (for GrowPageError) never applies.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from gpctl.errors import print_error
from gpctl.sources import endpoint_option, prometheus_option, snapshot_files_argument, snapshot_option, snapshot_paths
from growpage.diagnose import (
    EXIT_CANNOT_DIAGNOSE,
    DiagnoseError,
    DiagnoseRequest,
    parse_duration_s,
    parse_label_map,
    parse_time_s,
)
from growpage.diagnose import diagnose as run_diagnosis
from growpage.diagnose.bundle import check_writable, write_bundle
from growpage.diagnose.render import render_text, to_json

_ADVANCED = "Advanced"


class OutputFormat(enum.StrEnum):
    """How ``diagnose`` prints its report."""

    TEXT = "text"
    JSON = "json"


def diagnose(
    files: Annotated[list[Path] | None, snapshot_files_argument()] = None,
    endpoint: Annotated[str | None, endpoint_option("scraped twice.")] = None,
    prometheus: Annotated[str | None, prometheus_option("PromQL over --since.")] = None,
    snapshot: Annotated[
        list[Path] | None, snapshot_option(" or a --bundle tarball; two or more give rates."),
    ] = None,
    dcgm: Annotated[
        str | None,
        typer.Option(metavar="URL", show_default=False,
                     help="With --endpoint: a DCGM exporter URL (GPU framebuffer, GPU model)."),
    ] = None,
    duration: Annotated[
        str, typer.Option(metavar="DURATION", help="With --endpoint: time between the two scrapes."),
    ] = "15s",
    since: Annotated[
        str, typer.Option(metavar="DURATION", help="With --prometheus: the window to look back over."),
    ] = "30m",
    namespace: Annotated[
        str | None,
        typer.Option(metavar="NAMESPACE", show_default=False,
                     help="With --prometheus: only this namespace (breakdown by pod)."),
    ] = None,
    pod: Annotated[
        str | None, typer.Option(metavar="POD", show_default=False, help="With --prometheus: only this pod."),
    ] = None,
    output: Annotated[OutputFormat, typer.Option(help="text (a report) or json.")] = OutputFormat.TEXT,
    bundle: Annotated[
        Path | None,
        typer.Option(metavar="FILE.tar.gz", show_default=False,
                     help="Also write raw data, build info and the report to this .tar.gz."),
    ] = None,
    at: Annotated[
        str | None,
        typer.Option(metavar="TIME", rich_help_panel=_ADVANCED, show_default=False,
                     help="With --prometheus: evaluate at this time (unix seconds or ISO 8601) instead of now, "
                          "e.g. an incident's end."),
    ] = None,
    timeout: Annotated[
        str, typer.Option(metavar="DURATION", rich_help_panel=_ADVANCED,
                          help="Per HTTP request, from connecting to the last byte."),
    ] = "10s",
    dcgm_label: Annotated[
        list[str] | None,
        typer.Option(metavar="TARGET=LABEL", rich_help_panel=_ADVANCED, show_default=False,
                     help="The DCGM label naming the GPU's user, when relabeling differs from "
                          "dcgm-exporter's exported_namespace/exported_pod, e.g. pod=kubernetes_pod_name. "
                          "Repeatable."),
    ] = None,
) -> None:
    """Walk the troubleshooting checklist: SLOs, over-granting, allocation latency, OOM and
    fragmentation, rollout, agent health; evidence and a fix for each finding.

    Exit codes: 0 ok, 1 warning, 2 critical, 3 could not diagnose.

    Examples: [bold]gpctl diagnose --endpoint http://vllm:8000[/bold];
    [bold]gpctl diagnose --prometheus http://prometheus:9090 --since 1h --namespace chat[/bold];
    [bold]gpctl diagnose --snapshot before.prom after.prom --output json[/bold]
    """
    try:
        snapshots = snapshot_paths(snapshot, files, DiagnoseError)
        request = DiagnoseRequest(
            endpoint=endpoint, dcgm=dcgm, duration_s=parse_duration_s(duration, "--duration"),
            prometheus=prometheus, since_s=parse_duration_s(since, "--since"),
            at_s=parse_time_s(at, "--at") if at is not None else None, namespace=namespace, pod=pod,
            snapshots=snapshots, timeout_s=parse_duration_s(timeout, "--timeout"),
            dcgm_labels=parse_label_map(dcgm_label or [], "--dcgm-label"))
        if bundle is not None:
            check_writable(bundle)
        progress = Console(stderr=True, highlight=False)
        if request.endpoint and progress.is_terminal:
            # Only on a terminal: scripts read stdout, and stderr stays one line on errors.
            progress.print(f"Scraping the agent twice, {request.duration_s:g}s apart (--duration)...")
        report, result = run_diagnosis(request)
        if output is OutputFormat.JSON:
            typer.echo(to_json(report))
        else:
            render_text(report, Console(highlight=False))
        if bundle is not None:
            write_bundle(bundle, report, result)
    except DiagnoseError as error:
        print_error(" ".join(str(error).split()))
        raise typer.Exit(EXIT_CANNOT_DIAGNOSE) from None
    raise typer.Exit(report.exit_code)
