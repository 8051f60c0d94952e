"""``gpctl calibrate``: thresholds at stated quantiles of what monitor mode observed, as a config file.

Every problem the user can fix (no source, unreachable, too few samples, unwritable output) is a
GrowPageError: the root group prints one line and exits 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpctl.sources import (
    AtOption,
    SinceOption,
    SnapshotFiles,
    TimeoutOption,
    endpoint_option,
    prometheus_option,
    snapshot_option,
    snapshot_paths,
)
from growpage.calibrate import (
    DEFAULT_MIN_SAMPLES,
    DEFAULT_OUTPUT,
    CalibrateRequest,
    Quantiles,
    check_writable,
    render_yaml,
    run,
    to_json,
    write_config,
)
from growpage.diagnose import parse_duration_s, parse_time_s

_QUANTILES = "Quantiles"
_DEFAULTS = Quantiles()

EndpointOption = Annotated[str | None, endpoint_option(
    "one scrape, the distributions since it started; with --duration, two scrapes and their increase.")]
PrometheusOption = Annotated[str | None, prometheus_option("increase() of the buckets over --since.")]
SnapshotOption = Annotated[list[Path] | None, snapshot_option("; two or more: the increase from oldest to newest.")]
DurationOption = Annotated[str | None, typer.Option(
    metavar="DURATION", show_default=False, help="With --endpoint: scrape twice this far apart (e.g. 10m).")]
NamespaceOption = Annotated[str | None, typer.Option(
    metavar="NAMESPACE", show_default=False, help="With --prometheus: only this namespace.")]
ModelNameOption = Annotated[str | None, typer.Option(
    metavar="MODEL", show_default=False,
    help="The model to calibrate (its model_name label); needed when the source has several.")]
BlockSizeOption = Annotated[int | None, typer.Option(
    metavar="TOKENS", show_default=False, help="Tokens per page; default: growpage_build_info's block_size.")]
LtsQuantileOption = Annotated[float, typer.Option(
    rich_help_panel=_QUANTILES,
    help="lts_grow_threshold: requests above this LTS quantile grow at their boundary.")]
RolloutQuantileOption = Annotated[float, typer.Option(
    rich_help_panel=_QUANTILES,
    help="rollout_entropy_threshold: namespaces whose LTS p50 exceeds it are rollout candidates.")]
DensityQuantileOption = Annotated[float, typer.Option(
    rich_help_panel=_QUANTILES, help="density_threshold: STS density above this quantile counts as dense.")]
TokensQuantileOption = Annotated[float, typer.Option(
    rich_help_panel=_QUANTILES, help="base_pages: this request-size quantile / block_size, rounded up.")]
MinSamplesOption = Annotated[int, typer.Option(help="Refuse when a distribution has fewer observations.")]
OutputOption = Annotated[Path, typer.Option(metavar="PATH", help="The config file to write.")]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Print the YAML instead of writing it.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print a JSON summary (values and evidence).")]


def calibrate(
    files: SnapshotFiles = None,
    endpoint: EndpointOption = None,
    prometheus: PrometheusOption = None,
    snapshot: SnapshotOption = None,
    duration: DurationOption = None,
    since: SinceOption = "30m",
    at: AtOption = None,
    namespace: NamespaceOption = None,
    model_name: ModelNameOption = None,
    block_size: BlockSizeOption = None,
    lts_quantile: LtsQuantileOption = _DEFAULTS.lts_grow,
    rollout_quantile: RolloutQuantileOption = _DEFAULTS.rollout_entropy,
    density_quantile: DensityQuantileOption = _DEFAULTS.density,
    tokens_quantile: TokensQuantileOption = _DEFAULTS.request_tokens,
    min_samples: MinSamplesOption = DEFAULT_MIN_SAMPLES,
    output: OutputOption = DEFAULT_OUTPUT,
    dry_run: DryRunOption = False,
    as_json: JsonOption = False,
    timeout: TimeoutOption = "10s",
) -> None:
    """Choose GrowPage's thresholds from what monitor mode observed, and write them as a config file.

    lts_grow_threshold, rollout_entropy_threshold, density_threshold and base_pages, each at a stated quantile of
    growpage_lts_entropy, growpage_sts_density_ratio or growpage_request_tokens.

    The file's header gives the source, the window, the sample counts and the command. Exit 2 on bad input.

    Examples: [bold]gpctl calibrate --endpoint http://vllm:8000[/bold];
    [bold]gpctl calibrate --prometheus http://prometheus:9090 --since 6h --namespace chat[/bold];
    [bold]gpctl calibrate --snapshot before.prom after.prom --dry-run[/bold]
    """
    request = CalibrateRequest(
        endpoint=endpoint, prometheus=prometheus, snapshots=snapshot_paths(snapshot, files),
        duration_s=parse_duration_s(duration, "--duration") if duration is not None else None,
        since_s=parse_duration_s(since, "--since"), at_s=parse_time_s(at, "--at") if at is not None else None,
        namespace=namespace, model_name=model_name, timeout_s=parse_duration_s(timeout, "--timeout"),
        block_size=block_size,
        quantiles=Quantiles(lts_grow=lts_quantile, rollout_entropy=rollout_quantile, density=density_quantile,
                            request_tokens=tokens_quantile),
        min_samples=min_samples, output=output, dry_run=dry_run)
    _calibrate(request, as_json)


def _calibrate(request: CalibrateRequest, as_json: bool) -> None:
    """Run ``request``; write the config file unless a dry run, and print the YAML, JSON or one line."""
    if not request.dry_run:
        check_writable(request.output)
    calibration, evidence = run(request)
    command = request.command()
    text = render_yaml(calibration, evidence, command)
    if not request.dry_run:
        write_config(request.output, text)
    if as_json:
        typer.echo(to_json(calibration, evidence, command, None if request.dry_run else request.output))
    elif request.dry_run:
        typer.echo(text, nl=False)
    else:
        values = ", ".join(f"{name} {value}" for name, value in calibration.config_values().items())
        typer.echo(f"wrote {request.output} for model {calibration.model or '(unlabelled)'} "
                   f"({evidence.window.describe()}): {values}")
