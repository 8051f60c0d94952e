"""Fidelity for decode-heavy work: how much a method's cache changes the model, token by token.

Greedy answers of a small model on long step-by-step work diverge at the first flipped token and
are rarely right either way, so agreement and accuracy say little there. Fidelity asks instead: given
full KV's own greedy continuation, how likely does the model find each of its tokens when it
attends through the method's cache? Every request is teacher-forced on full KV's continuation, so
every method sees the same tokens and positions; per token:

* **NLL** ``-log q(token)`` under the method, and its increase over full KV's own NLL; the mean
  increase over all tokens is the headline (nats per token; 0 for full KV);
* **KL(full KV || method)** where both distributions are at hand (the reference engine): over full
  KV's ``top_k`` tokens plus the rest of the vocabulary as one bucket. Merging outcomes never raises
  a KL divergence, so this is a lower bound of the full-vocabulary KL.

Homes:

* the reference engine (:func:`run_fidelity`): every ``growpage.core.methods`` method at every
  budget, under an equal-memory pool (each method gets ``budget`` pages per request plus room to
  prefill the longest prompt), full KV with room for everything;
* vLLM: :func:`forced_spec` turns a run's spec into forced decoding of given references
  (:mod:`growpage.tooling.forced_decoding`, vLLM's raw log-probabilities, so the NLL is of the unforced
  distribution); ``gpctl bench vllm`` reports the increase next to tokens/s.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from growpage.bench import harness
from growpage.bench.workloads import reasoning_tasks
from growpage.config import DEFAULT_ATTENTION_COVERAGE
from growpage.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from growpage.engine.engine import LLMEngine


@dataclasses.dataclass(frozen=True)
class FidelitySettings:
    """The reference-engine study (defaults: about 4 minutes on 2 CPU cores).

    Attributes:
        methods: methods compared with full KV (``growpage.core.methods`` names).
        budgets: pages per request: the fixed budgets' cap, GrowPage's floor.
        prompts: decode-heavy prompts (``workloads.reasoning_tasks`` of ``seed``).
        max_tokens: tokens of full KV's continuation each method is forced through.
        top_k: full KV's most likely tokens the KL keeps apart (the rest is one bucket).
        pool: ``budget`` (equal memory, as above) or ``ample`` (no request ever waits).
        attention_coverage: GrowPage's floor keeps this share of each request's observed attention
            (the default everywhere GrowPage runs; 0: the floor alone). The fixed caps ignore it.
    """

    methods: tuple[str, ...] = ("growpage", "streaming_llm", "h2o", "snapkv")
    budgets: tuple[int, ...] = (6,)
    prompts: int = 8
    max_tokens: int = 128
    seed: int = 0
    block_size: int = 16
    top_k: int = 32
    pool: str = "budget"
    threads: int | None = None
    thresholds_file: str | None = None
    attention_coverage: float = DEFAULT_ATTENTION_COVERAGE

    def __post_init__(self) -> None:
        harness.check_pool(self.pool)

    @classmethod
    def quick(cls) -> FidelitySettings:
        return cls(methods=("growpage", "streaming_llm"), prompts=3, max_tokens=48)

    def tasks(self) -> list[Any]:
        return reasoning_tasks(self.prompts, self.max_tokens, self.seed)


def nll_increase(reference: Mapping[str, Sequence[float]], candidate: Mapping[str, Sequence[float]]) -> dict:
    """Per-token NLL of ``candidate`` over ``reference`` (both: log-probabilities of the same forced
    tokens, by request id).

    Returns:
        ``mean`` (nats per token, every token weighted alike), ``per_request`` (each request's mean
        increase), their ``median`` and ``range``, ``reference_nll`` and ``tokens`` compared.

    Raises:
        ValueError: the two runs forced different numbers of tokens on a request.
    """
    deltas: list[float] = []
    per_request: dict[str, float] = {}
    reference_total = 0.0
    for request_id, expected in reference.items():
        observed = candidate[request_id]
        if len(observed) != len(expected):
            raise ValueError(f"request {request_id}: {len(observed)} forced tokens against the reference's "
                             f"{len(expected)}; both runs must be forced through the same continuation")
        request_deltas = [ref - got for ref, got in zip(expected, observed, strict=True)]
        deltas += request_deltas
        reference_total -= sum(expected)
        per_request[request_id] = round(statistics.fmean(request_deltas), 5) if request_deltas else 0.0
    values = list(per_request.values())
    return {"mean": round(statistics.fmean(deltas), 5) if deltas else 0.0, "per_request": per_request,
            "median": round(statistics.median(values), 5) if values else 0.0,
            "range": [min(values), max(values)] if values else [0.0, 0.0],
            "reference_nll": round(reference_total / max(len(deltas), 1), 5), "tokens": len(deltas)}


def coarse_kl(top_ids: torch.Tensor, top_logprobs: torch.Tensor, logprobs: torch.Tensor) -> float:
    """KL(p || q) over p's top tokens and one bucket for the rest of the vocabulary.

    Args:
        top_ids, top_logprobs: p's ``k`` most likely tokens and their log-probabilities, shape ``[k]``.
        logprobs: q's log-probabilities over the whole vocabulary, shape ``[vocab]``.
    """
    q_top = logprobs[top_ids].double()
    p_top = top_logprobs.double()
    head = float((p_top.exp() * (p_top - q_top)).sum())
    p_rest = max(1.0 - float(p_top.exp().sum()), 0.0)
    q_rest = max(1.0 - float(q_top.exp().sum()), 0.0)
    if p_rest <= 1e-12:
        return max(head, 0.0)
    return max(head + p_rest * (math.log(p_rest) - math.log(max(q_rest, 1e-30))), 0.0)


class _DistributionTap:
    """Reads the distribution at every forced step of an engine: full KV's top tokens (``record``)
    or the KL of this engine's distribution against recorded ones (``compare``).

    It wraps the engine's ``_teacher_force`` step, which receives the logits of every sampled row;
    the rows of forced requests are read before the forced token is appended.
    """

    def __init__(self, engine: LLMEngine, top_k: int, reference: dict[tuple[str, int], tuple[Any, Any]] | None):
        self.top_k = top_k
        self.reference = reference
        self.recorded: dict[tuple[str, int], tuple[Any, Any]] = {}
        self.kl: dict[str, list[float]] = {}
        original = engine._teacher_force

        def teacher_force(logits: torch.Tensor, chunks: list[Any], tokens: list[Any]) -> list[Any]:
            self._read(logits, chunks)
            return original(logits, chunks, tokens)

        setattr(engine, "_teacher_force", teacher_force)  # noqa: B010 (an instance hook, not a class patch)

    def _read(self, logits: torch.Tensor, chunks: list[Any]) -> None:
        for row, chunk in enumerate(chunks):
            request = chunk.request
            if request.teacher_token_ids is None:
                continue
            key = (request.request_id, len(request.output_token_ids))
            logprobs = torch.log_softmax(logits[row].float(), dim=-1)
            if self.reference is None:
                values, ids = logprobs.topk(self.top_k)
                self.recorded[key] = (ids, values)
            elif key in self.reference:
                ids, values = self.reference[key]
                self.kl.setdefault(request.request_id, []).append(coarse_kl(ids, values, logprobs))


@dataclasses.dataclass
class _Forced:
    logprobs: dict[str, list[float]]
    tap: _DistributionTap
    decisions: dict[str, int]
    preemptions: int
    wall_s: float


def _num_pages(settings: FidelitySettings, method: str, budget: int, lengths: list[int]) -> int:
    pages = [math.ceil(length / settings.block_size) for length in lengths]
    if settings.pool == "budget" and method != "full_kv":
        return len(lengths) * budget + max(pages) + 2
    return sum(pages) + len(lengths) * (budget + 2)


def _forced_run(loaded: harness.Loaded, method: str, budget: int, prompts: dict[str, list[int]],
                references: dict[str, list[int]], settings: FidelitySettings,
                reference_tap: _DistributionTap | None, num_pages: int | None = None) -> _Forced:
    lengths = [len(prompts[key]) + len(references[key]) for key in prompts]
    clock = harness.StepClock(0.25)
    engine, _ = harness.build_engine(loaded, method, base_pages=budget, block_size=settings.block_size,
                                     num_pages=num_pages or _num_pages(settings, method, budget, lengths),
                                     max_num_seqs=len(prompts), clock=clock, seed=settings.seed,
                                     thresholds=harness.thresholds_from(settings.thresholds_file),
                                     attention_coverage=settings.attention_coverage)
    return _force(engine, prompts, references, _DistributionTap(
        engine, settings.top_k, reference_tap.recorded if reference_tap else None), clock)


def _force(engine: LLMEngine, prompts: dict[str, list[int]], references: dict[str, list[int]],
           tap: _DistributionTap, clock: harness.StepClock) -> _Forced:
    for key, prompt in prompts.items():
        engine.add_request(prompt, SamplingParams(max_tokens=len(references[key]), temperature=0.0,
                                                  ignore_eos=True),
                           request_id=key, teacher_token_ids=references[key])
    requests = dict(engine.requests)
    started = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        clock.tick()
    return _Forced({key: list(request.teacher_logprobs) for key, request in requests.items()}, tap,
                   harness.decision_counts(engine.manager.make_stats()), engine.scheduler.num_preemptions,
                   time.perf_counter() - started)


def _references(loaded: harness.Loaded, prompts: dict[str, list[int]], settings: FidelitySettings) -> dict:
    return greedy_references(loaded, prompts, {key: settings.max_tokens for key in prompts},
                             block_size=settings.block_size, seed=settings.seed)


def greedy_references(loaded: harness.Loaded, prompts: dict[str, list[int]], max_tokens: dict[str, int], *,
                      block_size: int, seed: int = 0) -> dict[str, list[int]]:
    """Full KV's greedy continuation of every prompt (``ignore_eos``: each ``max_tokens[key]`` long),
    with room for all of them."""
    num_pages = sum(math.ceil((len(prompt) + max_tokens[key]) / block_size) + 1 for key, prompt in prompts.items())
    engine, _ = harness.build_engine(loaded, "full_kv", base_pages=16, block_size=block_size,
                                     max_num_seqs=len(prompts), seed=seed, num_pages=num_pages)
    for key, prompt in prompts.items():
        engine.add_request(prompt, SamplingParams(max_tokens=max_tokens[key], temperature=0.0, ignore_eos=True),
                           request_id=key)
    requests = dict(engine.requests)
    while engine.has_unfinished_requests():
        engine.step()
    return {key: list(request.output_token_ids) for key, request in requests.items()}


def _row(method: str, budget: int | None, run: _Forced, reference: _Forced) -> dict:
    kl = [value for values in run.tap.kl.values() for value in values]
    per_request_kl = [statistics.fmean(values) for values in run.tap.kl.values() if values]
    return {"method": method, "budget_pages": budget, "nll_increase": nll_increase(reference.logprobs, run.logprobs),
            "kl_lower_bound": {"mean": round(statistics.fmean(kl), 5) if kl else None,
                               "range": [round(min(per_request_kl), 5), round(max(per_request_kl), 5)]
                               if per_request_kl else None},
            "decisions": run.decisions, "preemptions": run.preemptions, "wall_s": round(run.wall_s, 2)}


def run_fidelity(model_dir: str, settings: FidelitySettings, progress: Callable[[str], None] = lambda _m: None,
                 loaded: harness.Loaded | None = None) -> dict:
    """Full KV's continuation of every prompt, then every method at every budget forced through it
    on the reference engine; returns a JSON-ready dict (one row per method and budget)."""
    harness.check_methods(settings.methods)
    loaded = loaded or harness.load(model_dir, settings.threads)
    prompts = {task.task_id: harness.chat_ids(loaded, task.prompt) for task in settings.tasks()}
    progress("full KV, greedy: the continuation every method is forced through")
    references = _references(loaded, prompts, settings)
    progress("full KV, forced on its own continuation")
    reference = _forced_run(loaded, "full_kv", max(settings.budgets), prompts, references, settings, None)
    rows = [_row("full_kv", None, _forced_run(loaded, "full_kv", max(settings.budgets), prompts, references,
                                               settings, reference.tap), reference)]
    for method in settings.methods:
        for budget in settings.budgets:
            progress(f"{method} at {budget} pages, forced")
            run = _forced_run(loaded, method, budget, prompts, references, settings, reference.tap)
            rows.append(_row(method, budget, run, reference))
    return {"benchmark": "fidelity", "home": "reference engine", "settings": dataclasses.asdict(settings),
            "thresholds": harness.thresholds_from(settings.thresholds_file) or "published defaults",
            "prompt_tokens": {key: len(ids) for key, ids in prompts.items()},
            "reference_tokens": sum(len(ids) for ids in references.values()), "results": rows}


def forced_spec(spec: dict, references: Sequence[Sequence[int]]) -> dict:
    """A vLLM run's spec (``growpage.tooling.vllm_child``) made to emit ``references`` (one per prompt,
    in order) and report each token's raw log-probability."""
    if len(references) != len(spec["prompts"]):
        raise ValueError(f"{len(references)} references for {len(spec['prompts'])} prompts")
    return {**spec, "forced": [list(tokens) for tokens in references], "logprobs": True,
            "max_tokens": max(len(tokens) for tokens in references)}


def forced_nll_increase(loaded: harness.Loaded, method: str, *, base_pages: int, num_pages: int, block_size: int,
                        prompts: dict[str, list[int]], references: dict[str, list[int]],
                        reference_logprobs: dict[str, list[float]] | None = None, seed: int = 0,
                        thresholds_file: str | None = None,
                        attention_coverage: float = DEFAULT_ATTENTION_COVERAGE) -> tuple[dict, dict[str, list[float]]]:
    """``method`` on the reference engine (``num_pages`` pool, ``base_pages`` budget, GrowPage at
    ``attention_coverage``: pass the run's own, or the NLL is another policy's) forced through
    ``references``; its NLL increase over ``reference_logprobs`` (full KV's own, forced: pass None
    when ``method`` is full KV and this run is the reference) and its per-token log-probabilities."""
    settings = FidelitySettings(budgets=(base_pages,), block_size=block_size, seed=seed,
                                thresholds_file=thresholds_file, attention_coverage=attention_coverage)
    run = _forced_run(loaded, method, base_pages, prompts, references, settings, None, num_pages=num_pages)
    return nll_increase(reference_logprobs or run.logprobs, run.logprobs), run.logprobs
