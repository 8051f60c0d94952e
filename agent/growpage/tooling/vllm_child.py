"""The child of ``gpctl demo``: runs vLLM's engine in this process and reports each step.

Started by :func:`growpage.tooling.vllm_runs.run_engine` as ``python -m growpage.tooling.vllm_child SPEC``,
once per engine (vLLM registers plugins once per process; on CPU it spawns processes, so this
runs behind a ``__main__`` guard in a fresh interpreter). One engine may serve several runs in
turn (``spec["runs"]``: the demo's reasoning, forced and retrieval runs), its prefix cache reset
between them, so a run finds the engine as a fresh one would, without paying another start.
The engine core runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the scheduler's block
pool, queues and GrowPage's enforcer can be read between steps. Prints one JSON line per progress
report (``PROGRESS_PREFIX``) and one per finished variant (``RESULT_PREFIX``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sys
import time
import unittest.mock
from typing import Any

from growpage.chat import chat_text, user_turn
from growpage.core.policy import Reason
from growpage.core.quantiles import percentile
from growpage.vllm_plugin.scheduler_hooks import agent_of, existing_agent

PROGRESS_PREFIX = "GROWPAGE_DEMO_PROGRESS "
RESULT_PREFIX = "GROWPAGE_DEMO_RESULT "


def _growpage_config(spec: dict) -> dict:
    """``spec["growpage"]`` is GrowPage's config for this run, or None for vLLM alone."""
    if spec.get("growpage") is None:
        return {"mode": "off", "exporter_port": -1}
    return {"mode": "enforce", "exporter_port": -1, **spec["growpage"]}


def _timed_allocations(latencies: list[float]) -> contextlib.AbstractContextManager[Any]:
    """While entered, ``KVCacheManager.allocate_slots`` is wrapped (outermost, both variants) to time
    each call that grants new blocks: the same grant-latency measurement for vLLM alone and with
    GrowPage. Leaving restores the method, whatever happened."""
    # deferred: vLLM loads after main() sets its environment, and not in the parents importing this
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    original = KVCacheManager.allocate_slots

    @functools.wraps(original)
    def allocate_slots(self: KVCacheManager, request: Any, *args: Any, **kwargs: Any) -> Any:
        free_before = self.block_pool.get_num_free_blocks()
        started = time.perf_counter()
        result = original(self, request, *args, **kwargs)
        elapsed = time.perf_counter() - started
        granted = free_before - self.block_pool.get_num_free_blocks()
        if result is not None and granted > 0:
            latencies.append(elapsed / granted)
        return result

    return unittest.mock.patch.object(KVCacheManager, "allocate_slots", allocate_slots)


def _sampling(spec: dict, index: int) -> Any:
    """Greedy; ``spec["max_tokens"]`` (one for all, or a list: one per prompt); ``ignore_eos`` unless
    ``spec["ignore_eos"]`` is false; with ``spec["logprobs"]`` each
    emitted token's raw log-probability; with ``spec["forced"]`` (one token list per prompt) the
    request emits that list (:mod:`growpage.tooling.forced_decoding`)."""
    # deferred: vLLM (forced_decoding imports it) loads after main() sets its environment
    from vllm import SamplingParams

    from growpage.tooling.forced_decoding import REFERENCE_KEY

    forced = spec.get("forced")
    logprobs = 0 if spec.get("logprobs") or forced else None
    if forced:
        return SamplingParams(temperature=0, max_tokens=len(forced[index]), ignore_eos=True, logprobs=logprobs,
                              extra_args={REFERENCE_KEY: forced[index]})
    max_tokens = spec["max_tokens"]  # one for every prompt, or one per prompt (a mixed trace)
    return SamplingParams(temperature=0, max_tokens=max_tokens[index] if isinstance(max_tokens, list) else max_tokens,
                          ignore_eos=spec.get("ignore_eos", True), logprobs=logprobs)


def engine_arguments(spec: dict, num_prompts: int) -> dict[str, Any]:
    """The keyword arguments of vLLM's ``LLM`` for ``spec`` (besides the forcing logits processor
    and GrowPage's ``additional_config``), so a benchmark records every engine setting it ran with.
    ``spec["max_num_seqs"]`` caps the batch (vLLM alone tuned); by default it holds every prompt."""
    return {"model": spec["model_dir"], "gpu_memory_utilization": 0.3, "enforce_eager": True,
            "block_size": spec["block_size"], "max_model_len": spec["max_model_len"],
            "max_num_seqs": spec.get("max_num_seqs") or num_prompts,
            "max_num_batched_tokens": spec.get("max_num_batched_tokens", 1024), "seed": 0,
            "num_gpu_blocks_override": spec["kv_blocks"], "logprobs_mode": "raw_logprobs"}


