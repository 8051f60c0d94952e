"""The scheduler side's one owner of requests: one entry per request across preemptions, one admission
path, and a request's preemption and end handled in one place (physical length, plans, growth-aware
admission, the enforce log)."""

from __future__ import annotations

import json
import types

from growpage.config import Mode
from growpage.core.admission import MIN_FINISHED
from growpage.core.controller import GrowthController
from growpage.vllm_plugin.admission import AdmissionGate
from growpage.vllm_plugin.resolve import split_settings
from growpage.vllm_plugin.scheduler_requests import EnforcedRequest, SchedulerRequests
from growpage.vllm_plugin.wire import DROPPED_ATTRIBUTE, CompactionPlan

BLOCK = 4


def _controller(**overrides) -> GrowthController:
    settings = {"mode": "enforce", "base_pages": 3, "sink_tokens": 1, "recent_window_tokens": 2, **overrides}
    config, _ = split_settings(settings, env={}, block_size=BLOCK)
    return GrowthController(config, num_layers=None)


def _request(request_id: str = "r", *, prompt: int = 6, computed: int = 14, extra: dict | None = None):
    return types.SimpleNamespace(
        request_id=request_id, num_prompt_tokens=prompt, num_computed_tokens=computed, num_tokens=computed + 1,
        num_output_tokens=computed + 1 - prompt, max_tokens=16, prompt_token_ids=list(range(prompt)),
        num_preemptions=0, status=None, sampling_params=types.SimpleNamespace(extra_args=extra or {}))


def _plan(dropped: int = 4) -> CompactionPlan:
    return CompactionPlan(physical_tokens=12, keep_tokens=8, logical_length=12, shared_prefix_tokens=0,
                          dropped=dropped, prompt_tokens=6)


def test_one_entry_per_request_and_one_admission_whoever_asks_first():
    controller = _controller(enforce_namespaces=["gold"])
    requests = SchedulerRequests(controller)
    gold, batch = _request("g", extra={"growpage_namespace": "gold"}), _request("b")
    assert requests.track(gold) is requests.track(gold)  # made once, at first sight
    assert (requests["g"].mode, requests.track(batch).mode) == (Mode.ENFORCE, Mode.MONITOR)
    assert requests.admit(gold, pages_granted=2) and not requests.admit(gold)  # the second caller is a no-op
    assert controller.requests["g"].namespace == "gold"
    off = SchedulerRequests(_controller(mode="off"))
    assert not off.admit(_request("o")) and "o" not in off.controller.requests  # not observed, never admitted


def test_a_preemption_ends_the_run_but_keeps_the_record_and_undoes_the_compaction():
    gate = AdmissionGate(BLOCK, 20, policy="after_preemption")
    requests = SchedulerRequests(_controller(), gate)
    request = _request()
    assert not gate.lookahead  # after_preemption: vLLM's admission until vLLM preempts
    entry = requests.track(request)
    entry.pages_held = 4
    entry.enforced = EnforcedRequest("r", None, allowed_blocks=3, compactions=1, blocks_at_last_step=3,
                                     prompt_settled=True)
    setattr(request, DROPPED_ATTRIBUTE, 4)
    requests.plan_compaction("r", _plan())
    requests.preempted(request)
    # vLLM recomputes it from scratch: nothing GrowPage dropped stands, and no plan moves freed blocks
    assert getattr(request, DROPPED_ATTRIBUTE) == 0 and requests.take_plans() == {}
    assert entry.pages_held is None and requests["r"] is entry  # the run ended, the request did not
    assert entry.enforced.compactions == 1 and entry.enforced.blocks_at_last_step == 0
    assert not entry.enforced.prompt_settled  # a cap compresses its recomputed prompt again
    assert gate.lookahead  # admission looks ahead again


def test_a_finished_request_teaches_admission_and_leaves_its_record_in_the_enforce_log(tmp_path):
    controller = _controller(attention_coverage=0.95)
    gate = AdmissionGate(BLOCK, 20)
    log = tmp_path / "enforce.log"
    requests = SchedulerRequests(controller, gate, log_path=str(log))
    for index in range(MIN_FINISHED):  # enough ends for admission to replace its prior of 1
        request = _request(f"r{index}")
        requests.admit(request)
        requests[request.request_id].enforced = EnforcedRequest(request.request_id, None, allowed_blocks=3,
                                                                peak_blocks=4, compactions=2, tokens_evicted=5)
        controller.update_attention_need(request.request_id, 9)
        requests.plan_compaction(request.request_id, _plan())
        setattr(request, DROPPED_ATTRIBUTE, 5)
        released = requests.finished(request)
        assert released is not None and request.request_id not in requests and requests.take_plans() == {}
        assert getattr(request, DROPPED_ATTRIBUTE) == 0
    assert gate.shares.need_share == 9 / 15  # each needed 9 of its 15 tokens
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["request_id"], r["compactions"], r["tokens_evicted"], r["peak_blocks"]) for r in records] == [
        (f"r{index}", 2, 5, 4) for index in range(MIN_FINISHED)]
    assert requests.finished(_request("never-ran")) is None  # an abort before it ran: no entry, no record
    assert len(log.read_text().splitlines()) == MIN_FINISHED


def test_plans_ride_once():
    requests = SchedulerRequests(_controller())
    requests.plan_compaction("a", _plan())
    assert set(requests.take_plans()) == {"a"} and requests.take_plans() == {}
