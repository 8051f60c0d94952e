"""Growth-aware admission against stand-ins of vLLM 0.32's scheduler: what it holds, what it leaves to
vLLM, what it learns, and that a fault leaves vLLM's own admission (the real engine: test_vllm_enforce)."""

from __future__ import annotations

import types

import pytest

from growpage.core.admission import MIN_FINISHED
from growpage.errors import ConfigError
from growpage.vllm_plugin.admission import AdmissionCollector, AdmissionGate
from growpage.vllm_plugin.settings import split_settings

BLOCK = 32
CONFIGURED = 16  # the deployment's max_num_seqs


def _request(request_id: str, *, prompt: int = 96, output: int = 0, max_tokens: int = 160):
    return types.SimpleNamespace(request_id=request_id, num_prompt_tokens=prompt, num_output_tokens=output,
                                 num_computed_tokens=prompt + output, num_tokens=prompt + output,
                                 max_tokens=max_tokens, status=None)


def _scheduler(running: int, waiting: int, **request):
    return types.SimpleNamespace(running=[_request(f"r{i}", **request) for i in range(running)],
                                 waiting=[_request(f"w{i}", **request) for i in range(waiting)],
                                 max_num_active_reqs=CONFIGURED, max_model_len=2048)


def _held(scheduler, pages: int = 3) -> dict[str, int]:
    return {request.request_id: pages for request in scheduler.running}


def test_a_batch_that_would_outgrow_the_pool_takes_no_one_more():
    # 96-token prompts that each decode 160 tokens end at 8 pages: 4 of them fill 32 of 39
    gate = AdmissionGate(BLOCK, total_pages=39)
    scheduler = _scheduler(running=4, waiting=8)
    assert gate.before_schedule(scheduler, _held(scheduler), lambda request: True) is True
    assert scheduler.max_num_active_reqs == 4 and gate.holds_total == 1 and gate.projected_pages == 32


def test_where_every_projection_fits_vllm_admits_as_configured():
    gate = AdmissionGate(BLOCK, total_pages=97)
    scheduler = _scheduler(running=4, waiting=8)
    assert gate.before_schedule(scheduler, _held(scheduler), lambda request: True) is False
    assert scheduler.max_num_active_reqs == CONFIGURED and gate.holds_total == 0


def test_compression_learned_from_finished_requests_admits_a_wider_batch():
    gate = AdmissionGate(BLOCK, total_pages=39)
    for index in range(MIN_FINISHED):  # enforced requests that ended at 4 pages where full KV needs 8
        gate.on_finish(_request(f"done{index}", output=160), peak_pages=4)
    scheduler = _scheduler(running=4, waiting=8)
    gate.before_schedule(scheduler, _held(scheduler), lambda request: True)
    assert scheduler.max_num_active_reqs == 9  # 39 pages hold 9 requests at 4 pages
    # the same requests where vLLM pages them (not enforced): full KV's 8 pages each
    gate.before_schedule(scheduler, _held(scheduler), lambda request: False)
    assert scheduler.max_num_active_reqs == 4


def test_short_answers_learned_from_finished_requests_admit_a_wider_batch():
    gate = AdmissionGate(BLOCK, total_pages=39)
    for index in range(MIN_FINISHED):  # answers stop at 32 of their 160 tokens
        gate.on_finish(_request(f"done{index}", output=32), peak_pages=None)
    scheduler = _scheduler(running=4, waiting=8)
    gate.before_schedule(scheduler, _held(scheduler), lambda request: False)
    assert scheduler.max_num_active_reqs == 4 + 5  # 96 + 32 tokens: 4 pages each


def test_aborted_requests_teach_nothing():
    gate = AdmissionGate(BLOCK, total_pages=39)
    for index in range(MIN_FINISHED):
        aborted = _request(f"gone{index}", output=1)
        aborted.status = types.SimpleNamespace(name="FINISHED_ABORTED")
        gate.on_finish(aborted, peak_pages=1)
    assert gate.shares.finished == 0


def test_a_request_without_max_tokens_may_use_the_models_length():
    gate = AdmissionGate(BLOCK, total_pages=39)
    scheduler = _scheduler(running=1, waiting=1, max_tokens=None)
    gate.before_schedule(scheduler, _held(scheduler), lambda request: False)
    assert gate.projected_pages == 2048 // BLOCK and scheduler.max_num_active_reqs == 1


def test_an_empty_batch_always_starts_its_oldest_request():
    gate = AdmissionGate(BLOCK, total_pages=39)
    scheduler = _scheduler(running=0, waiting=3, max_tokens=4000)
    assert gate.before_schedule(scheduler, {}, lambda request: False) is False
    assert scheduler.max_num_active_reqs == 1


def test_a_fault_while_projecting_leaves_vllms_own_limit():
    gate = AdmissionGate(BLOCK, total_pages=39)
    scheduler = _scheduler(running=4, waiting=8)
    gate.before_schedule(scheduler, _held(scheduler), lambda request: True)
    assert scheduler.max_num_active_reqs == 4
    del scheduler.waiting[0].num_output_tokens  # a request the gate cannot read
    with pytest.raises(AttributeError):
        gate.before_schedule(scheduler, _held(scheduler), lambda request: True)
    assert scheduler.max_num_active_reqs == CONFIGURED  # put back before anything was read


def test_a_scheduler_without_the_admission_limit_runs_its_own_admission():
    gate = AdmissionGate(BLOCK, total_pages=39)
    scheduler = _scheduler(running=4, waiting=8)
    del scheduler.max_num_active_reqs
    assert gate.before_schedule(scheduler, _held(scheduler), lambda request: True) is False
    assert not hasattr(scheduler, "max_num_active_reqs")


def test_the_gate_exports_its_holds_and_projection():
    gate = AdmissionGate(BLOCK, total_pages=39)
    scheduler = _scheduler(running=4, waiting=8)
    gate.before_schedule(scheduler, _held(scheduler), lambda request: True)
    source = types.SimpleNamespace(admission=gate, stats=None)
    families = {family.name: family.samples[0].value for family in AdmissionCollector(source, "m").collect()}
    assert families == {"growpage_admission_holds": 1.0, "growpage_admission_projected_pages": 32.0}
    assert list(AdmissionCollector(types.SimpleNamespace(admission=None), "m").collect()) == []


def test_admission_is_a_setting_with_a_fix_in_its_error():
    _, plugin = split_settings({"mode": "enforce"}, env={}, block_size=BLOCK)
    assert plugin.admission == "projected"
    _, plugin = split_settings({"mode": "enforce", "admission": "vllm"}, env={}, block_size=BLOCK)
    assert plugin.admission == "vllm"
    with pytest.raises(ConfigError, match="admission must be one of projected, vllm"):
        split_settings({"mode": "enforce", "admission": "greedy"}, env={}, block_size=BLOCK)
