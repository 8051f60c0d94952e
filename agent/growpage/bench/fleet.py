"""A fleet benchmark: two replicas behind vLLM's router, one with a third of the other's KV space.

The same skewed trace (long-context retrieval questions with true answers, ``growpage.bench.tasks``,
interleaved with long step-by-step generations) goes through the router once per variant:

- ``round_robin``: vLLM alone on both replicas, the router alternating;
- ``power_of_two_vllm``: vLLM alone, ``power_of_two`` on vLLM's own load (no ``/get_load``: the
  router counts its own requests in flight per replica);
- ``growpage_monitor``: GrowPage in monitor on both replicas, ``power_of_two`` reading their
  ``/get_load``: the load signal alone (vLLM pages on its own), so the table says whether the
  routing or the enforcing won;
- ``growpage``: GrowPage enforcing on both replicas, ``power_of_two`` reading their ``/get_load``.

Both replicas run GrowPage's shipped defaults (``base_pages`` only where set). A second topology
with equal replicas (``--kv-blocks 66 --kv-blocks 66``) checks that the win is not the skew's.

Per variant: vLLM's preemptions on both replicas (``vllm:num_preemptions_total``), p99 time to first
token and inter-token latency seen by the client (streamed chat completions), correct answers and
correct answers per second of the trace's span, and the requests each replica finished. Client-side
times are wall-clock measurements of this machine, reported, never asserted. Every replica of every
variant gets the same engine arguments (``gpctl serve``'s, vLLM alone included), and the report
records them with the host, the commit, the versions and the GrowPage settings the replicas resolve.

Every variant runs ``repeats`` times, interleaved (the order reverses each round, so drift over the
run does not always favour the same variant); each number is reported as the median of the rounds
with its range, every round kept, and :func:`verdict` reads the medians against the target: fewer
preemptions and lower p99 TTFT and ITL than both baselines, at equal or better accuracy.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from growpage.bench.goodput import round_order
from growpage.bench.tasks import Task, is_correct, reasoning_tasks, retrieval_tasks
from growpage.core.quantiles import percentile
from growpage.provenance import host_facts
from growpage.tooling.fleet import Fleet, FleetSpec, fleet_spec, replica_command

VARIANTS: dict[str, tuple[str, str]] = {  # name -> (router policy, replica mode)
    "round_robin": ("round_robin", "vllm"),
    "power_of_two_vllm": ("power_of_two", "vllm"),
    "growpage_monitor": ("power_of_two", "monitor"),
    "growpage": ("power_of_two", "enforce"),
}
MODEL_NAME = "growpage-bench"


@dataclasses.dataclass(frozen=True)
class FleetBenchSettings:
    """The fleet and the trace (defaults: a run of a few minutes per variant on 2 CPU cores)."""

    kv_blocks: tuple[int, int] = (33, 99)  # A holds a third of B's KV (one block is vLLM's null block)
    base_pages: int | None = None  # None: the shipped floor
    max_model_len: int = 1024
    max_num_seqs: int = 8
    retrieval: int = 8  # 512-token retrieval questions (passkey, code), 16 new tokens
    reasoning: int = 12  # step-by-step generations
    reasoning_tokens: int = 256
    arrival_gap_s: float = 0.5
    seed: int = 0
    variants: tuple[str, ...] = tuple(VARIANTS)
    port: int = 18201
    router_port: int = 18200
    metrics_port: int = 19201
    cpu_binds: tuple[str, ...] = ("0", "1")
    repeats: int = 2

    @classmethod
    def quick(cls) -> FleetBenchSettings:
        return cls(retrieval=4, reasoning=4, reasoning_tokens=96, repeats=1)


def skewed_trace(settings: FleetBenchSettings) -> list[Task]:
    """Retrieval questions and long generations in the order question, generation, generation,
    question (repeated): a router that alternates sends both kinds to both replicas, and a question's
    prompt alone fills half of replica A's KV while generations grow beside it."""
    questions = retrieval_tasks(settings.seed, families=("passkey", "code"), context_tokens=(512,))
    # not every step-by-step prompt has a single true result: draw more, keep the first that do
    generations = reasoning_tasks(settings.reasoning * 3, settings.reasoning_tokens, settings.seed)[:settings.reasoning]
    queues = {"question": collections.deque(questions[i % len(questions)] for i in range(settings.retrieval)),
              "generation": collections.deque(generations)}
    pattern = itertools.cycle(("question", "generation", "generation", "question"))
    trace: list[Task] = []
    while queues["question"] or queues["generation"]:
        kind = next(pattern)
        queue = queues[kind] or queues["generation" if kind == "question" else "question"]
        trace.append(queue.popleft())
    return trace


