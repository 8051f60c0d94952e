"""``gpctl bench serving``: throughput vs latency under a fixed page pool, continuous batching.

A mixed trace (long step-by-step answers and short summaries) arrives as a Poisson process, fast
enough to keep the engine saturated, into one engine per (method, pool size). Every request is
greedy with ``ignore_eos`` and a fixed ``max_tokens``, so every method computes exactly the same
number of output tokens and tokens/s compares like with like. Per run: output tokens/s over the
makespan, inter-token latency p50/p99 (every gap between a request's consecutive tokens, so a
preemption's recompute stall counts), queueing delay (arrival to first scheduled), preemptions,
peak running requests, and pages held per request.

Pool sizes are fractions of the trace's *full-KV demand* (the pages every request needs at its
last token, summed), so the point where full KV starts preempting is visible on the pool axis.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence

from growpage.bench import harness
from growpage.bench.fidelity import forced_nll_increase, greedy_references
from growpage.bench.goodput import round_order
from growpage.bench.tasks import is_correct, with_truth
from growpage.bench.tasks import retrieval_tasks as generate
from growpage.bench.workloads import (
    Arrival,
    Task,
    final_answer,
    has_final_answer,
    poisson_trace,
    reasoning_tasks,
    summary_tasks,
)
from growpage.config import DEFAULT_ATTENTION_COVERAGE
from growpage.core.methods import build_method
from growpage.core.quantiles import percentile, spread
from growpage.engine.engine import LLMEngine
from growpage.engine.request import Request
from growpage.engine.sampling import SamplingParams


@dataclasses.dataclass(frozen=True)
class ServingSettings:
    methods: tuple[str, ...] = ("full_kv", "growpage", "growpage_reserving", "h2o", "zipage")
    pool_fractions: tuple[float, ...] = (0.15, 0.3, 0.6)
    # When set, pools fit about this many full-KV requests each (the trace's mean full-KV pages per
    # request times k) instead of ``pool_fractions`` of the whole trace's demand.
    pool_requests: tuple[float, ...] = ()
    reasoning: int = 6
    reasoning_max_tokens: int = 128
    summaries: int = 3
    summary_max_tokens: int = 32
    rate_per_s: float = 4.0
    base_pages: int = 8
    block_size: int = 16
    max_num_seqs: int = 32
    seed: int = 0
    threads: int | None = None
    # a GrowPage config file whose thresholds (gpctl calibrate's output) replace the published ones
    thresholds_file: str | None = None
    # retrieval tasks with true answers (growpage.bench.tasks, headlined families) mixed into the trace
    retrieval: int = 0
    # also force every method through full KV's continuation at every pool: the NLL increase
    fidelity: bool = False
    # GrowPage's floor follows this share of each request's observed attention (as inside vLLM)
    attention_coverage: float = DEFAULT_ATTENTION_COVERAGE
    # interleaved rounds of every method at each pool (> 1: after one discarded warm-up run); the
    # timed numbers and the answers are medians, every round kept
    repeats: int = 1

    @classmethod
    def quick(cls) -> ServingSettings:
        return cls(methods=("full_kv", "growpage", "growpage_reserving"), pool_fractions=(0.25, 1.0), reasoning=4,
                   reasoning_max_tokens=64, summaries=2, summary_max_tokens=16)

    def tasks(self) -> list[Task]:
        return (reasoning_tasks(self.reasoning, self.reasoning_max_tokens, self.seed)
                + summary_tasks(self.summaries, self.summary_max_tokens) + self._retrieval_tasks())

    def _retrieval_tasks(self) -> list[Task]:
        tasks = generate(self.seed, families=("code", "multikey", "passkey"), context_tokens=(512, 1024))
        return [Task(t.task_id, "retrieval", t.prompt, t.max_tokens, expected=t.answer) for t in tasks[:self.retrieval]]


def full_kv_demand_pages(prompt_lengths: list[int], max_tokens: list[int], block_size: int) -> int:
    """Pages full KV needs to hold every request at its last token at once."""
    return sum(math.ceil((p + m) / block_size) for p, m in zip(prompt_lengths, max_tokens, strict=True))


def _add_answer_agreement(runs: list[dict]) -> None:
    """Each run's final answers against full KV's at the same pool (the tasks that have one)."""
    reference = {run["pool_pages"]: run["final_answers"] for run in runs if run["method"] == "full_kv"}
    for run in runs:
        theirs = reference.get(run["pool_pages"])
        if theirs is None or not theirs:
            run["answer_agreement"] = None
            continue
        same = sum(run["final_answers"].get(task) == answer for task, answer in theirs.items())
        run["answer_agreement"] = round(same / len(theirs), 3)


def _serve(loaded: harness.Loaded, method: str, num_pages: int, arrivals: list[Arrival], prompts: dict[str, list[int]],
           settings: ServingSettings, tasks: list[Task]) -> dict:
    engine, _ = harness.build_engine(loaded, method, base_pages=settings.base_pages, num_pages=num_pages,
                                     block_size=settings.block_size, max_num_seqs=settings.max_num_seqs,
                                     max_num_batched_tokens=512, seed=settings.seed,
                                     thresholds=harness.thresholds_from(settings.thresholds_file),
                                     attention_coverage=settings.attention_coverage)
    pending = list(arrivals)
    requests = {}
    peak_running = 0
    pages_peak: dict[str, int] = {}
    started = time.monotonic()
    while pending or engine.has_unfinished_requests():
        now = time.monotonic()
        while pending and started + pending[0].offset_s <= now:
            arrival = pending.pop(0)
            params = SamplingParams(max_tokens=arrival.task.max_tokens, temperature=0.0, ignore_eos=True)
            rid = engine.add_request(prompts[arrival.task.task_id], params, request_id=arrival.task.task_id)
            engine.requests[rid].arrival_s = started + arrival.offset_s
            requests[rid] = engine.requests[rid]
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, started + pending[0].offset_s - time.monotonic()))
            continue
        engine.step()
        peak_running = max(peak_running, len(engine.scheduler.running))
        for rid, held in engine.manager.requests.items():
            pages_peak[rid] = max(pages_peak.get(rid, 0), held.pages_held)
    makespan = time.monotonic() - started
    gaps = [b - a for r in requests.values() for a, b in zip(r.token_times_s, r.token_times_s[1:], strict=False)]
    queueing = [r.first_scheduled_s - r.arrival_s for r in requests.values() if r.first_scheduled_s]
    tokens = sum(len(r.output_token_ids) for r in requests.values())
    truncated = sum(len(r.output_token_ids) < r.params.max_tokens for r in requests.values())
    snapshot = engine.manager.make_stats()
    ms = 1000.0
    return {
        "method": method, "pool_pages": num_pages,
        "tokens_per_s": round(tokens / makespan, 3),
        "output_tokens": tokens, "makespan_s": round(makespan, 2),
        "itl_p50_ms": _rounded_percentile(gaps, 0.5, 1, scale=ms),
        "itl_p99_ms": _rounded_percentile(gaps, 0.99, 1, scale=ms),
        "queueing_p50_s": _rounded_percentile(queueing, 0.5, 3),
        "queueing_p99_s": _rounded_percentile(queueing, 0.99, 3),
        "preemptions": engine.scheduler.num_preemptions,
        "peak_running": peak_running,
        "pages_peak_per_request_max": max(pages_peak.values(), default=0),
        "pages_peak_per_request_median": statistics.median(pages_peak.values()) if pages_peak else 0,
        "requests_truncated": truncated,
        "decisions": harness.decision_counts(snapshot),
        "steps": engine.num_steps,
        # what a user reads off each answer (reasoning tasks), compared with full KV's afterwards
        "final_answers": {t.task_id: final_answer(t.kind, _answer_text(loaded, engine, requests[t.task_id]))
                          for t in tasks if has_final_answer(t.kind) and t.task_id in requests},
        **_truth_scores(loaded, engine, requests, tasks, makespan),
    }


def _truth_scores(loaded: harness.Loaded, engine: LLMEngine, requests: dict[str, Request], tasks: list[Task],
                  makespan_s: float) -> dict:
    """Accuracy against the true answers, per kind (reasoning apart), and correct answers per second."""
    correct: dict[str, list[bool]] = {}
    for task in tasks:
        truth = with_truth(task)
        if truth is not None and task.task_id in requests:
            text = _answer_text(loaded, engine, requests[task.task_id])
            correct.setdefault(task.kind, []).append(is_correct(truth, text))
    return {"accuracy": {kind: round(sum(values) / len(values), 4) for kind, values in correct.items()},
            "correct_per_s": {kind: round(sum(values) / makespan_s, 4) for kind, values in correct.items()}}


def _add_fidelity(loaded: harness.Loaded, runs: list[dict], tasks: list[Task], prompts: dict[str, list[int]],
                  settings: ServingSettings, progress: Callable[[str], None]) -> None:
    """Each run's NLL increase: its method at its pool, forced through full KV's continuation."""
    ids = {t.task_id: prompts[t.task_id] for t in tasks}
    progress("fidelity: full KV's continuation, then every method forced through it")
    references = greedy_references(loaded, ids, {t.task_id: t.max_tokens for t in tasks},
                                   block_size=settings.block_size, seed=settings.seed)
    ample = sum(len(p) + len(references[k]) for k, p in ids.items()) // settings.block_size + 2 * len(ids)
    def forced(method: str, num_pages: int, reference: dict[str, list[float]] | None) -> tuple[dict, dict]:
        return forced_nll_increase(loaded, method, base_pages=settings.base_pages, num_pages=num_pages,
                                   block_size=settings.block_size, prompts=ids, references=references,
                                   reference_logprobs=reference, seed=settings.seed,
                                   thresholds_file=settings.thresholds_file,
                                   attention_coverage=settings.attention_coverage)

    _, reference = forced("full_kv", ample, None)
    for run in runs:
        increase, _ = forced(run["method"], run["pool_pages"], reference)
        run["nll_increase"] = increase["mean"]


def _answer_text(loaded: harness.Loaded, engine: LLMEngine, request: Request) -> str:
    """The text a user would have received: up to the first end-of-sequence token. The trace runs
    with ``ignore_eos`` so every method does the same work; what the model writes after its own
    end of answer is not an answer."""
    token_ids = list(request.output_token_ids)
    ends = [i for i, token in enumerate(token_ids) if token in engine.eos_token_ids]
    if ends:
        token_ids = token_ids[:ends[0]]
    return loaded.tokenizer.decode(token_ids, skip_special_tokens=True)


def run_serving_bench(model_dir: str, settings: ServingSettings,
                      progress: Callable[[str], None] = lambda _message: None,
                      loaded: harness.Loaded | None = None) -> dict:
    """Every method at every pool size on the same trace; returns a JSON-ready dict."""
    loaded, tasks, prompts = harness.prepare(model_dir, settings, loaded)
    arrivals = poisson_trace(tasks, settings.rate_per_s, settings.seed)
    demand = full_kv_demand_pages([len(prompts[t.task_id]) for t in tasks], [t.max_tokens for t in tasks],
                                  settings.block_size)
    largest = max(math.ceil((len(prompts[t.task_id]) + t.max_tokens + 1) / settings.block_size) for t in tasks)
    # Every pool must fit the largest request alone at full KV and a GrowPage grant, or runs
    # would finish requests early instead of measuring them.
    floor = max(largest, settings.base_pages) + 1
    sizes = ([k * demand / len(tasks) for k in settings.pool_requests] if settings.pool_requests
             else [f * demand for f in settings.pool_fractions])
    pools = sorted({max(floor, round(size)) for size in sizes})
    runs = []
    for pool in pools:
        for rounds in _rounds(loaded, pool, arrivals, prompts, settings, tasks, progress).values():
            run = median_run(rounds)
            run["pool_fraction_of_demand"] = round(pool / demand, 3)
            run["pool_full_kv_requests"] = round(pool * len(tasks) / demand, 2)
            runs.append(run)
    _add_answer_agreement(runs)
    if settings.fidelity:
        _add_fidelity(loaded, runs, tasks, prompts, settings, progress)
    return {
        "benchmark": "serving",
        "settings": dataclasses.asdict(settings),
        "thresholds": harness.thresholds_from(settings.thresholds_file) or "published defaults",
        "full_kv_demand_pages": demand,
        "pools": pools,
        "arrivals": [{"task": a.task.task_id, "offset_s": a.offset_s, "max_tokens": a.task.max_tokens,
                      "prompt_tokens": len(prompts[a.task.task_id])} for a in arrivals],
        "runs": runs,
        "verdict": verdict(runs),
        "verdicts": {m: verdict(runs, m) for m in settings.methods
                     if m != "full_kv" and build_method(m).family == "growpage"},
    }


def _rounds(loaded: harness.Loaded, pool: int, arrivals: list[Arrival], prompts: dict[str, list[int]],
            settings: ServingSettings, tasks: list[Task], progress: Callable[[str], None]) -> dict[str, list[dict]]:
    """``settings.repeats`` interleaved rounds of every method at one pool (the order reverses each
    round); with more than one, a first run of the first method is discarded (warm-up)."""
    if settings.repeats > 1:
        progress(f"warm-up (discarded): {settings.methods[0]} with a {pool}-page pool")
        _serve(loaded, settings.methods[0], pool, arrivals, prompts, settings, tasks)
    rounds: dict[str, list[dict]] = {method: [] for method in settings.methods}
    for repeat in range(settings.repeats):
        for method in round_order(settings.methods, repeat):
            progress(f"{method} with a {pool}-page pool, round {repeat + 1}/{settings.repeats}")
            rounds[method].append(_serve(loaded, method, pool, arrivals, prompts, settings, tasks))
    return rounds


# what varies between rounds (wall time decides when requests arrive against the engine's progress)
_ROUND_NUMBERS = ("tokens_per_s", "makespan_s", "itl_p50_ms", "itl_p99_ms", "queueing_p50_s", "queueing_p99_s",
                  "preemptions", "peak_running")


def median_run(rounds: Sequence[dict]) -> dict:
    """One method's rounds as one run: each number of :data:`_ROUND_NUMBERS`, the accuracy and the
    correct answers per second per kind are medians (``rounds`` holds each round's, and the
    spread); the first round's answers and decisions stand for the rest."""
    run = dict(rounds[0])
    if len(rounds) == 1:
        return run
    for key in _ROUND_NUMBERS:
        values = [r[key] for r in rounds if r.get(key) is not None]
        run[key] = statistics.median(values) if values else None
    for key in ("accuracy", "correct_per_s"):
        run[key] = {kind: statistics.median(r[key][kind] for r in rounds) for kind in rounds[0][key]}
    run["rounds"] = {key: spread([r[key] for r in rounds if r.get(key) is not None])
                     for key in _ROUND_NUMBERS if any(r.get(key) is not None for r in rounds)}
    run["rounds"].update({f"{key}_{kind}": spread([r[key][kind] for r in rounds], 4)
                          for key in ("accuracy", "correct_per_s") for kind in rounds[0][key]})
    run["rounds"]["decisions"] = [r["decisions"] for r in rounds]
    return run


