"""``gpctl fleet``: N ``gpctl serve --engine vllm`` replicas and vLLM's router on this machine.

The library (:mod:`growpage.tooling.fleet`) starts and stops the processes; this command parses
the options, prints where everything listens and waits for SIGINT/SIGTERM (or a process that dies),
then stops every process group it started.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
from pathlib import Path
from typing import Annotated, Any

import typer

from growpage.engine.model_prep import resolve_model_dir
from growpage.errors import ConfigError

# Deferred imports, by design: each command imports its work (torch, vLLM, the engine, the benchmarks)
# inside itself, so `gpctl --help` and every other command start without it
# (tests/test_layers.py: DEFERRED_BY_DESIGN).


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--kv-blocks {text!r}: give whole numbers separated by commas, e.g. 64,256") from None
    if any(value < 1 for value in values):
        raise ConfigError(f"--kv-blocks {text!r}: every replica needs at least 1 block")
    return values


def fleet(
    replicas: Annotated[int, typer.Option(help="Replicas to start.")] = 2,
    port: Annotated[int, typer.Option(help="API port of the first replica (the next ones follow).")] = 8001,
    router_port: Annotated[int, typer.Option(help="The router's port: send requests here.")] = 8000,
    metrics_port: Annotated[int, typer.Option(help="GrowPage exporter port of the first replica.")] = 9464,
    policy: Annotated[str, typer.Option(help="vllm-router policy (power_of_two reads GrowPage's /get_load).")]
    = "power_of_two",
    mode: Annotated[str, typer.Option(help="GrowPage mode of every replica: off | monitor | enforce, or vllm "
                                           "(vLLM alone).")] = "enforce",
    kv_blocks: Annotated[str, typer.Option(help="KV blocks per replica, one value for all or one per replica "
                                                "(e.g. 64,256). Default: vLLM's sizing.")] = "",
    base_pages: Annotated[int | None, typer.Option(help="The floor no compression goes below, in blocks.")] = None,
    max_model_len: Annotated[int | None, typer.Option(min=1, help="Context per request.")] = None,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="Running requests per replica at most.")] = 8,
    model: Annotated[Path | None, typer.Option(help="Model folder (default: the packaged model).")] = None,
    served_model_name: Annotated[str, typer.Option(help="Model id clients send.")] = "growpage",
    load_poll: Annotated[int, typer.Option(min=1, help="Seconds between the router's /get_load polls.")] = 1,
    log_dir: Annotated[Path, typer.Option(help="One log file per process.")] = Path("fleet-logs"),
    startup_timeout: Annotated[float, typer.Option(min=1, help="Seconds each process may take to answer.")] = 900,
) -> None:
    """Start a fleet on loopback and keep it up until Ctrl-C (every process group is stopped then)."""
    from growpage.tooling.fleet import Fleet, fleet_spec, router_executable
    from growpage.tooling.serve import check_vllm_installed

    spec = fleet_spec(replicas=replicas, port=port, router_port=router_port, metrics_port=metrics_port, mode=mode,
                      kv_blocks=_int_list(kv_blocks), policy=policy, model=str(model) if model else None,
                      base_pages=base_pages, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                      served_model_name=served_model_name, load_poll_s=load_poll)
    check_vllm_installed()
    router_executable()  # fails with the fix before a minute of vLLM start-up
    stopping = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with Fleet(spec, log_dir) as running:
            typer.echo(f"starting {replicas} replicas and the router (logs in {log_dir})", err=True)
            running.start(startup_timeout)
            for name, where in running.urls().items():
                typer.echo(f"{name}: {where}")
            while not stopping.wait(1.0):
                if running.exited():
                    raise ConfigError(f"{', '.join(running.exited())} exited; see the logs in {log_dir}")
            typer.echo("stopping the fleet", err=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def bench_fleet(
    quick: Annotated[bool, typer.Option("--quick", help="A shorter trace (8 requests, shorter generations).")]
    = False,
    variant: Annotated[list[str] | None, typer.Option(help="round_robin, power_of_two_vllm, growpage_monitor or "
                                                            "growpage (repeat; default: all four).")] = None,
    model: Annotated[Path | None, typer.Option(help="Model folder (default: the packaged model).")] = None,
    repeats: Annotated[int | None, typer.Option(min=1, help="Interleaved rounds of every variant (default 2; "
                                                            "medians and ranges are reported).")] = None,
    seed: Annotated[int | None, typer.Option(help="The trace's seed (default 0; another seed is a second trace).")]
    = None,
    retrieval: Annotated[int | None, typer.Option(min=0, help="Retrieval questions in the trace (default 8).")]
    = None,
    reasoning: Annotated[int | None, typer.Option(min=0, help="Step-by-step generations in the trace (default 12).")]
    = None,
    kv_blocks: Annotated[list[int] | None, typer.Option(min=1, help="KV blocks of replica A, then of B (give it "
                                                         "twice; default 33 and 99; 66 and 66: equal replicas).")]
    = None,
    output: Annotated[Path | None, typer.Option(help="Also write the JSON here.")] = None,
    log_dir: Annotated[Path, typer.Option(help="One log file per process and variant.")] = Path("fleet-bench-logs"),
) -> None:
    """Two replicas (one with a third of the other's KV) behind vLLM's router, the same skewed trace per
    variant: preemptions, p99 TTFT and ITL, correct answers per second (docs/FLEET.md)."""
    from growpage.bench.fleet import VARIANTS, FleetBenchSettings, run_fleet_bench, table
    from growpage.tooling.fleet import router_executable
    from growpage.tooling.serve import CPU_BLOCK_SIZE, check_vllm_installed

    unknown = sorted(set(variant or ()) - set(VARIANTS))
    if unknown:
        raise ConfigError(f"--variant {', '.join(unknown)} is unknown; choose from {', '.join(VARIANTS)}")
    if kv_blocks is not None and len(kv_blocks) != 2:
        raise ConfigError(f"--kv-blocks was given {len(kv_blocks)} time(s); give it twice, replica A's blocks then "
                          "B's (e.g. --kv-blocks 66 --kv-blocks 66)")
    settings = FleetBenchSettings.quick() if quick else FleetBenchSettings()
    overrides: dict[str, Any] = {"variants": tuple(variant) if variant else None, "repeats": repeats,
                                 "seed": seed, "retrieval": retrieval, "reasoning": reasoning,
                                 "kv_blocks": tuple(kv_blocks) if kv_blocks else None}
    settings = dataclasses.replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    if settings.retrieval + settings.reasoning == 0:
        raise ConfigError("the trace is empty: give --retrieval or --reasoning a count above 0")
    smallest = -(-settings.max_model_len // CPU_BLOCK_SIZE) + 1  # one request at full length, and vLLM's null block
    if min(settings.kv_blocks) < smallest:
        raise ConfigError(f"--kv-blocks {min(settings.kv_blocks)} cannot hold one request of {settings.max_model_len} "
                          f"tokens; give each replica at least {smallest} blocks")
    check_vllm_installed()
    router_executable()
    report = run_fleet_bench(settings, str(resolve_model_dir(model)), log_dir,
                             log=lambda line: typer.echo(line, err=True))
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    typer.echo(table(report))
    if report["verdict"]:
        typer.echo(f"verdict (medians): {json.dumps(report['verdict'])}")
