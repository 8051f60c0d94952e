"""``gpctl diagnose``: the troubleshooting checklist against a live agent, Prometheus or snapshots.

Exit codes: 0 ok, 1 warning, 2 critical: the worst of the checks that could run (the report lists
those that could not, and what to scrape or save to run them); 3 could not diagnose (source
unreachable, nothing readable, bad input, or no check could run). Input and transport problems print one
line and exit 3 here, so the root group's generic exit 2 (for GrowPageError) never applies.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from gpctl.errors import print_error
from gpctl.sources import (
    ADVANCED_PANEL,
    AtOption,
    MixinConfigOption,
    SinceOption,
    SnapshotFiles,
    TimeoutOption,
    endpoint_option,
    mixin_config,
    prometheus_option,
    snapshot_option,
    snapshot_paths,
)
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
from growpage.errors import ConfigError


class OutputFormat(enum.StrEnum):
    """How ``diagnose`` prints its report."""

    TEXT = "text"
    JSON = "json"


EndpointOption = Annotated[str | None, endpoint_option("scraped twice.")]
PrometheusOption = Annotated[str | None, prometheus_option("PromQL over --since.")]
SnapshotOption = Annotated[list[Path] | None, snapshot_option(" or a --bundle tarball; two or more give rates.")]
DcgmOption = Annotated[str | None, typer.Option(
    metavar="URL", show_default=False, help="With --endpoint: a DCGM exporter URL (GPU framebuffer, GPU model).")]
DurationOption = Annotated[str, typer.Option(
    metavar="DURATION", help="With --endpoint: time between the two scrapes.")]
NamespaceOption = Annotated[str | None, typer.Option(
    metavar="NAMESPACE", show_default=False, help="With --prometheus: only this namespace (breakdown by pod).")]
PodOption = Annotated[str | None, typer.Option(
    metavar="POD", show_default=False, help="With --prometheus: only this pod.")]
ClusterOption = Annotated[str | None, typer.Option(
    metavar="NAME", show_default=False,
    help="With --prometheus: only this cluster (the mixin config's cluster_label, default label cluster).")]
OutputOption = Annotated[OutputFormat, typer.Option(help="text (a report) or json.")]
BundleOption = Annotated[Path | None, typer.Option(
    metavar="FILE.tar.gz", show_default=False,
    help="Also write raw data, build info and the report to this .tar.gz.")]
DcgmLabelOption = Annotated[list[str] | None, typer.Option(
    metavar="TARGET=LABEL", rich_help_panel=ADVANCED_PANEL, show_default=False,
    help="The DCGM label naming the GPU's user, when relabeling differs from dcgm-exporter's "
         "exported_namespace/exported_pod, e.g. pod=kubernetes_pod_name. Repeatable.")]


def diagnose(
    files: SnapshotFiles = None,
    endpoint: EndpointOption = None,
    prometheus: PrometheusOption = None,
    snapshot: SnapshotOption = None,
    dcgm: DcgmOption = None,
    duration: DurationOption = "15s",
    since: SinceOption = "30m",
    namespace: NamespaceOption = None,
    pod: PodOption = None,
    cluster: ClusterOption = None,
    output: OutputOption = OutputFormat.TEXT,
    bundle: BundleOption = None,
    at: AtOption = None,
    timeout: TimeoutOption = "10s",
    dcgm_label: DcgmLabelOption = None,
    config: MixinConfigOption = None,
) -> None:
    """Walk the troubleshooting checklist: SLOs, over-granting, allocation latency, OOM and
    fragmentation, rollout, agent health; evidence and a fix for each finding.

    Exit codes: 0 ok, 1 warning, 2 critical, 3 could not diagnose.

    Examples: [bold]gpctl diagnose --endpoint http://vllm:8000[/bold];
    [bold]gpctl diagnose --prometheus http://prometheus:9090 --since 1h --namespace chat[/bold];
    [bold]gpctl diagnose --snapshot before.prom after.prom --output json[/bold]

    With --mixin-config, the checks use the thresholds your alerts were built with, and Prometheus
    queries its cluster label and selectors.
    """
    try:
        snapshots = snapshot_paths(snapshot, files, DiagnoseError)
        request = DiagnoseRequest(
            endpoint=endpoint, dcgm=dcgm, duration_s=parse_duration_s(duration, "--duration"),
            prometheus=prometheus, since_s=parse_duration_s(since, "--since"),
            at_s=parse_time_s(at, "--at") if at is not None else None, namespace=namespace, pod=pod,
            snapshots=snapshots, timeout_s=parse_duration_s(timeout, "--timeout"),
            dcgm_labels=parse_label_map(dcgm_label or [], "--dcgm-label"),
            config=mixin_config(config), cluster=cluster)
        exit_code = _diagnose(request, output, bundle)
    except (DiagnoseError, ConfigError) as error:
        print_error(" ".join(str(error).split()))
        raise typer.Exit(EXIT_CANNOT_DIAGNOSE) from None
    raise typer.Exit(exit_code)


def _diagnose(request: DiagnoseRequest, output: OutputFormat, bundle: Path | None) -> int:
    """Run the checklist, print the report (and write the bundle); returns the report's exit code."""
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
    return report.exit_code
