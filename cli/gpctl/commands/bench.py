"""``gpctl bench``: benchmarks whose numbers go into docs and closing notes, never into tests."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from growpage.bench.plots import sweep_tradeoff
from growpage.config import DEFAULT_ATTENTION_COVERAGE
from growpage.engine.model_prep import resolve_model_dir
from growpage.errors import ConfigError, GrowPageError

# Deferred imports, by design: each command imports its work (torch, vLLM, the engine, the benchmarks)
# inside itself, so `gpctl --help` and every other command start without it
# (tests/test_layers.py: DEFERRED_BY_DESIGN).

COVERAGE_HELP = (f"GrowPage's floor keeps this share of each request's observed attention (default "
                 f"{DEFAULT_ATTENTION_COVERAGE:g}, as inside vLLM; 0: the floor alone).")

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
    """decide() cost, monitor overhead per decode step, grant latency, compression throughput, and
    the vLLM observer's step and compaction at an 8B geometry (before/after chunked scoring)."""
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
    Console().print(_observation_table(result["observation"]))
    typer.echo(json.dumps(result))


def _observation_table(observation: dict) -> Table:
    """One row per observed-step size: ms and peak transient memory before and after."""
    geometry = observation["geometry"]
    table = Table(title=f"vLLM observer step at {geometry['num_layers']} layers x {geometry['num_kv_heads']} KV heads "
                        f"x {geometry['head_dim']} ({observation['cache']})")
    for column in ("requests x tokens", "before ms", "before peak", "after ms", "after peak", "chunks", "memory"):
        table.add_column(column, justify="right")
    for step in observation["steps"]:
        before = "skipped" if step["before_ms"] is None else f"{step['before_ms']:,}"
        table.add_row(f"{step['requests']} x {step['tokens']}", before, _mib(step["before_peak_bytes"]),
                      f"{step['after_ms']:,}", _mib(step["after_peak_bytes"]), str(step["after_chunks"]),
                      step["memory"])
    for compaction in observation["compaction"]:
        ms = "skipped" if compaction["ms"] is None else f"{compaction['ms']:,}"
        table.add_row(f"compact {compaction['tokens_moved']} of {compaction['tokens']}", "", "", ms,
                      _mib(compaction["peak_bytes"]), "", compaction["memory"])
    return table


def _mib(value: int) -> str:
    return f"{value / 2 ** 20:,.1f} MiB"


@app.command()
def engine(
    quick: Annotated[bool, typer.Option("--quick", help="Small sizes: a smoke run.")] = False,
    model: Annotated[Path | None, typer.Option(help="A prepared HF folder (default: the packaged model).")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads (default: torch's choice).")] = None,
    output: Annotated[Path | None, typer.Option(help="Also write the JSON here.")] = None,
) -> None:
    """Reference engine: decode tokens/s at batch 1/8/32, peak RSS, monitor and telemetry overheads."""
    from growpage.bench.engine import EngineBenchSettings, run_engine_bench

    settings = EngineBenchSettings.quick() if quick else EngineBenchSettings()
    settings = dataclasses.replace(settings, threads=threads)
    result = run_engine_bench(str(resolve_model_dir(model)), settings)
    _write(result, output)
    typer.echo(json.dumps(result, indent=2))


_FLAG_NAMES = {"thresholds_file": "config", "retrieval_depths": "retrieval-depth", "budgets": "budget"}


def _flags(overrides: dict) -> str:
    """The command-line flags that reproduce ``overrides`` (for the result's ``command``)."""
    flags = []
    for key, value in overrides.items():
        flag = "--" + _FLAG_NAMES.get(key, key.replace("_", "-"))
        if value is True:  # a switch
            flags.append(f" {flag}")
            continue
        flags += [f" {flag} {item}" for item in value] if isinstance(value, tuple) else [f" {flag} {value}"]
    return "".join(flags)


def _comparison(which: str, quick: bool, model: Path | None, threads: int | None, output_dir: Path,
                methods: list[str] | None, overrides: dict | None = None) -> dict:
    import torch

    from growpage.bench import harness, plots
    from growpage.bench.quality import QualitySettings, run_quality_bench
    from growpage.bench.serving import ServingSettings, run_serving_bench
    from growpage.core.methods import METHOD_NAMES

    unknown = sorted(set(methods or ()) - set(METHOD_NAMES))
    if unknown:
        raise typer.BadParameter(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHOD_NAMES)}",
                                 param_hint="--method")
    model_dir = str(resolve_model_dir(model))
    console = Console(stderr=True)
    loaded = harness.load(model_dir, threads)
    result: dict = {"command": f"gpctl bench {which}" + (" --quick" if quick else "") + _flags(overrides or {}),
                    "threads": torch.get_num_threads()}
    # Both settings types are dataclasses with the fields replaced below; the loop treats them alike.
    benches: list[tuple[str, Any, Callable[..., dict[str, Any]]]] = [
        ("quality", QualitySettings, run_quality_bench), ("serving", ServingSettings, run_serving_bench)]
    for name, settings_type, run in benches:
        if which not in (name, "all"):
            continue
        settings = settings_type.quick() if quick else settings_type()
        if methods:  # full_kv is the reference everything is compared with: always run it
            settings = dataclasses.replace(settings, methods=tuple(dict.fromkeys(["full_kv", *methods])))
        known = {field.name for field in dataclasses.fields(settings)}
        settings = dataclasses.replace(settings, **{k: v for k, v in (overrides or {}).items() if k in known})
        extra = {}
        if name == "quality":  # hours-long at full size: keep what each (method, budget) measured
            partial = output_dir / f"{which}-partial.json"

            def checkpoint(results: list[dict], partial: Path = partial) -> None:
                _write({"command": result["command"], "partial": True, "results": results}, partial)

            extra["checkpoint"] = checkpoint
        result[name] = run(model_dir, settings, progress=lambda m, name=name: console.log(f"{name}: {m}"),
                           loaded=loaded, **extra)
    output_dir.mkdir(parents=True, exist_ok=True)
    _write(result, output_dir / f"{which}{'-quick' if quick else ''}.json")
    result["plots"] = [str(p) for p in plots.write_all(result, output_dir)]
    return result