def stream_request(url: str, task: Task, clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """One streamed chat completion: time to first token, the gaps between tokens, the reply, correct?"""
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": task.prompt}], "stream": True,
            "max_tokens": task.max_tokens, "temperature": 0}
    started, stamps, text = clock(), [], []
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=900) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                delta = json.loads(line[6:])["choices"][0].get("delta", {}).get("content") or ""
                if delta:
                    stamps.append(clock())
                    text.append(delta)
    except httpx.HTTPError as error:
        return {"task_id": task.task_id, "family": task.family, "error": str(error), "correct": False}
    reply = "".join(text)
    return {"task_id": task.task_id, "family": task.family, "correct": is_correct(task, reply), "reply": reply,
            "ttft_s": stamps[0] - started if stamps else None, "tokens": len(stamps),
            "gaps_s": [later - earlier for earlier, later in zip(stamps, stamps[1:], strict=False)],
            "started_s": started, "finished_s": stamps[-1] if stamps else clock()}


def run_trace(url: str, trace: Sequence[Task], gap_s: float) -> list[dict[str, Any]]:
    """Send the trace open-loop (one request every ``gap_s``), wait for every reply."""
    results: list[dict[str, Any]] = [{} for _ in trace]

    def send(index: int) -> None:
        results[index] = stream_request(url, trace[index])

    threads = [threading.Thread(target=send, args=(index,), daemon=True) for index in range(len(trace))]
    for thread in threads:
        thread.start()
        time.sleep(gap_s)
    for thread in threads:
        thread.join()
    return results


def vllm_counters(url: str) -> dict[str, float]:
    """vLLM's preemptions and finished requests on one replica (its own ``/metrics``)."""
    wanted = {"vllm:num_preemptions_total": "preemptions", "vllm:request_success_total": "finished"}
    counters = dict.fromkeys(wanted.values(), 0.0)
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            counters[wanted[name]] += float(line.rsplit(" ", 1)[1])
    return counters


def summarize(results: Sequence[dict[str, Any]], before: Sequence[dict[str, float]],
              after: Sequence[dict[str, float]]) -> dict[str, Any]:
    """One variant's numbers (see the module docstring)."""
    served = [r for r in results if "error" not in r]
    span_s = (max(r["finished_s"] for r in served) - min(r["started_s"] for r in served)) if served else 0.0
    correct = sum(1 for r in results if r.get("correct"))
    retrieval = [r for r in results if r.get("family") != "reasoning"]
    return {
        "requests": len(results), "errors": len(results) - len(served),
        "preemptions": sum(a["preemptions"] - b["preemptions"] for a, b in zip(after, before, strict=True)),
        "finished_per_replica": [a["finished"] - b["finished"] for a, b in zip(after, before, strict=True)],
        "ttft_p99_s": percentile([r["ttft_s"] for r in served if r.get("ttft_s") is not None], 0.99),
        "itl_p99_s": percentile([gap for r in served for gap in r["gaps_s"]], 0.99),
        "correct": correct, "retrieval_correct": sum(1 for r in retrieval if r.get("correct")),
        "retrieval": len(retrieval), "span_s": span_s,
        "correct_per_s": correct / span_s if span_s > 0 else 0.0,
        **reported(served, span_s),
    }


def reported(served: Sequence[dict[str, Any]], span_s: float) -> dict[str, Any]:
    """The numbers beside the target's (:data:`REPORTED`): a question's whole answer as its asker
    waits for it (p99; the span, and so correct answers per second, is the longest generation's),
    and every streamed token per second of the span."""
    questions = [r["finished_s"] - r["started_s"] for r in served if r.get("family") != "reasoning"]
    return {"answer_p99_s": percentile(questions, 0.99),
            "tokens_per_s": sum(r["tokens"] for r in served) / span_s if span_s > 0 else 0.0}


