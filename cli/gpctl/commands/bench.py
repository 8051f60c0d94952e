"""``gpctl bench``: benchmarks whose numbers go into docs and closing notes, never into tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table


app = typer.Typer(help="Measure GrowPage (results as JSON and a table).", no_args_is_help=True)


def _write(result: dict, output: Path | None) -> None:
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


@app.command()
def core(
    device: Annotated[str, typer.Option(help="cpu, or cuda where a GPU exists.")] = "cpu",
    quick: Annotated[bool, typer.Option("--quick", help="Small sizes: a smoke run in seconds.")] = False,
    batch_size: Annotated[int, typer.Option(min=1, help="Requests decoding together.")] = 16,
    context_tokens: Annotated[int, typer.Option(min=1, help="Tokens cached per request.")] = 512,
    output: Annotated[Path | None, typer.Option(help="Also write the JSON here.")] = None,
    json_only: Annotated[bool, typer.Option("--json", help="Print only the JSON.")] = False,
) -> None:
    """decide() cost, monitor overhead per decode step, grant latency, compression throughput."""
    from growpage.bench.core import CoreBenchSettings, run_core_bench  # torch loads only when used

    settings = (CoreBenchSettings.quick(device) if quick
                else CoreBenchSettings(device=device, batch_size=batch_size, context_tokens=context_tokens))
    result = run_core_bench(settings)
    _write(result, output)
    if json_only:
        typer.echo(json.dumps(result, indent=2))
        return
    table = Table(title=f"gpctl bench core — {result['device_name']} ({result['device']}, "
                        f"{result['threads']} threads)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for section in ("policy", "monitor_overhead", "grants", "compression"):
        for key, value in result[section].items():
            table.add_row(f"{section}.{key}", f"{value:,}" if isinstance(value, (int, float)) else str(value))
    Console().print(table)
    typer.echo(json.dumps(result))


@app.command()
def engine(
    quick: Annotated[bool, typer.Option("--quick", help="Small sizes: a smoke run.")] = False,
    model: Annotated[Path | None, typer.Option(help="A prepared HF folder (default: the packaged model).")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads (default: torch's choice).")] = None,
    output: Annotated[Path | None, typer.Option(help="Also write the JSON here.")] = None,
) -> None:
    """Reference engine: decode tokens/s at batch 1/8/32, peak RSS, monitor and telemetry overheads."""
    import dataclasses

    from growpage.bench.engine import EngineBenchSettings, run_engine_bench
    from growpage.engine.model_prep import resolve_model_dir

    settings = EngineBenchSettings.quick() if quick else EngineBenchSettings()
    settings = dataclasses.replace(settings, threads=threads)
    result = run_engine_bench(str(resolve_model_dir(model)), settings)
    _write(result, output)
    typer.echo(json.dumps(result, indent=2))