def _print_comparison(result: dict) -> None:
    console = Console()
    if "quality" in result:
        table = Table(title="quality vs KV bytes (agreement with full KV)")
        for column in ("method", "answers", "prefix", "NLL Δ", "correct retr.", "correct reas.", "correct/s",
                       "KV MiB mean", "× full", "decisions"):
            table.add_column(column, justify="left" if column in ("method", "decisions") else "right")
        for p in result["quality"]["results"]:
            answers = "—" if p["answer_agreement"] is None else f"{p['answer_agreement']:.0%}"
            accuracy = p.get("accuracy", {})
            table.add_row(p["label"] + (" *" if p["pareto"] else ""), answers, f"{p['agree_prefix_fraction']:.0%}",
                          f"{p['nll_delta']:+.4f}", _share(accuracy.get("retrieval")),
                          _share(accuracy.get("reasoning")),
                          _fixed(p.get("correct_per_s"), 3), f"{p['kv_bytes_mean'] / 2**20:.2f}",
                          f"{p['kv_bytes_ratio_to_full']:.2f}",
                          ", ".join(f"{k} {v}" for k, v in p["decisions"].items()))
        console.print(table)
        console.print("* on the Pareto frontier (answer agreement vs mean bytes)")
    if "serving" in result:
        table = Table(title=f"serving (full-KV demand {result['serving']['full_kv_demand_pages']} pages)")
        for column in ("pool", "method", "tokens/s", "ITL p50 ms", "ITL p99 ms", "queue p50 s", "preempt",
                       "peak running", "answers", "correct retr. / reas.", "correct/s", "NLL Δ"):
            table.add_column(column, justify="left" if column == "method" else "right")
        for r in result["serving"]["runs"]:
            accuracy, per_second = r.get("accuracy", {}), r.get("correct_per_s", {})
            table.add_row(str(r["pool_pages"]), r["method"], f"{r['tokens_per_s']:.1f}", _fixed(r["itl_p50_ms"], 0),
                          _fixed(r["itl_p99_ms"], 0), _fixed(r["queueing_p50_s"], 2), str(r["preemptions"]),
                          str(r["peak_running"]),
                          "—" if r.get("answer_agreement") is None else f"{r['answer_agreement']:.0%}",
                          f"{_share(accuracy.get('retrieval'))} / {_share(accuracy.get('reasoning'))}",
                          _fixed(sum(per_second.values()) if per_second else None, 3),
                          "—" if r.get("nll_increase") is None else f"{r['nll_increase']:+.4f}")
        console.print(table)
        console.print(f"verdict: {json.dumps(result['serving']['verdict'])}")
    for plot in result.get("plots", []):
        console.print(f"plot: {plot}")


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def _fixed(value: float | None, digits: int) -> str:
    """A table cell: the number, or a dash where the run had no samples of it."""
    return "—" if value is None else f"{value:.{digits}f}"