def refresh(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with :data:`REPORTED` computed again from every round's recorded requests, and the
    medians and verdict taken again: a report written before a number was added gains it."""
    variants = {}
    for name, variant in report["variants"].items():
        rounds = [{**r, **reported([x for x in r["results"] if "error" not in x], r["span_s"])}
                  for r in variant["rounds"]]
        variants[name] = {**variant, **medians(rounds), "rounds": rounds}
    return {**report, "variants": variants, "verdict": verdict(variants)}


def variant_spec(name: str, settings: FleetBenchSettings, model_dir: str) -> FleetSpec:
    """The fleet one variant runs: its router policy and replica mode, the rest the same for all."""
    policy, mode = VARIANTS[name]
    return fleet_spec(replicas=2, port=settings.port, router_port=settings.router_port,
                      metrics_port=settings.metrics_port, mode=mode, kv_blocks=list(settings.kv_blocks),
                      policy=policy, model=model_dir, base_pages=settings.base_pages,
                      max_model_len=settings.max_model_len, max_num_seqs=settings.max_num_seqs,
                      served_model_name=MODEL_NAME, load_poll_s=1, cpu_binds=settings.cpu_binds)


def run_variant(name: str, settings: FleetBenchSettings, model_dir: str, log_dir: Path) -> dict[str, Any]:
    """Start the variant's fleet, send the trace through its router, stop it."""
    policy, mode = VARIANTS[name]
    spec = variant_spec(name, settings, model_dir)
    with Fleet(spec, log_dir / name) as fleet:
        fleet.start(startup_timeout_s=900)
        urls = [replica.url for replica in spec.replicas]
        before = [vllm_counters(url) for url in urls]
        results = run_trace(spec.router_url, skewed_trace(settings), settings.arrival_gap_s)
        after = [vllm_counters(url) for url in urls]
    return {"policy": policy, "replica_mode": mode, **summarize(results, before, after), "results": results}


COMPARED = ("preemptions", "ttft_p99_s", "itl_p99_s", "correct", "correct_per_s")
REPORTED = ("answer_p99_s", "tokens_per_s")  # beside the target's numbers, not read by the verdict
BASELINES = ("round_robin", "power_of_two_vllm", "growpage_monitor")  # growpage_monitor: the routing alone


def run_fleet_bench(settings: FleetBenchSettings, model_dir: str, log_dir: Path,
                    log: Callable[[str], None] = print) -> dict[str, Any]:
    """``repeats`` interleaved rounds of every variant of ``settings``; returns the settings, each
    variant's rounds and medians, and the verdict."""
    host = host_facts()  # at the start: the commit whose code the replicas run
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in settings.variants}
    for repeat in range(settings.repeats):
        for name in round_order(settings.variants, repeat):
            log(f"fleet bench: round {repeat + 1}/{settings.repeats}, {name} ({VARIANTS[name][0]}, "
                f"replicas {VARIANTS[name][1]})")
            result = run_variant(name, settings, model_dir, log_dir / f"round{repeat + 1}")
            rounds[name].append(result)
            log(f"fleet bench: {name}: {json.dumps({k: v for k, v in result.items() if k != 'results'})}")
    variants = {name: {"policy": VARIANTS[name][0], "replica_mode": VARIANTS[name][1],
                       **medians(results), "rounds": results} for name, results in rounds.items()}
    return {"benchmark": "fleet", **setup_record(settings, model_dir), "host": host,
            "settings": dataclasses.asdict(settings), "variants": variants, "verdict": verdict(variants)}