def _rounded_percentile(values: Sequence[float], fraction: float, digits: int, scale: float = 1.0) -> float | None:
    """A reported percentile, or None (JSON null) for a run that produced no samples of it."""
    value = percentile(values, fraction)
    return None if value is None else round(value * scale, digits)


def verdict(runs: list[dict], method: str = "growpage", baseline: str = "full_kv") -> dict:
    """The serving target, read off the runs: at the largest pool where full KV preempts (the
    pressure GrowPage exists for), its tokens/s ratio (the target is 2x) and whether its p99 ITL
    is no worse."""
    by_pool: dict[int, dict[str, dict]] = {}
    for run in runs:
        by_pool.setdefault(run["pool_pages"], {})[run["method"]] = run
    preempting = [pool for pool, methods in by_pool.items()
                  if baseline in methods and method in methods and methods[baseline]["preemptions"] > 0]
    if not preempting:
        return {"pool_pages": None, "note": f"{baseline} never preempted at these pool sizes"}
    pool = max(preempting)
    ours, theirs = by_pool[pool][method], by_pool[pool][baseline]
    ratio = ours["tokens_per_s"] / theirs["tokens_per_s"] if theirs["tokens_per_s"] else None
    return {
        "pool_pages": pool,
        "tokens_per_s_ratio": round(ratio, 3) if ratio else None,
        "itl_p99_ms": {method: ours["itl_p99_ms"], baseline: theirs["itl_p99_ms"]},
        "meets_2x_throughput": bool(ratio and ratio >= 2.0),
        "itl_p99_no_worse": (None if ours["itl_p99_ms"] is None or theirs["itl_p99_ms"] is None
                             else ours["itl_p99_ms"] <= theirs["itl_p99_ms"]),
    }
