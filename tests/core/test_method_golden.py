"""A golden trace of what every KV method keeps, in both homes, that a restructuring of the methods
must leave unchanged.

- **Reference engine**: each registered method runs one fixed workload (three requests on a small
  pool, random Q/K/V from a fixed seed) through :class:`~growpage.engine.kv.manager.GrowPageManager`;
  the trace holds every request's stored positions after each step where they changed (which
  tokens each compaction kept), its decisions, and preemptions.
- **Inside vLLM**: each method vLLM runs folds a fixed stream of attention observations (a prompt,
  then decode steps, one request per KV head and one for the request as a whole) into the worker's
  scores and chooses survivors at three budgets around a compaction, as the compactor does; the
  trace holds the kept slots and the attention need at two coverages.

The golden file (``golden/method_trace.json``) is rewritten by running this file with
``UPDATE_GOLDEN_TRACE=1``; a change to it is a change of behaviour, to be explained in its commit.
A newly registered method gets its entry the same way; until then the test names it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from growpage.core.methods import METHOD_NAMES, build_method
from growpage.engine.kv.manager import SlotStatus
from growpage.vllm_plugin.compaction import TokenScores, choose_keep, slot_positions
from growpage.vllm_plugin.settings import VLLM_METHODS
from support.factories import Driver, make_manager

GOLDEN = Path(__file__).with_name("golden") / "method_trace.json"
PROMPTS = {"a": 6, "b": 9, "c": 5}
DECODE_STEPS = 40


def _reference_trace(method_name: str) -> dict:
    """One fixed workload through the reference engine's manager under ``method_name``."""
    manager = make_manager(num_pages=14, method=build_method(method_name, seed=0), base_pages=3)
    driver = Driver(manager, seed=7)
    for request_id, prompt in PROMPTS.items():
        driver.admit(request_id, prompt)
    driver.step([(request_id, prompt) for request_id, prompt in PROMPTS.items()])
    kept: dict[str, list[int]] = {r: driver.stored_positions(r) for r in PROMPTS}
    events: list[list] = []
    running = list(PROMPTS)
    for step in range(DECODE_STEPS):
        batch = []
        for request_id in list(running):
            if manager.ensure_slots(request_id, 1) is SlotStatus.OK:
                batch.append((request_id, 1))
            else:  # the engine would preempt it: its pages go back
                manager.release(request_id, reason="preempted")
                running.remove(request_id)
                events.append([step, request_id, "preempted"])
        if not batch:
            break
        driver.step(batch)
        for request_id, _ in batch:
            stored = driver.stored_positions(request_id)
            expected = kept[request_id] + [manager.requests[request_id].logical_length - 1]
            if stored != expected:  # a compaction chose survivors
                events.append([step, request_id, stored])
            kept[request_id] = stored
    stats = manager.make_stats()
    return {"events": events, "decisions": dict(sorted(stats.decisions_total.items())),
            "final": {r: kept[r] for r in running}}


def _observations(per_head: bool, seed: int) -> list[torch.Tensor]:
    """A prompt of 24 tokens' observation, then 20 decode steps', each a distribution per row."""
    generator = torch.Generator().manual_seed(seed)
    rows = (3,) if per_head else ()
    stream = [torch.softmax(torch.randn(*rows, 24, generator=generator) * 2.0, dim=-1)]
    for step in range(20):
        stream.append(torch.softmax(torch.randn(*rows, 25 + step, generator=generator) * 2.0, dim=-1))
    return stream


def _vllm_trace(method_name: str) -> dict:
    """The worker's scores under ``method_name``: survivors before and after one compaction."""
    trace: dict[str, dict] = {}
    for per_head in (False, True):
        scores = TokenScores(build_method(method_name))
        stream = _observations(per_head, seed=11)
        for observation in stream[:11]:
            scores.add("r", observation)
        length = 34  # 24 prompt tokens and 10 generated
        positions = torch.arange(length)
        first = choose_keep(positions, scores.ranking("r", positions), 20, length, shared_prefix_tokens=0,
                            sink_tokens=1, recent_window_tokens=4, shared_fraction=0.5 if per_head else 0.0,
                            method=scores.method)
        assert first is not None
        scores.keep("r", first, length)
        dropped = length - 20
        kept_positions = positions[first] if first.dim() == 1 else torch.stack([positions[row] for row in first])
        for observation in stream[11:]:  # decode steps over the 20 survivors and new tokens
            physical = observation.shape[-1] - dropped
            scores.add("r", observation[..., :physical])
        length = 44
        physical = length - dropped
        slots = slot_positions(kept_positions, physical, dropped)
        second = {keep: choose_keep(slots, scores.ranking("r", slots), keep, length, shared_prefix_tokens=0,
                                    sink_tokens=1, recent_window_tokens=4,
                                    shared_fraction=0.5 if per_head else 0.0, method=scores.method)
                  for keep in (12, 24)}
        trace["kv_head" if per_head else "request"] = {
            "first": first.tolist(),
            "second": {str(k): v.tolist() for k, v in second.items() if v is not None},
            "need": [scores.tokens_for_coverage("r", coverage, 1, 4) for coverage in (0.5, 0.95)]}
    return trace


def _trace() -> dict:
    return {"reference_engine": {name: _reference_trace(name) for name in METHOD_NAMES},
            "vllm": {name: _vllm_trace(name) for name in VLLM_METHODS}}


def test_what_every_method_keeps_in_both_homes_is_unchanged():
    trace = json.loads(json.dumps(_trace()))
    if os.environ.get("UPDATE_GOLDEN_TRACE"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(trace, indent=1, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN.read_text())
    for home in ("reference_engine", "vllm"):
        missing = sorted(set(trace[home]) - set(golden[home]))
        assert not missing, f"no golden trace for {missing} in {home}: rerun with UPDATE_GOLDEN_TRACE=1"
        for name in trace[home]:
            assert trace[home][name] == golden[home][name], f"{home}: {name} keeps other tokens than before"


def test_the_trace_shows_compactions_to_compare():
    """The golden trace is only worth keeping if the workload compacts under every method that can."""
    golden = json.loads(GOLDEN.read_text())
    for name in ("growpage", "h2o", "snapkv", "streaming_llm", "zipage", "tova"):
        assert any(isinstance(event[2], list) for event in golden["reference_engine"][name]["events"]), name
    for name, homes in golden["vllm"].items():
        assert homes["request"]["second"] and homes["kv_head"]["second"], name


@pytest.mark.parametrize("name", ["h2o", "growpage"])
def test_a_different_keep_set_is_caught(name):
    """The comparison can fail: the same workload under another seed keeps other tokens."""
    golden = json.loads(GOLDEN.read_text())
    other = _vllm_trace(name)
    scores = TokenScores(build_method(name))
    for observation in _observations(False, seed=12)[:11]:
        scores.add("r", observation)
    positions = torch.arange(34)
    changed = choose_keep(positions, scores.ranking("r", positions), 20, 34, 0, 1, 4)
    assert other == golden["vllm"][name]
    assert changed is not None and changed.tolist() != golden["vllm"][name]["request"]["first"]