def setup_record(settings: FleetBenchSettings, model_dir: str) -> dict[str, Any]:
    """What ran: the versions, each variant's replica commands, and the GrowPage settings its replicas
    resolve (the shipped defaults at the CPU build's block size, ``base_pages`` where set)."""
    # deferred: the plugin's settings import torch, vLLM takes seconds; read once the rounds are done
    import importlib.metadata

    import vllm

    from growpage import __version__
    from growpage.tooling.serve import CPU_BLOCK_SIZE
    from growpage.vllm_plugin.settings import resolved_settings

    commands: dict[str, list[dict[str, Any]]] = {}
    for name in settings.variants:
        spec = variant_spec(name, settings, model_dir)
        commands[name] = [{"mode": replica.mode, "kv_blocks": replica.kv_blocks,
                           "argv": replica_command(spec, replica)[0]} for replica in spec.replicas]
    modes = sorted({VARIANTS[name][1] for name in settings.variants} - {"vllm"})
    floor = {"base_pages": settings.base_pages} if settings.base_pages is not None else {}
    try:
        router = importlib.metadata.version("vllm-router")
    except importlib.metadata.PackageNotFoundError:
        router = ""
    return {"growpage_version": __version__, "vllm_version": vllm.__version__, "router_version": router,
            "model_dir": model_dir, "replica_commands": commands,
            "resolved_growpage": {mode: resolved_settings({"mode": mode, **floor}, CPU_BLOCK_SIZE) for mode in modes}}


def medians(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each compared number's median over the rounds, with its range (None where no round had one)."""
    summary: dict[str, Any] = {"requests": rounds[0]["requests"], "retrieval": rounds[0]["retrieval"]}
    for key in (*COMPARED, *REPORTED, "errors", "retrieval_correct", "span_s"):
        values = [r[key] for r in rounds if r.get(key) is not None]
        summary[key] = statistics.median(values) if values else None
        summary[f"{key}_range"] = [min(values), max(values)] if values else None
    summary["finished_per_replica"] = [statistics.median(r["finished_per_replica"][i] for r in rounds)
                                       for i in range(len(rounds[0]["finished_per_replica"]))]
    return summary


def verdict(variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """GrowPage's medians against each baseline's: lower preemptions and p99s, at least the accuracy."""
    if "growpage" not in variants:
        return {}
    ours = variants["growpage"]
    against = {name: {"fewer_preemptions": _better(ours, variants[name], "preemptions"),
                      "lower_ttft_p99": _better(ours, variants[name], "ttft_p99_s"),
                      "lower_itl_p99": _better(ours, variants[name], "itl_p99_s"),
                      "accuracy_at_least": _better(ours, variants[name], "correct", lower=False)}
               for name in BASELINES if name in variants}
    return {"against": against, "target_met": bool(against) and all(
        value is True for checks in against.values() for value in checks.values())}


def _better(ours: dict[str, Any], theirs: dict[str, Any], key: str, lower: bool = True) -> bool | None:
    """Ours strictly lower (or, with ``lower`` False, at least as high); None where one has no value."""
    if ours[key] is None or theirs[key] is None:
        return None
    return bool(ours[key] < theirs[key] if lower else ours[key] >= theirs[key])


def _cell(value: float | None, value_range: list[float] | None, scale: float = 1.0, digits: int = 2) -> str:
    if value is None:
        return "-"
    text = f"{value * scale:.{digits}f}"
    if value_range and value_range[0] != value_range[1]:
        text += f" [{value_range[0] * scale:.{digits}f}-{value_range[1] * scale:.{digits}f}]"
    return text


def table(report: dict[str, Any]) -> str:
    """The variants side by side, one line each: medians of the rounds with their range."""
    lines = [f"{'variant':<18} {'preempt':>9} {'TTFT p99 s':>17} {'ITL p99 ms':>15} {'correct':>9} "
             f"{'corr/s':>19} {'answer p99 s':>17} {'tokens/s':>17} {'A/B finished':>12}"]
    for name, v in report["variants"].items():
        finished = "/".join(f"{n:g}" for n in v["finished_per_replica"])
        lines.append(f"{name:<18} {_cell(v['preemptions'], v['preemptions_range'], digits=0):>9} "
                     f"{_cell(v['ttft_p99_s'], v['ttft_p99_s_range']):>17} "
                     f"{_cell(v['itl_p99_s'], v['itl_p99_s_range'], 1000, 0):>15} "
                     f"{_cell(v['correct'], None, digits=0):>4}/{v['requests']:<4} "
                     f"{_cell(v['correct_per_s'], v['correct_per_s_range'], digits=3):>19} "
                     f"{_cell(v.get('answer_p99_s'), v.get('answer_p99_s_range')):>17} "
                     f"{_cell(v.get('tokens_per_s'), v.get('tokens_per_s_range'), digits=1):>17} {finished:>12}")
    return "\n".join(lines)