def _comparison_command(which: str) -> Callable[..., None]:
    def command(
        quick: Annotated[bool, typer.Option("--quick", help="Small workload: a few minutes on 2 cores.")] = False,
        model: Annotated[Path | None, typer.Option(help="A prepared HF folder (default: the packaged model).")] = None,
        threads: Annotated[int | None, typer.Option(min=1, help="torch threads (default: torch's choice).")] = None,
        output_dir: Annotated[Path, typer.Option(help="Where the JSON and PNG plots go.")] = Path("bench-results"),
        method: Annotated[list[str] | None, typer.Option(
            help="Only these methods (repeatable; full_kv is always run as the reference).")] = None,
        seed: Annotated[int | None, typer.Option(help="Workload seed: task numbers and arrival times "
                                                      "(confirm a result on a second seed).")] = None,
        reasoning: Annotated[int | None, typer.Option(min=1, help="serving: reasoning requests in the trace.")] = None,
        summaries: Annotated[int | None, typer.Option(min=0, help="serving: summary requests in the trace.")] = None,
        pool_requests: Annotated[list[float] | None, typer.Option(
            min=1, help="serving: pool sizes as the number of full-KV requests each fits (repeatable).")] = None,
        base_pages: Annotated[int | None, typer.Option(min=1, help="serving: GrowPage's floor and the fixed "
                                                                   "methods' cap, in pages.")] = None,
        retrieval_depth: Annotated[list[float] | None, typer.Option(
            min=0.0, max=1.0, help="quality: pass-key depths (repeatable; each at every context length).")] = None,
        pool: Annotated[str | None, typer.Option(
            help="quality: 'ample' (no request waits: quality when memory is free) or 'budget' (every "
                 "method gets the budget's pages per request: equal memory).")] = None,
        budget: Annotated[list[int] | None, typer.Option(
            min=1, help="quality: budgets in pages (repeatable; default 6 and 12).")] = None,
        config: Annotated[Path | None, typer.Option(
            help="A GrowPage config file whose thresholds (gpctl calibrate's output) GrowPage runs with; "
                 "default: the published thresholds.")] = None,
        retrieval: Annotated[int | None, typer.Option(
            min=0, help="serving: retrieval tasks with true answers mixed into the trace.")] = None,
        fidelity: Annotated[bool, typer.Option(
            "--fidelity", help="serving: also force every run through full KV's continuation (NLL Δ).")] = False,
        repeats: Annotated[int | None, typer.Option(
            min=1, help="serving: interleaved rounds of every method (more than 1: after a discarded "
                        "warm-up; medians with their range).")] = None,
        attention_coverage: Annotated[float | None, typer.Option(
            min=0.0, max=1.0, help="serving: " + COVERAGE_HELP)] = None,
    ) -> None:
        if pool is not None and pool not in ("ample", "budget"):
            raise typer.BadParameter(f"{pool!r} is not a pool; use ample or budget", param_hint="--pool")
        overrides = {"seed": seed, "reasoning": reasoning, "summaries": summaries, "base_pages": base_pages,
                     "pool_requests": tuple(pool_requests) if pool_requests else None,
                     "retrieval_depths": tuple(retrieval_depth) if retrieval_depth else None, "pool": pool,
                     "thresholds_file": str(config) if config else None,
                     "budgets": tuple(budget) if budget else None, "retrieval": retrieval,
                     "fidelity": True if fidelity else None, "repeats": repeats,
                     "attention_coverage": attention_coverage}
        if config is not None:
            from growpage.bench.harness import thresholds_from

            try:
                thresholds_from(str(config))  # a bad file fails now, in one line, not minutes in
            except ConfigError as error:
                raise typer.BadParameter(str(error), param_hint="--config") from None
        overrides = {k: v for k, v in overrides.items() if v is not None}
        _print_comparison(_comparison(which, quick, model, threads, output_dir, method, overrides))

    return command


app.command("quality", help="Quality vs KV bytes: every method and budget against full KV (JSON + plots).")(
    _comparison_command("quality"))
app.command("serving", help="Throughput vs latency under fixed page pools, Poisson trace (JSON + plots).")(
    _comparison_command("serving"))
