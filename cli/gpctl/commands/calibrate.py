"""``gpctl calibrate``: thresholds at stated quantiles of what monitor mode observed, as a config file.

Every problem the user can fix (no source, unreachable, too few samples, unwritable output) is a
GrowPageError: the root group prints one line and exits 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpctl.sources import endpoint_option, prometheus_option, snapshot_files_argument, snapshot_option, snapshot_paths
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


def calibrate(
    files: Annotated[list[Path] | None, snapshot_files_argument()] = None,
    endpoint: Annotated[
        str | None, endpoint_option("one scrape, the distributions since it started; with --duration, two "
                                    "scrapes and their increase."),
    ] = None,
    prometheus: Annotated[str | None, prometheus_option("increase() of the buckets over --since.")] = None,
    snapshot: Annotated[
        list[Path] | None, snapshot_option("; two or more: the increase from oldest to newest."),
    ] = None,
    duration: Annotated[
        str | None, typer.Option(metavar="DURATION", show_default=False,
                                 help="With --endpoint: scrape twice this far apart (e.g. 10m)."),
    ] = None,
    since: Annotated[
        str, typer.Option(metavar="DURATION", help="With --prometheus: the window to read."),
    ] = "30m",
    at: Annotated[
        str | None, typer.Option(metavar="TIME", show_default=False,
                                 help="With --prometheus: the window's end (unix seconds or ISO 8601); default now."),
    ] = None,
    namespace: Annotated[
        str | None, typer.Option(metavar="NAMESPACE", show_default=False,
                                 help="With --prometheus: only this namespace."),
    ] = None,
    model_name: Annotated[
        str | None, typer.Option(metavar="MODEL", show_default=False,
                                 help="The model to calibrate (its model_name label); "
                                 "needed when the source has several."),
    ] = None,
    block_size: Annotated[
        int | None, typer.Option(metavar="TOKENS", show_default=False,
                                 help="Tokens per page; default: growpage_build_info's block_size."),
    ] = None,
    lts_quantile: Annotated[
        float, typer.Option(rich_help_panel=_QUANTILES,
                            help="lts_grow_threshold: requests above this LTS quantile grow at their boundary."),
    ] = _DEFAULTS.lts_grow,
    rollout_quantile: Annotated[
        float, typer.Option(rich_help_panel=_QUANTILES,
                            help="rollout_entropy_threshold: namespaces whose LTS p50 exceeds it "
                            "are rollout candidates."),
    ] = _DEFAULTS.rollout_entropy,
    density_quantile: Annotated[
        float, typer.Option(rich_help_panel=_QUANTILES,
                            help="density_threshold: STS density above this quantile counts as dense."),
    ] = _DEFAULTS.density,
    tokens_quantile: Annotated[
        float, typer.Option(rich_help_panel=_QUANTILES,
                            help="base_pages: this request-size quantile / block_size, rounded up."),
    ] = _DEFAULTS.request_tokens,
    min_samples: Annotated[
        int, typer.Option(help="Refuse when a distribution has fewer observations."),
    ] = DEFAULT_MIN_SAMPLES,
    output: Annotated[Path, typer.Option(metavar="PATH", help="The config file to write.")] = DEFAULT_OUTPUT,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the YAML instead of writing it.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary (values and evidence).")] = False,
    timeout: Annotated[
        str, typer.Option(metavar="DURATION", help="Per HTTP request, from connecting to the last byte."),
    ] = "10s",
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
    if not dry_run:
        check_writable(output)
    calibration, evidence = run(request)
    command = request.command()
    text = render_yaml(calibration, evidence, command)
    if not dry_run:
        write_config(output, text)
    if as_json:
        typer.echo(to_json(calibration, evidence, command, None if dry_run else output))
    elif dry_run:
        typer.echo(text, nl=False)
    else:
        values = ", ".join(f"{name} {value}" for name, value in calibration.config_values().items())
        typer.echo(f"wrote {output} for model {calibration.model or '(unlabelled)'} "
                   f"({evidence.window.describe()}): {values}")
