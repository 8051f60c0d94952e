"""``gpctl gameday``: the shipped alerts and runbooks tested as incidents on a real vLLM pod.

The library (:mod:`growpage.gameday`) runs the scenarios; this command prints the timeline as it
goes, one row per scenario at the end, writes the result as JSON and exits 0 only when every
scenario passed (no false page, no missed page, diagnose in agreement).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from growpage.errors import ConfigError

# Deferred imports, by design: each command imports its work (torch, vLLM, the engine, the benchmarks)
# inside itself, so `gpctl --help` and every other command start without it
# (tests/test_layers.py: DEFERRED_BY_DESIGN).


def gameday(
    output: Annotated[Path | None, typer.Option(help="Write the result (verdicts, summary, settings, host) "
                                                     "as JSON here.")] = None,
    time_scale: Annotated[float, typer.Option(help="The rules' windows and `for` times this: 1/60 (the "
                                                   "default) reads an hour-long window over a minute; 1 runs "
                                                   "the real windows (hours).")] = 1 / 60,
    workdir: Annotated[Path | None, typer.Option(help="Where logs and Prometheus' data go (default: a "
                                                      "temporary folder, removed afterwards).")] = None,
    startup_timeout: Annotated[float, typer.Option(min=1, help="Seconds a pod may take to load its model.")]
    = 600,
) -> None:
    """Drive a vLLM pod with GrowPage, Prometheus and Alertmanager through six incidents and check what pages."""
    from growpage.gameday.runner import GamedaySettings, run_gameday
    from growpage.tooling.serve import check_vllm_installed

    if not 0 < time_scale <= 1:
        raise ConfigError(f"--time-scale must be in (0, 1]: 1/60 runs an hour in a minute; got {time_scale}")
    check_vllm_installed()
    settings = GamedaySettings(time_scale=time_scale, startup_timeout_s=startup_timeout,
                               alert_timeout_s=max(240.0, 14_400 * time_scale))
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="gpctl-gameday-") as folder:
            result = run_gameday(Path(folder), settings, log=typer.echo)
    else:
        result = run_gameday(workdir, settings, log=typer.echo)
    typer.echo("")
    for verdict in result.verdicts:
        diagnose = (f"diagnose {verdict.diagnose.status}" + ("" if verdict.diagnose_agrees else " (DISAGREES)")
                    if verdict.diagnose else "diagnose not run")
        typer.echo(f"{'PASS' if verdict.passed else 'FAIL'}  {verdict.scenario:17} received "
                   f"{', '.join(verdict.received) or 'nothing'}; false {len(verdict.false_pages)}, missed "
                   f"{len(verdict.missed) + len(verdict.unresolved)}; {diagnose}")
    summary = result.summary
    agreement = summary.diagnose_agreement
    typer.echo(f"{summary.passed}/{summary.scenarios} scenarios passed; pages expected {summary.pages_expected}, "
               f"received {summary.pages_received}, false {summary.false_pages}, missed {summary.missed_pages}; "
               f"diagnose agreement {'n/a' if agreement is None else f'{agreement:.0%}'}")
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    raise typer.Exit(0 if result.passed else 1)