app.command("all", help="quality and serving in one run, one model load (JSON + plots).")(
    _comparison_command("all"))


@app.command()
def fidelity(
    quick: Annotated[bool, typer.Option("--quick", help="Small workload: a smoke run.")] = False,
    model: Annotated[Path | None, typer.Option(help="A prepared HF folder (default: the packaged model).")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads (default: torch's choice).")] = None,
    method: Annotated[list[str] | None, typer.Option(help="Methods compared with full KV (repeatable).")] = None,
    budget: Annotated[list[int] | None, typer.Option(min=1, help="Budgets in pages (repeatable).")] = None,
    seed: Annotated[int | None, typer.Option(help="Workload seed.")] = None,
    config: Annotated[Path | None, typer.Option(help="A GrowPage config file with calibrated thresholds.")] = None,
    output: Annotated[Path | None, typer.Option(help="Also write the JSON here.")] = None,
    attention_coverage: Annotated[float | None, typer.Option(
        min=0.0, max=1.0, help=COVERAGE_HELP)] = None,
) -> None:
    """Reference engine: per-token NLL increase and KL over full KV of full KV's own continuation,
    teacher-forced under each method's cache (inside vLLM: gpctl bench vllm --part pressure)."""
    from growpage.bench.fidelity import FidelitySettings, run_fidelity

    settings = FidelitySettings.quick() if quick else FidelitySettings()
    overrides: dict[str, Any] = {"methods": tuple(method) if method else None,
                                 "budgets": tuple(budget) if budget else None,
                                 "seed": seed, "threads": threads, "thresholds_file": str(config) if config else None,
                                 "attention_coverage": attention_coverage}
    try:
        settings = dataclasses.replace(settings, **{k: v for k, v in overrides.items() if v is not None})
        console = Console(stderr=True)
        result = run_fidelity(str(resolve_model_dir(model)), settings, progress=lambda m: console.log(f"fidelity: {m}"))
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    _write(result, output)
    typer.echo(json.dumps(result, indent=2))
    table = Table(title=f"fidelity: {result['reference_tokens']} tokens of full KV's continuation, forced")
    for column in ("method", "NLL +nats/token", "per-request range", "KL >= (nats/token)", "decisions"):
        table.add_column(column, justify="left" if column in ("method", "decisions") else "right")
    for row in result["results"]:
        nll, kl = row["nll_increase"], row["kl_lower_bound"]["mean"]
        table.add_row(row["method"] + (f"@{row['budget_pages']}" if row["budget_pages"] else ""), f"{nll['mean']:+.4f}",
                      f"{nll['range'][0]:+.3f}..{nll['range'][1]:+.3f}", "-" if kl is None else f"{kl:.4f}",
                      ", ".join(f"{k} {v}" for k, v in row["decisions"].items()))
    Console(stderr=True).print(table)


@app.command("calibration-trace")
def calibration_trace(
    output: Annotated[Path, typer.Option(help="The /metrics/growpage snapshot to write (for gpctl calibrate "
                                              "--snapshot).")] = Path("bench-results/calibration-snapshot.prom"),
    model: Annotated[Path | None, typer.Option(help="A prepared HF folder (default: the packaged model).")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads (default: torch's choice).")] = None,
    seed: Annotated[int, typer.Option(help="The trace's seed (keep it apart from the benchmarks' 0 and 1).")] = 100,
) -> None:
    """Monitor mode over a calibration trace on the reference engine; saves /metrics/growpage for
    gpctl calibrate (the rollout's monitoring phase, reproducible)."""
    from growpage.bench.calibration import CalibrationSettings, run_calibration_trace

    settings = dataclasses.replace(CalibrationSettings(), threads=threads, seed=seed)
    console = Console(stderr=True)
    result = run_calibration_trace(str(resolve_model_dir(model)), settings, output,
                                   progress=lambda m: console.log(f"calibration: {m}"))
    typer.echo(json.dumps(result, indent=2))
    typer.echo(f"next: gpctl calibrate --snapshot {output} --output growpage-calibrated.yaml", err=True)


_TRACE_HELP = ("REQUESTSxTOKENS: the pressure traces' requests and new tokens per request (default 16x192), "
               "e.g. 12x160.")


def _trace_size(text: str | None) -> dict[str, int]:
    """``--trace 12x160`` as settings; a malformed value exits 2 with the expected form."""
    if text is None:
        return {}
    requests, separator, tokens = text.lower().partition("x")
    if not separator or not requests.isdigit() or not tokens.isdigit() or int(requests) < 1 or int(tokens) < 1:
        typer.echo(f"error: --trace {text} is not REQUESTSxTOKENS; e.g. --trace 12x160", err=True)
        raise typer.Exit(2)
    return {"requests": int(requests), "max_tokens": int(tokens)}


_PART_HELP = ("pressure (the traces under KV pressure), overhead (monitor and idle enforce vs vLLM alone), "
              "sampling (what monitor's sampling costs in decisions), retrieval (retrieval under KV pressure: "
              "accuracy, correct answers/s), accuracy (full KV on every retrieval family), sweep (GrowPage's "
              "floor and each fixed cap's budget: tokens/s against NLL increase), headline (GrowPage at its "
              "shipped defaults against tuned vLLM alone, every cap at equal memory and the limit), forecast "
              "(monitor's forecast against enforce), mixed (retrieval questions and long generations at once under "
              "KV pressure: accuracy, correct answers/s, NLL increase); default pressure, overhead and sampling.")
_SWEEP_VARIANT_HELP = ("LABEL[@METHOD,...]:KEY=VALUE[,KEY=VALUE]: run those methods' --part sweep points again "
                       "with these settings, named <point>/LABEL (repeatable), e.g. heads:keep_sets=kv_head or "
                       "rkv@growpage:redundancy_weight=0.9.")
_HEADLINE_VARIANT_HELP = ("LABEL:KEY=VALUE[,KEY=VALUE]: --part headline also runs GrowPage with these settings, "
                          "named growpage/LABEL, interleaved with the rest (repeatable), e.g. "
                          "fidelity:observe_skipped_steps=true or stale:readings_every_steps=32.")
_MAX_NUM_SEQS_HELP = ("max_num_seqs values vLLM alone also runs with in --part headline; the fastest is tuned "
                      "vLLM alone (repeatable; default 4 and 6).")


@app.command()
def vllm(
    quick: Annotated[bool, typer.Option("--quick", help="Small workload: a smoke run (about 4 minutes).")] = False,
    model: Annotated[Path | None, typer.Option(help="A prepared HF folder (default: the packaged model).")] = None,
    base_pages: Annotated[int | None, typer.Option(min=1, help="GrowPage's floor per request, in blocks "
                                                               "(default: the shipped floor, 128 tokens: 4 blocks "
                                                               "of 32).")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="OMP threads of the vLLM engines.")] = None,
    part: Annotated[list[str] | None, typer.Option(help=_PART_HELP)] = None,
    seed: Annotated[list[int] | None, typer.Option(help="Trace seeds (repeatable; default 0 and 1).")] = None,
    repeats: Annotated[int | None, typer.Option(min=1, help="Interleaved rounds of every variant (default 3).")
                       ] = None,
    method: Annotated[str | None, typer.Option(help="What GrowPage's runs enforce at a block boundary: the "
                                                    "plugin's method setting (default growpage).")] = None,
    sweep_pages: Annotated[list[int] | None, typer.Option(min=1, help="Floors and caps of --part sweep, in "
                                                                     "blocks (repeatable; default 2, 4, 6).")] = None,
    sweep_coverage: Annotated[list[float] | None, typer.Option(
        min=0.01, max=1.0, help="attention_coverage values run as more GrowPage points of --part sweep, at "
                                "the lowest --sweep-pages (repeatable; default none).")] = None,
    sweep_method: Annotated[list[str] | None, typer.Option(
        help="Methods of --part sweep (repeatable; default growpage, streaming_llm, h2o, snapkv).")] = None,
    sweep_variant: Annotated[list[str] | None, typer.Option(help=_SWEEP_VARIANT_HELP)] = None,
    max_num_seqs: Annotated[list[int] | None, typer.Option(min=1, help=_MAX_NUM_SEQS_HELP)] = None,
    headline_coverage: Annotated[list[float] | None, typer.Option(
        min=0.01, max=1.0, help="attention_coverage values --part headline also runs GrowPage at, the "
                                "shipped defaults otherwise (repeatable; default none), e.g. 0.8.")] = None,
    headline_variant: Annotated[list[str] | None, typer.Option(help=_HEADLINE_VARIANT_HELP)] = None,
    headline_skip: Annotated[list[str] | None, typer.Option(
        help="A variant --part headline leaves out (repeatable), e.g. monitor or growpage@room; vllm, "
             "growpage and limit always run.")] = None,
    retrieval_skip: Annotated[list[str] | None, typer.Option(
        help="A variant --part retrieval and --part mixed leave out (repeatable), e.g. h2o@4 or limit; vllm "
             "and growpage always run.")] = None,
    trace: Annotated[str | None, typer.Option(help=_TRACE_HELP)] = None,
    setting: Annotated[list[str] | None, typer.Option(help="KEY=VALUE: a setting of GrowPage's runs (the "
                                                            "plugin's additional_config keys; repeatable), e.g. "
                                                            "observe_every_steps=2.")] = None,
    output: Annotated[Path | None, typer.Option(help="Also write the JSON here (and, with --part sweep, the "
                                                     "plot beside it as <name>-sweep.png).")] = None,
) -> None:
    """vLLM alone vs GrowPage inside vLLM: tokens/s, correct answers/s, accuracy, NLL increase, overhead."""
    from growpage.bench.vllm import run_vllm_bench

    listed = {"seeds": seed, "sweep_pages": sweep_pages, "sweep_coverage": sweep_coverage,
              "tuned_max_num_seqs": max_num_seqs, "headline_skip": headline_skip,
              "headline_coverage": headline_coverage,
              "retrieval_skip": retrieval_skip}
    settings = _vllm_settings(quick, threads, part, method, setting, {
        "base_pages": base_pages, "repeats": repeats, **{k: tuple(v) if v else None for k, v in listed.items()},
        **_trace_size(trace)}, sweep_method or [], sweep_variant or [], headline_variant or [])
    console = Console(stderr=True)
    try:
        result = run_vllm_bench(str(model) if model else None, settings, log=lambda line: console.log(line))
    except GrowPageError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    _write(result, output)
    typer.echo(json.dumps(result, indent=2))
    _print_vllm_tables(result, console, output)


def _print_vllm_tables(result: dict, console: Console, output: Path | None) -> None:
    _print_goodput(result, console)
    _print_sweep(result, console, output)
    _print_headline(result, console)
    _print_forecast(result, console)
    _print_rollouts(result, console)


def _print_rollouts(result: dict, console: Console) -> None:
    """Calibrate's rollout from each judged trace's monitor runs, against what enforce then did."""
    from growpage.bench.rollout import rollout_lines

    for line in rollout_lines(result):
        console.print(line)


def _print_forecast(result: dict, console: Console) -> None:
    """The forecast part's table: per seed, the forecast against what enforce then did."""
    from growpage.bench.forecast import FORECAST_TOLERANCE, forecast_rows

    rows = forecast_rows(result)
    if not rows:
        return
    table = Table(title=f"gpctl bench vllm --part forecast: forecast / enforce, median \\[min-max] of the rounds "
                        f"(target: within {FORECAST_TOLERANCE:.0%})")
    for column in ("seed", "pages freed", "preemptions avoided", "rounds within", "medians"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def _print_headline(result: dict, console: Console) -> None:
    """The headline part's table: every variant per seed, speeds against tuned vLLM alone."""
    from growpage.bench.headline import headline_rows

    rows = headline_rows(result)
    if not rows:
        return
    table = Table(title="gpctl bench vllm --part headline (median \\[min-max] of the repeats)")
    for column in ("seed", "variant", "tokens/s", "x tuned vLLM", "NLL +nats/token", "preemptions",
                   "blocks/request", "correct/s"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def _vllm_settings(quick: bool, threads: int | None, part: list[str] | None, method: str | None,
                   setting: list[str] | None, overrides: dict[str, Any], sweep_methods: list[str] | None = None,
                   sweep_variants: list[str] | None = None, headline_variants: list[str] | None = None) -> Any:
    """``gpctl bench vllm``'s settings from its options; a bad choice exits 2 with one line."""
    from growpage.bench.vllm_settings import PARTS, SWEEP_METHODS, SweepVariant, VllmBenchSettings
    from growpage.vllm_plugin.settings import VLLM_METHODS

    settings = VllmBenchSettings.quick() if quick else VllmBenchSettings()
    settings = dataclasses.replace(settings, threads=threads)
    unknown = sorted(set(part or ()) - set(PARTS))
    if unknown:
        typer.echo(f"error: --part {unknown[0]} is unknown; use --part {', '.join(PARTS)}", err=True)
        raise typer.Exit(2)
    if part:
        settings = dataclasses.replace(settings, parts=tuple(part))
    if method is not None and method not in VLLM_METHODS:
        typer.echo(f"error: --method {method} is unknown; use one of {', '.join(VLLM_METHODS)}", err=True)
        raise typer.Exit(2)
    unknown = sorted(set(sweep_methods or ()) - set(SWEEP_METHODS))
    if unknown:
        typer.echo(f"error: --sweep-method {unknown[0]} is unknown; use one of {', '.join(SWEEP_METHODS)}", err=True)
        raise typer.Exit(2)
    try:
        extra = _growpage_settings(setting or [], settings, method)
        variants = tuple(SweepVariant.parse(text) for text in sweep_variants or ())
        headlined = tuple(SweepVariant.parse(text) for text in headline_variants or ())
        for variant in (*variants, *headlined):  # a typo fails here, not in the first engine
            _check_growpage_settings(settings, {**extra, **variant.settings})
        if any(variant.methods for variant in headlined):
            raise ValueError("--headline-variant takes no @METHOD: it runs GrowPage's method with other "
                             "settings; e.g. stale:readings_every_steps=32")
    except (ConfigError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    chosen = {**overrides, "growpage": extra or None, "sweep_methods": tuple(sweep_methods or ()) or None,
              "sweep_variants": variants or None, "headline_variants": headlined or None}
    return dataclasses.replace(settings, **{k: v for k, v in chosen.items() if v is not None})


def _growpage_settings(pairs: list[str], settings: Any, method: str | None) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as GrowPage settings (values read as JSON where they parse: 2, 0.5, true),
    checked the way the plugin will read them, so a typo fails here and not in the first engine."""
    extra: dict[str, Any] = {"method": method} if method else {}
    for pair in pairs:
        key, separator, text = pair.partition("=")
        if not separator or not key:
            raise ValueError(f"--setting {pair!r} is not KEY=VALUE; e.g. --setting observe_every_steps=2")
        try:
            extra[key] = json.loads(text)
        except json.JSONDecodeError:
            extra[key] = text
    _check_growpage_settings(settings, extra)
    return extra


def _check_growpage_settings(settings: Any, values: dict[str, Any]) -> None:
    """Read ``values`` as the plugin will (raises ConfigError with the fix)."""
    from growpage.vllm_plugin.settings import split_settings

    split_settings({**settings.growpage_config(), **values}, env={}, block_size=settings.block_size)


def _print_sweep(result: dict, console: Console, output: Path | None) -> None:
    """The sweep's points and verdict per seed; its plot beside ``output``."""
    from growpage.bench.sweep import sweep_rows

    if not result.get("sweeps"):
        return
    table = Table(title="gpctl bench vllm --part sweep: tokens/s against NLL increase (median \\[min-max])")
    for column in ("seed", "variant", "tokens/s", "x vLLM alone", "NLL +nats/token", "preemptions"):
        # a variant's name says what ran (growpage@2+cov0.95/heads): never cut it
        table.add_column(column, justify="left" if column in ("seed", "variant") else "right",
                         no_wrap=column == "variant")
    for row in sweep_rows(result["sweeps"]):
        table.add_row(*row)
    console.print(table)
    for sweep in result["sweeps"]:
        console.print(f"seed {sweep['seed']}: {json.dumps(sweep['verdict'])}")
    if output is not None:
        plot = sweep_tradeoff(result, output.with_name(f"{output.stem}-sweep.png"))
        console.print(f"plot: {plot}")


def _print_goodput(result: dict, console: Console) -> None:
    """Tokens/s next to accuracy, correct answers/s and NLL increase (medians, range in brackets)."""
    from growpage.bench.goodput import goodput_rows

    rows = goodput_rows(result)
    if not rows:
        return
    table = Table(title="gpctl bench vllm: goodput (median \\[min-max] of the repeats)")
    for column in ("workload", "variant", "tokens/s", "accuracy", "correct/s", "NLL +nats/token"):
        table.add_column(column, justify="left" if column in ("workload", "variant") else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    families = result.get("accuracy", {}).get("accuracy_by_family")
    if families:
        console.print("full-KV accuracy per family: " + ", ".join(
            f"{name} {tally['correct']}/{tally['total']}" for name, tally in families.items())
            + f"; headlined (>= 80 %): {', '.join(result['accuracy']['headlined']) or 'none'}")
