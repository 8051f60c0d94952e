"""``gpctl bench quality``: quality vs KV bytes, every method at every budget, side by side.

1. Reference: full KV, greedy, on every task; retrieval tasks full KV fails are dropped (a
   benchmark of what compression loses needs something to lose). A teacher-forced full-KV pass
   gives the reference NLL.
2. Every other method at every budget (``base_pages``), in one engine per (method, budget): each
   task runs twice in one batch,
   free greedy (agreement, final answer) and teacher-forced on the reference output (NLL, and the
   exact step of first divergence). The pool is either large enough that no request ever waits
   for a page (``pool="ample"``: quality when memory is free), or the budget's worth of pages per
   request plus room for the longest prompt (``pool="budget"``: every method gets the same
   memory; fixed budgets cap each request, GrowPage shares the pool and compresses under pressure).
3. Per request, KV bytes held (used + reserved pages x page bytes) sampled after every step: mean
   over its life and peak, exact.

The throttle reads a step clock (``StepClock``), so every number here is deterministic for a given
machine-independent set of inputs; timing lives in ``serving``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable

from growpage.bench import harness
from growpage.bench.tasks import is_correct, with_truth
from growpage.bench.workloads import (
    Task,
    final_answer,
    has_final_answer,
    reasoning_tasks,
    retrieval_tasks,
    summary_tasks,
)
from growpage.core.methods import METHOD_NAMES, build_method
from growpage.core.stats import AdmitEvent, DecisionEvent, FinishEvent
from growpage.engine.request import Request
from growpage.engine.sampling import SamplingParams

BUDGET_FREE = ("full_kv", "uniform_int8", "uniform_int4")  # no per-request cap: one run each


@dataclasses.dataclass(frozen=True)
class QualitySettings:
    methods: tuple[str, ...] = METHOD_NAMES
    budgets: tuple[int, ...] = (6, 12)  # base_pages: the cap of fixed-budget methods, GrowPage's grant
    reasoning: int = 4
    reasoning_max_tokens: int = 160
    retrieval_context_tokens: tuple[int, ...] = (512, 1024)
    retrieval_depths: tuple[float, ...] = (0.5,)
    retrieval_max_tokens: int = 16
    summaries: int = 2
    summary_max_tokens: int = 32
    block_size: int = 16
    seconds_per_step: float = 0.25  # the step clock the growth throttle reads
    seed: int = 0
    timeline_task: str = "reasoning-0"
    threads: int | None = None
    pool: str = "ample"  # or "budget" (see the module docstring)
    # a GrowPage config file whose thresholds (gpctl calibrate's output) replace the published ones
    thresholds_file: str | None = None

    def __post_init__(self) -> None:
        harness.check_pool(self.pool)

    @classmethod
    def quick(cls) -> QualitySettings:
        return cls(methods=("full_kv", "streaming_llm", "h2o", "zipage", "uniform_int8", "growpage"),
                   budgets=(6,), reasoning=2, reasoning_max_tokens=96, retrieval_context_tokens=(512,),
                   retrieval_depths=(0.5,), summaries=1, summary_max_tokens=16)

    def tasks(self) -> list[Task]:
        return (reasoning_tasks(self.reasoning, self.reasoning_max_tokens, self.seed)
                + retrieval_tasks(self.retrieval_context_tokens, self.retrieval_depths,
                                  self.retrieval_max_tokens, self.seed)
                + summary_tasks(self.summaries, self.summary_max_tokens))


@dataclasses.dataclass
class _Run:
    """One engine run over a task list: per task, the free and/or teacher-forced request."""

    free: dict[str, Request]
    forced: dict[str, Request]
    bytes_trace: dict[str, list[int]]
    bytes_peak: dict[str, int]
    decisions: dict[str, int]
    wall_s: float
    timeline: dict | None


class _TimelineListener:
    def __init__(self, request_id: str, clock: harness.StepClock):
        self.request_id = request_id
        self.clock = clock
        self.events: list[dict] = []

    def on_admit(self, event: AdmitEvent) -> None:
        pass

    def on_finish(self, event: FinishEvent) -> None:
        pass

    def on_decision(self, event: DecisionEvent) -> None:
        if event.request_id == self.request_id:
            # The step being computed is the one the next signal sample is recorded after.
            self.events.append({"step": self.clock.steps + 1, "kind": event.kind, "reason": event.reason,
                                "refusal": event.refusal, "pages_before": event.pages_before,
                                "pages_after": event.pages_after, "sts_density": event.sts_density,
                                "lts_entropy": event.lts_entropy,
                                "capacity_boundary_pages": event.capacity_boundary_pages})


def _run(loaded: harness.Loaded, method: str, budget: int, tasks: list[Task], prompts: dict[str, list[int]],
         settings: QualitySettings, *, references: dict[str, list[int]] | None, free: bool,
         timeline_task: str | None = None) -> _Run:
    longest = max(len(prompts[t.task_id]) + t.max_tokens for t in tasks)
    sequences = len(tasks) * (2 if free and references else 1)
    if settings.pool == "budget" and method != "full_kv":
        # equal memory for every method: the budget per sequence, plus room to prefill the longest
        num_pages = sequences * budget + math.ceil(longest / settings.block_size) + 2
    else:
        num_pages = sequences * (math.ceil(longest / settings.block_size) + budget + 2)
    clock = harness.StepClock(settings.seconds_per_step)
    engine, _ = harness.build_engine(loaded, method, base_pages=budget, num_pages=num_pages,
                                     block_size=settings.block_size, max_num_seqs=sequences,
                                     clock=clock, seed=settings.seed,
                                     thresholds=harness.thresholds_from(settings.thresholds_file))
    page_bytes = settings.block_size * harness.kv_bytes_per_token(loaded)
    free_requests, forced_requests = {}, {}
    for task in tasks:
        params = SamplingParams(max_tokens=task.max_tokens, temperature=0.0)
        if free:
            rid = engine.add_request(prompts[task.task_id], params, request_id=f"free/{task.task_id}")
            free_requests[task.task_id] = engine.requests[rid]
        if references is not None:
            reference = references[task.task_id]
            rid = engine.add_request(prompts[task.task_id], SamplingParams(max_tokens=len(reference), temperature=0.0),
                                     request_id=f"forced/{task.task_id}", teacher_token_ids=reference)
            forced_requests[task.task_id] = engine.requests[rid]
    listener = _TimelineListener(f"free/{timeline_task}", clock) if timeline_task else None
    if listener:
        engine.manager.stats.add_listener(listener)
    signals: list[dict] = []
    bytes_trace: dict[str, list[int]] = {t.task_id: [] for t in tasks}
    bytes_peak: dict[str, int] = {t.task_id: 0 for t in tasks}
    started = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        clock.tick()
        manager = engine.manager
        for task in tasks:
            held = manager.requests.get(f"{'free' if free else 'forced'}/{task.task_id}")
            if held is not None:
                bytes_trace[task.task_id].append(held.pages_held * page_bytes)
                bytes_peak[task.task_id] = max(bytes_peak[task.task_id], held.peak_pages_held * page_bytes)
        if listener and listener.request_id in manager.requests:
            held = manager.requests[listener.request_id]
            reading = manager.summaries.read([held.summary_row])[0]
            signals.append({"step": clock.steps, "tokens": held.logical_length, "pages_held": held.pages_held,
                            "sts_density": reading.sts_density, "lts_entropy": reading.lts_entropy})
    wall_s = time.perf_counter() - started
    snapshot = engine.manager.make_stats()
    decisions = harness.decision_counts(snapshot)
    timeline = None
    if listener:
        timeline = {"task": timeline_task, "method": method, "budget_pages": budget, "signals": signals,
                    "decisions": listener.events}
    return _Run(free_requests, forced_requests, bytes_trace, bytes_peak, decisions, wall_s, timeline)


def _prefix_agreement(output: list[int], reference: list[int]) -> int:
    for index, (a, b) in enumerate(zip(output, reference, strict=False)):
        if a != b:
            return index
    return min(len(output), len(reference))


def _mean_nll(logprobs: list[float]) -> float:
    return -sum(logprobs) / len(logprobs) if logprobs else 0.0


def _task_row(task: Task, run: _Run, reference: Request, reference_nll: float) -> dict:
    row: dict = {"task": task.task_id, "kind": task.kind}
    trace = run.bytes_trace[task.task_id]
    if task.task_id in run.free:
        request = run.free[task.task_id]
        agreed = _prefix_agreement(request.output_token_ids, reference.output_token_ids)
        row.update(tokens=len(request.output_token_ids), agree_prefix_tokens=agreed,
                   agree_prefix_fraction=round(agreed / max(len(reference.output_token_ids), 1), 4))
        if has_final_answer(task.kind):
            answer = final_answer(task.kind, request.output_text)
            row.update(answer=answer,
                       answer_agrees=answer == final_answer(task.kind, reference.output_text))
        truth = with_truth(task)
        if truth is not None:  # scored against the true answer, not full KV's
            row.update(correct=is_correct(truth, request.output_text))
    if task.task_id in run.forced:
        forced = run.forced[task.task_id]
        matches = forced.teacher_greedy_matches
        first_miss = matches.index(False) if False in matches else len(matches)
        row.update(nll=round(_mean_nll(forced.teacher_logprobs), 5),
                   nll_delta=round(_mean_nll(forced.teacher_logprobs) - reference_nll, 5),
                   teacher_forced_first_divergence=first_miss)
    row.update(kv_bytes_mean=round(statistics.fmean(trace)) if trace else 0,
               kv_bytes_peak=run.bytes_peak[task.task_id])
    return row


def _summarize(method: str, budget: int | None, rows: list[dict], full_bytes_mean: float, run: _Run) -> dict:
    answerable = [r for r in rows if "answer_agrees" in r]
    bytes_mean = statistics.fmean(r["kv_bytes_mean"] for r in rows)
    return {
        "method": method, "budget_pages": budget,
        "answer_agreement": round(sum(r["answer_agrees"] for r in answerable) / len(answerable), 4)
        if answerable else None,
        "agree_prefix_fraction": round(statistics.fmean(r["agree_prefix_fraction"] for r in rows), 4),
        "agree_prefix_tokens": round(statistics.fmean(r["agree_prefix_tokens"] for r in rows), 1),
        "nll_delta": round(statistics.fmean(r["nll_delta"] for r in rows), 5),
        # against ground truth, reasoning apart; per second of the run (free and forced requests together)
        "accuracy": _accuracy(rows),
        "correct_per_s": round(sum(r.get("correct", False) for r in rows if r["kind"] == "retrieval")
                               / max(run.wall_s, 1e-9), 4),
        "kv_bytes_mean": round(bytes_mean),
        "kv_bytes_peak": max(r["kv_bytes_peak"] for r in rows),
        "kv_bytes_ratio_to_full": round(bytes_mean / full_bytes_mean, 4) if full_bytes_mean else None,
        "decisions": run.decisions,
        "wall_s": round(run.wall_s, 2),
        "tasks": rows,
    }


def _accuracy(rows: list[dict]) -> dict[str, float | None]:
    """Share of rows with a true answer that are correct, per kind (None: no such row)."""
    shares: dict[str, float | None] = {}
    for kind in ("retrieval", "reasoning"):
        scored = [r["correct"] for r in rows if r["kind"] == kind and "correct" in r]
        shares[kind] = round(sum(scored) / len(scored), 4) if scored else None
    return shares


def pareto_front(points: list[dict], x: str = "kv_bytes_mean", y: str = "answer_agreement") -> list[str]:
    """Labels of the points no other point beats on both fewer bytes and higher quality."""
    front = []
    for p in points:
        if p[y] is None:
            continue
        dominated = any(q is not p and q[y] is not None and q[x] <= p[x] and q[y] >= p[y]
                        and (q[x] < p[x] or q[y] > p[y]) for q in points)
        if not dominated:
            front.append(p["label"])
    return front


def _budgets_of(method: str, settings: QualitySettings) -> tuple[int, ...]:
    """The budgets a method runs at: none for full KV (it is the reference), the largest for
    budget-free methods, the tightest for ablations, every budget for the rest."""
    if method == "full_kv":
        return ()
    if method in BUDGET_FREE:
        return (max(settings.budgets),)
    if build_method(method).family == "ablation":
        return (min(settings.budgets),)
    return settings.budgets


def run_quality_bench(model_dir: str, settings: QualitySettings,
                      progress: Callable[[str], None] = lambda _message: None,
                      loaded: harness.Loaded | None = None,
                      checkpoint: Callable[[list[dict]], None] | None = None) -> dict:
    """Run every method at every budget; returns a JSON-ready dict (see module docstring).
    ``checkpoint`` gets the results so far after each (method, budget): a long run that is stopped
    keeps what it measured."""
    loaded, tasks, prompts = harness.prepare(model_dir, settings, loaded)
    budget0 = max(settings.budgets)

    progress("reference: full KV, greedy")
    reference_run = _run(loaded, "full_kv", budget0, tasks, prompts, settings, references=None, free=True)
    dropped = [t.task_id for t in tasks if t.kind == "retrieval"
               and final_answer("retrieval", reference_run.free[t.task_id].output_text) != t.expected]
    tasks = [t for t in tasks if t.task_id not in dropped]
    references = {t.task_id: reference_run.free[t.task_id].output_token_ids for t in tasks}
    progress("reference: full KV, teacher-forced")
    forced_reference = _run(loaded, "full_kv", budget0, tasks, prompts, settings, references=references, free=False)
    reference_nll = {t.task_id: _mean_nll(forced_reference.forced[t.task_id].teacher_logprobs) for t in tasks}
    reference = reference_run.free
    full_bytes = statistics.fmean(statistics.fmean(reference_run.bytes_trace[t.task_id]) for t in tasks)

    results = []
    full_rows = [_task_row(t, dataclasses.replace(reference_run, forced=forced_reference.forced), reference[t.task_id],
                           reference_nll[t.task_id]) for t in tasks]
    results.append(_summarize("full_kv", None, full_rows, full_bytes, reference_run))
    timeline = None
    for method in settings.methods:
        for budget in _budgets_of(method, settings):
            progress(f"{method} at {budget} pages")
            watch = settings.timeline_task if method == "growpage" and budget == min(settings.budgets) else None
            run = _run(loaded, method, budget, tasks, prompts, settings, references=references, free=True,
                       timeline_task=watch if watch in prompts else None)
            rows = [_task_row(t, run, reference[t.task_id], reference_nll[t.task_id]) for t in tasks]
            results.append(_summarize(method, None if method in BUDGET_FREE else budget, rows, full_bytes, run))
            timeline = timeline or run.timeline
            if checkpoint is not None:
                checkpoint(results)
    for point in results:
        point["label"] = point["method"] + (f"@{point['budget_pages']}" if point["budget_pages"] else "")
    front = pareto_front(results)
    for point in results:
        point["pareto"] = point["label"] in front
    return {
        "benchmark": "quality",
        "settings": dataclasses.asdict(settings),
        "thresholds": harness.thresholds_from(settings.thresholds_file) or "published defaults",
        "kv_bytes_per_token_fp16": harness.kv_bytes_per_token(loaded),
        "tasks": [{"task": t.task_id, "kind": t.kind, "prompt_tokens": len(prompts[t.task_id]),
                   "reference_tokens": len(references[t.task_id]),
                   "reference_answer": final_answer(t.kind, reference[t.task_id].output_text)} for t in tasks],
        "dropped_tasks": dropped,
        "results": results,
        "pareto_front": front,
        "timeline": timeline,
    }
