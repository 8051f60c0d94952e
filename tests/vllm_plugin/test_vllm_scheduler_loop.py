"""The scheduler agent through whole runs of a stand-in of vLLM's scheduler loop (``scheduler_sim``):
what admission does to preemptions, that no page or request state is ever left behind under random
workloads, and a golden trace of every decision, compaction plan and admission that a restructuring
must leave unchanged.

The golden trace (``golden/scheduler_trace.json``) is rewritten by running this file with
``UPDATE_GOLDEN_TRACE=1``; a change to it is a change of behaviour, to be explained in its commit.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from scheduler_sim import Arrival, Scheduler, run

GOLDEN = Path(__file__).with_name("golden") / "scheduler_trace.json"
BLOCK = 4
# the contract as it decides at every boundary: these runs check admission, compaction and accounting,
# so the compression gate (on in the plugin's defaults) is off unless a test turns it on
SMALL = {"base_pages": 3, "sink_tokens": 1, "recent_window_tokens": 4, "compression_gate": False}


def _stream(count: int, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    return [Arrival(step=3 * index, request_id=f"r{index}", prompt_tokens=rng.randint(8, 40),
                    max_tokens=rng.randint(16, 48)) for index in range(count)]


def _readings(request_id: str, step: int) -> tuple[float, float]:
    """Odd requests focus (evicted at their boundaries), even ones spread their attention (they grow)."""
    return (0.2, 0.5) if int(request_id[1:]) % 2 else (0.2, 3.0)


def _needs(scheduler: Scheduler, share_odd: float = 0.3, share_even: float = 0.6):
    def need(request_id: str, step: int) -> int:
        running = next((r for r in scheduler.running if r.request_id == request_id), None)
        share = share_odd if int(request_id[1:]) % 2 else share_even
        return int((running.num_computed_tokens if running else 0) * share)

    return need


def _run(growpage: dict, arrivals: list[Arrival], blocks: int = 40) -> tuple[Scheduler, list[dict]]:
    scheduler = Scheduler({"mode": "enforce", **SMALL, **growpage}, usable_blocks=blocks, block_size=BLOCK)
    steps = run(scheduler, arrivals, _readings, attention_tokens=_needs(scheduler))
    return scheduler, steps


def _assert_nothing_left(scheduler: Scheduler, blocks: int) -> None:
    agent = scheduler.agent
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == blocks, "a page leaked"
    assert not scheduler.blocks, scheduler.blocks
    assert not agent.requests and not agent.controller.requests, (list(agent.requests), agent.controller.requests)
    assert agent.enforcer is None or agent.enforcer.requests is agent.requests  # one table
    assert agent.forecast is None or not agent.forecast.shadows
    assert sum(agent.stats.agent_errors_total.values()) == 0, agent.stats.agent_errors_total


def test_projected_admission_runs_without_a_preemption_where_vllms_admission_preempts():
    arrivals = _stream(24, seed=0)
    vllm, _ = _run({"admission": "vllm"}, arrivals, blocks=25)
    projected, steps = _run({"admission": "projected"}, arrivals, blocks=25)
    after, _ = _run({"admission": "after_preemption"}, arrivals, blocks=25)
    assert vllm.preemptions > 0 and projected.preemptions == 0
    assert after.preemptions <= vllm.preemptions
    assert projected.agent.admission.holds_total > 0 and any(step["limit"] < 16 for step in steps)
    # every request still ran to its max_tokens
    assert sorted((r.request_id, r.num_output_tokens) for r in projected.finished) == \
        sorted((a.request_id, a.max_tokens) for a in arrivals)


def test_the_compression_gate_leaves_the_kv_alone_where_compactions_would_buy_no_width():
    arrivals = _stream(24, seed=0)
    # short prompts, no attention need measured in the prompt (the floor alone): nothing spares a request
    gated, _ = _run({"admission": "vllm", "compression_gate": True}, arrivals, blocks=25)
    ungated, _ = _run({"admission": "vllm"}, arrivals, blocks=25)
    assert gated.agent.observed.steps_compression_idle > 0
    assert ungated.agent.stats.decisions_total.get("evict", 0) > 0
    assert gated.agent.stats.decisions_total.get("evict", 0) < ungated.agent.stats.decisions_total.get("evict", 0)
    assert sorted((r.request_id, r.num_output_tokens) for r in gated.finished) == \
        sorted((a.request_id, a.max_tokens) for a in arrivals)
    _assert_nothing_left(gated, 25)


@pytest.mark.parametrize("seed", range(6))
def test_no_page_or_request_state_is_left_behind_under_random_workloads(seed):
    rng = random.Random(seed)
    blocks = rng.choice((12, 20, 40))
    # vLLM refuses a request longer than the KV space (max_model_len), so every one here fits alone
    arrivals = [Arrival(step=rng.randint(0, 60), request_id=f"r{index}", prompt_tokens=rng.randint(1, blocks),
                        max_tokens=rng.randint(1, blocks * BLOCK - blocks),
                        extra_args=rng.choice(({}, {"growpage_namespace": "chat"}, {"growpage_mode": "monitor"})))
                for index in range(rng.randint(5, 30))]
    growpage = {"admission": rng.choice(("auto", "vllm", "projected", "after_preemption")),
                "method": rng.choice(("growpage", "growpage_when_it_pays", "streaming_llm", "h2o")),
                "client_mode": "honour", "compression_gate": rng.random() < 0.5,
                **({"enforce_namespaces": ["chat"]} if rng.random() < 0.5 else {})}
    scheduler, _ = _run(growpage, arrivals, blocks=blocks)
    assert len(scheduler.finished) == len(arrivals), growpage
    _assert_nothing_left(scheduler, blocks)


def _trace(admission: str) -> dict:
    scheduler, steps = _run({"admission": admission}, _stream(16, seed=1), blocks=30)
    events: list[list] = []

    class Listener:
        def on_admit(self, event):
            pass

        def on_finish(self, event):
            pass

        def on_decision(self, event):
            events.append([event.request_id, event.kind, event.reason, event.pages_before, event.pages_after])

    # replay with the listener attached from the start: the run is deterministic
    scheduler = Scheduler({"mode": "enforce", **SMALL, "admission": admission}, usable_blocks=30, block_size=BLOCK)
    scheduler.agent.stats.add_listener(Listener())
    plans: list[list] = []
    enforcer = scheduler.agent.enforcer
    original = enforcer._compact

    def compact(sched, running, target):
        plans.append([running.request.request_id, running.physical, target])
        original(sched, running, target)

    enforcer._compact = compact
    replayed = run(scheduler, _stream(16, seed=1), _readings, attention_tokens=_needs(scheduler))
    assert replayed == steps, "the loop is not deterministic"
    return {"steps": steps, "decisions": events, "compactions": plans, "preemptions": scheduler.preemptions}


def test_the_golden_trace_of_decisions_compactions_and_admissions_is_unchanged():
    traces = {admission: _trace(admission) for admission in ("vllm", "projected", "after_preemption")}
    if os.environ.get("UPDATE_GOLDEN_TRACE"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(traces, indent=1, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN.read_text())
    for admission, trace in traces.items():
        for part in ("preemptions", "steps", "decisions", "compactions"):
            assert trace[part] == golden[admission][part], f"{admission}: {part} changed"