def _engine(spec: dict, num_prompts: int) -> Any:
    """The engine every run of ``spec`` shares. The forcing logits processor is always loaded (it
    leaves requests without references alone), so forced and free runs, and every variant, run on
    the same engine configuration."""
    # deferred: vLLM (forced_decoding imports it) loads after main() sets its environment
    from vllm import LLM

    from growpage.tooling.forced_decoding import FORCE_PROCESSOR

    return LLM(**engine_arguments(spec, num_prompts), logits_processors=[FORCE_PROCESSOR],
               additional_config={"growpage": _growpage_config(spec)})


def _token_logprobs(completion: Any) -> list[float]:
    """The raw log-probability of each emitted token (empty when none were asked for)."""
    if not completion.logprobs:
        return []
    return [float(step[token].logprob) for token, step in zip(completion.token_ids, completion.logprobs, strict=True)]


# what a run may change in its engine's spec: everything else is the engine's (see run_engine)
RUN_KEYS = ("variant", "prompts", "max_tokens", "forced", "logprobs", "ignore_eos", "decision_trace")


def run_variant(llm: Any, spec: dict, prompts: list[str], latencies: list[float], run_index: int = 0) -> dict:
    """One run on ``llm``: ``prompts`` under ``spec``'s sampling, to the end; its result record.

    Counters the engine keeps across runs (GrowPage's decisions and compressed bytes) are reported
    as this run's increase; ``latencies`` holds this run's grant latencies only."""
    # deferred: vLLM loads after main() sets its environment, and not in the parents importing this
    from vllm.v1.engine.core_client import InprocClient

    variant = spec["variant"]
    engine = llm.llm_engine
    core = engine.engine_core
    if not isinstance(core, InprocClient):
        raise RuntimeError("the engine core must run in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    scheduler: Any = core.engine_core.scheduler  # vLLM's Scheduler (its interface type has no queues)
    pool = scheduler.kv_cache_manager.block_pool
    before = _counters(scheduler)
    trace = DecisionTrace.attach(scheduler, f"{run_index}.{variant}-") if spec.get("decision_trace") else None
    freed = FreedPages.attach(scheduler)
    for index, prompt in enumerate(prompts):
        engine.add_request(f"{run_index}.{variant}-{index}", prompt, _sampling(spec, index))
    run = _Run(variant, len(prompts), before)
    started = time.perf_counter()
    run.step_to_the_end(engine, scheduler, spec["report_interval_s"])
    elapsed = time.perf_counter() - started
    after = _counters(scheduler)
    generated = sum(len(tokens) for tokens in run.outputs.values())
    return {
        "variant": variant, "tokens_per_s": generated / elapsed, "generated_tokens": generated,
        "elapsed_s": elapsed, "steps": run.steps, "peak_running": run.peak_running,
        "mean_running": run.running_steps / max(run.steps, 1),
        # the KV a running request held on average (blocks in use per running request, step-weighted):
        # what "equal memory" matches a fixed cap's budget to
        "mean_blocks_per_running": run.held_blocks / max(run.running_steps, 1),
        "preemptions": sum(run.preemptions.values()), "decisions": _decisions(scheduler, before),
        "compressed_bytes_in": after["bytes_in"] - before["bytes_in"],
        "compressed_bytes_out": after["bytes_out"] - before["bytes_out"],
        "grant_latency_p50_s": percentile(latencies, 0.5),
        "grant_latency_p99_s": percentile(latencies, 0.99),
        "blocks_free_at_end": pool.get_num_free_blocks(), "blocks_total": pool.num_gpu_blocks - 1,
        # what enforce freed (its compactions, against growing) and what monitor forecast it would
        "pages_freed": freed.stop() if freed is not None else 0,
        "forecast": {key: after["forecast"][key] - before["forecast"].get(key, 0) for key in after["forecast"]},
        "admission": _admission_delta(before["admission"], after["admission"]),
        "own_time": _own_time_delta(before, after, elapsed),
        "outputs": {rid.rsplit("-", 1)[1]: tokens for rid, tokens in run.outputs.items()},
        "logprobs": {rid.rsplit("-", 1)[1]: values for rid, values in run.logprobs.items() if values},
        **({"decision_trace": trace.stop()} if trace is not None else {}),
    }


def _admission_delta(before: dict | None, after: dict | None) -> dict | None:
    """This run's share of the steps enforce's admission looked ahead in, and the costs it weighed at the end."""
    if after is None or before is None:
        return None
    steps = after["steps"] - before["steps"]
    looked = after["lookahead_steps"] - before["lookahead_steps"]
    return {"policy": after["policy"], "lookahead_share": round(looked / steps, 3) if steps else None,
            "step_costs": after["step_costs"]}


def _own_time_delta(before: dict, after: dict, elapsed_s: float) -> dict | None:
    """This run's seconds of GrowPage's own code and of the vLLM calls it hooks, by side, and its
    share of both those calls and the run's wall time (None for vLLM alone)."""
    if not after["own_seconds"]:
        return None
    own = {side: after["own_seconds"][side] - before["own_seconds"].get(side, 0.0) for side in after["own_seconds"]}
    step = {side: after["step_seconds"][side] - before["step_seconds"].get(side, 0.0) for side in after["step_seconds"]}
    return {"own_s": {side: round(value, 4) for side, value in own.items()},
            "step_s": {side: round(value, 4) for side, value in step.items()},
            "share_of_steps": round(sum(own.values()) / sum(step.values()), 4) if sum(step.values()) else None,
            "share_of_run": round(sum(own.values()) / elapsed_s, 4) if elapsed_s else None}


class _Run:
    """One run's step loop and what it counts per step."""

    def __init__(self, variant: str, requests: int, before: dict):
        self.variant, self.requests, self.before = variant, requests, before
        self.outputs: dict[str, list[int]] = {}
        self.logprobs: dict[str, list[float]] = {}
        self.preemptions: dict[str, int] = {}
        self.peak_running = self.steps = self.running_steps = self.held_blocks = 0

    def step_to_the_end(self, engine: Any, scheduler: Any, report_interval_s: float) -> None:
        # deferred: vLLM loads after main() sets its environment, and not in the parents importing this
        from vllm import RequestOutput

        pool = scheduler.kv_cache_manager.block_pool
        started = last_report = time.perf_counter()
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished and isinstance(output, RequestOutput):  # generation, never pooling
                    self.outputs[output.request_id] = list(output.outputs[0].token_ids)
                    self.logprobs[output.request_id] = _token_logprobs(output.outputs[0])
            self.steps += 1
            for request in list(scheduler.running) + list(scheduler.waiting):
                self.preemptions[request.request_id] = max(self.preemptions.get(request.request_id, 0),
                                                           request.num_preemptions)
            self.peak_running = max(self.peak_running, len(scheduler.running))
            self.running_steps += len(scheduler.running)
            self.held_blocks += pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
            now = time.perf_counter()
            if now - last_report >= report_interval_s or not engine.has_unfinished_requests():
                last_report = now
                _emit(PROGRESS_PREFIX, _progress(self.variant, scheduler, round(now - started, 1), len(self.outputs),
                                                 self.requests, sum(self.preemptions.values()), self.before))


def _counters(scheduler: Any) -> dict:
    """GrowPage's cumulative counters in this engine (zeros for vLLM alone): decisions by kind (what
    monitor would decide, what enforce decided) and compressed bytes."""
    agent = existing_agent(scheduler)
    if agent is None:
        return {"decisions": {}, "bytes_in": 0, "bytes_out": 0, "forecast": {}, "admission": None,
                "own_seconds": {}, "step_seconds": {}}
    stats = agent.stats
    forecast = dataclasses.asdict(agent.forecast.totals()) if agent.forecast is not None else {}
    gate = agent.admission
    costs = agent.steps.fit.costs()
    # enforce's admission: its policy, steps it ran and looked ahead in, and the step costs it weighed
    admission = None if gate is None else {
        "policy": gate.policy, "steps": gate.steps, "lookahead_steps": gate.lookahead_steps,
        "step_costs": dataclasses.asdict(costs) if costs is not None else None}
    return {"decisions": dict(stats.decisions_total), "bytes_in": stats.compress_input_bytes_total,
            "bytes_out": stats.compress_output_bytes_total, "forecast": forecast, "admission": admission,
            "own_seconds": agent.observed.own_seconds(), "step_seconds": agent.observed.step_seconds()}


class _DecisionListener:
    """A listener on the agent's stats for one run (decisions only), attached where the agent is
    built, so no decision of the run is missed, and detached when the run ends."""

    def __init__(self, stats: Any):
        self.stats = stats

    @classmethod
    def attach(cls, scheduler: Any, *args: Any) -> Any:
        agent = agent_of(scheduler)  # built now rather than at the first step, so no decision is missed
        if agent is None:
            return None
        listener = cls(agent.stats, *args)
        agent.stats.add_listener(listener)
        return listener

    def on_decision(self, event: Any) -> None:
        pass

    def on_admit(self, event: Any) -> None:
        pass

    def on_finish(self, event: Any) -> None:
        pass

    def detach(self) -> None:
        self.stats.listeners.remove(self)


class DecisionTrace(_DecisionListener):
    """This run's boundary decisions in order, ``[request index, pages before, kind]`` each (the
    requests whose id starts with ``prefix``), recorded as the agent's stats report them (a
    listener: the exporter's drains do not lose any). Two monitor runs of one trace meet the same
    boundaries (monitor changes nothing vLLM does), so their traces compare decision by decision."""

    def __init__(self, stats: Any, prefix: str):
        super().__init__(stats)
        self.prefix = prefix
        self.decisions: list[list[Any]] = []

    def on_decision(self, event: Any) -> None:
        if event.request_id.startswith(self.prefix):
            # vLLM's internal id: the one the run gave (prefix + index), "-" and 8 random characters
            index = event.request_id[len(self.prefix):].split("-", 1)[0]
            self.decisions.append([int(index), event.pages_before, event.kind])

    def stop(self) -> list[list[Any]]:
        self.detach()
        return self.decisions


class FreedPages(_DecisionListener):
    """Pages enforce's compactions freed in a run, against growing: a boundary eviction frees the
    page the request would have grown by plus what it cut (``pages_before + 1 - pages_after``), a
    compression outside a boundary (pressure relief, a prompt compressed for admission or to a
    cap) what it cut (``pages_before - pages_after``). What monitor's forecast is measured against."""

    # the reasons controller.record_eviction gives a compression outside a boundary
    OUTSIDE_A_BOUNDARY = (Reason.POOL_PRESSURE.value, Reason.PROMPT_BUDGET.value)

    def __init__(self, stats: Any):
        super().__init__(stats)
        self.pages = 0

    def on_decision(self, event: Any) -> None:
        if event.enforced and event.kind == "evict":
            boundary = event.reason not in self.OUTSIDE_A_BOUNDARY
            self.pages += event.pages_before + int(boundary) - event.pages_after

    def stop(self) -> int:
        self.detach()
        return self.pages


def _progress(variant: str, scheduler: Any, elapsed_s: float, finished: int, requests: int,
              preemptions: int, before: dict) -> dict:
    """One live report: the queues, the block pool and GrowPage's decisions so far in this run."""
    pool = scheduler.kv_cache_manager.block_pool
    return {"variant": variant, "elapsed_s": elapsed_s, "finished": finished, "requests": requests,
            "running": len(scheduler.running), "waiting": len(scheduler.waiting),
            "blocks_free": pool.get_num_free_blocks(), "blocks_total": pool.num_gpu_blocks - 1,
            "preemptions": preemptions, "decisions": _decisions(scheduler, before)}


def _decisions(scheduler: Any, before: dict) -> dict[str, int]:
    """GrowPage's decisions by kind since ``before`` (:func:`_counters`)."""
    now = _counters(scheduler)["decisions"]
    counts = {kind: count - before["decisions"].get(kind, 0) for kind, count in now.items()}
    return {kind: count for kind, count in counts.items() if count}


def _emit(prefix: str, record: dict) -> None:
    print(prefix + json.dumps(record), flush=True)


def main(spec: dict) -> None:
    """Start the engine of ``spec``, then run each of ``spec["runs"]`` (run keys over the spec's;
    just the spec when there are none), one result line each, the prefix cache reset between runs."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the scheduler is read between steps
    # deferred: transformers takes seconds to import; only a run that tokenizes loads it
    from transformers import AutoTokenizer

    if spec.get("growpage") is None:  # vLLM alone: no plugin is loaded, no GrowPage code runs
        os.environ["VLLM_PLUGINS"] = ""
    os.environ["GROWPAGE_MODE"] = _growpage_config(spec)["mode"]
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    runs = [{**spec, **run} for run in spec.get("runs") or [{}]]
    latencies: list[float] = []
    with _timed_allocations(latencies):
        llm = _engine(spec, max(len(run["prompts"]) for run in runs))
        for index, run in enumerate(runs):
            latencies.clear()
            prompts = [chat_text(tokenizer, user_turn(text)) for text in run["prompts"]]
            _emit(RESULT_PREFIX, run_variant(llm, run, prompts, latencies, index))
            llm.reset_prefix_cache()


def read_spec(argument: str) -> dict:
    """The run's spec: JSON, or ``@path`` of a JSON file (what the parent passes)."""
    if argument.startswith("@"):
        with open(argument[1:], encoding="utf-8") as spec_file:
            return dict(json.load(spec_file))
    return dict(json.loads(argument))


if __name__ == "__main__":
    main(read_spec(sys.argv[1]))
