"""Growth-aware admission against stand-ins of vLLM 0.32's scheduler: what it holds, what it leaves to
vLLM, what it learns, when it engages, and that a fault leaves vLLM's own admission (a real engine:
test_vllm_enforce; the whole scheduler loop: test_vllm_scheduler_loop)."""

from __future__ import annotations

import types

import pytest

from growpage.config import GrowPageConfig, Mode
from growpage.core.admission import (
    ADMIT_PRIOR,
    LOOK_AHEAD_PRIOR,
    MIN_FINISHED,
    MIN_FIT_STEPS,
    Compression,
    StepCostFit,
    token_share_prior,
)
from growpage.core.controller import GrowthController
from growpage.errors import ConfigError
from growpage.vllm_plugin.admission import (
    PREEMPTION_MEMORY_STEPS,
    AdmissionCollector,
    AdmissionGate,
    StepMeter,
    compression_of,
    need_share_at_end,
)
from growpage.vllm_plugin.settings import PRIOR_TOKEN_SHARE_BY_CPU, split_settings

BLOCK = 32
CONFIGURED = 16  # the deployment's max_num_seqs
FULL = None  # vLLM pages the request: full KV
FLOOR = Compression(base_pages=4, sink_tokens=4, recent_window_tokens=64)  # GrowPage, attention not observed


def _request(request_id: str, *, prompt: int = 96, output: int = 0, max_tokens: int = 160):
    return types.SimpleNamespace(request_id=request_id, num_prompt_tokens=prompt, num_output_tokens=output,
                                 num_computed_tokens=prompt + output, num_tokens=prompt + output,
                                 max_tokens=max_tokens, status=None,
                                 sampling_params=types.SimpleNamespace(extra_args={}))


def _scheduler(running: int, waiting: int, **request):
    return types.SimpleNamespace(running=[_request(f"r{i}", **request) for i in range(running)],
                                 waiting=[_request(f"w{i}", **request) for i in range(waiting)],
                                 max_num_active_reqs=CONFIGURED, max_model_len=2048)


def _held(scheduler, pages: int = 3) -> dict[str, list]:
    """Each running request's block list (``pages`` blocks)."""
    return {request.request_id: [object()] * pages for request in scheduler.running}


def _gate(total_pages: int = 39) -> AdmissionGate:
    return AdmissionGate(BLOCK, total_pages, policy="projected")


def test_a_batch_that_would_outgrow_the_pool_takes_no_one_more():
    # 96-token prompts that each decode 160 tokens end at 8 pages: 4 of them fill 32 of 39
    gate = _gate()
    scheduler = _scheduler(running=4, waiting=8)
    assert gate.before_schedule(scheduler, _held(scheduler), lambda request: FULL) is True
    assert scheduler.max_num_active_reqs == 4 and gate.holds_total == 1 and gate.projected_pages == 32


def test_where_every_projection_fits_vllm_admits_as_configured():
    gate = _gate(total_pages=97)
    scheduler = _scheduler(running=4, waiting=8)
    assert gate.before_schedule(scheduler, _held(scheduler), lambda request: FULL) is False
    assert scheduler.max_num_active_reqs == CONFIGURED and gate.holds_total == 0


def test_compression_admits_the_batch_its_floors_fit():
    gate = _gate()
    scheduler = _scheduler(running=4, waiting=8)
    needy = Compression(4, 4, 64, need_share=0.3)  # 77 of 256 tokens: a floor of 4 pages
    gate.before_schedule(scheduler, _held(scheduler), lambda request: needy)
    assert scheduler.max_num_active_reqs == 9  # 39 pages hold 9 requests at their 4-page floors
    # before its attention is observed a request is planned at full KV, until finished requests say more
    gate.before_schedule(scheduler, _held(scheduler), lambda request: FLOOR)
    assert scheduler.max_num_active_reqs == 4
    for index in range(MIN_FINISHED):
        gate.on_finish(_request(f"done{index}", output=160), need_share=0.3)
    gate.before_schedule(scheduler, _held(scheduler), lambda request: FLOOR)
    assert scheduler.max_num_active_reqs == 9


def test_short_answers_learned_from_finished_requests_admit_a_wider_batch():
    gate = _gate()
    for index in range(MIN_FINISHED):  # answers stop at 32 of their 160 tokens
        gate.on_finish(_request(f"done{index}", output=32), need_share=None)
    scheduler = _scheduler(running=4, waiting=8)
    gate.before_schedule(scheduler, _held(scheduler), lambda request: FULL)
    assert scheduler.max_num_active_reqs == 4 + 5  # 96 + 32 tokens: 4 pages each


def test_after_preemption_admission_looks_ahead_only_while_vllm_preempts():
    gate = AdmissionGate(BLOCK, 39, policy="after_preemption")
    scheduler = _scheduler(running=4, waiting=8)
    assert gate.before_schedule(scheduler, _held(scheduler), lambda request: FULL) is False
    assert scheduler.max_num_active_reqs == CONFIGURED  # no preemption yet: vLLM's own admission
    gate.on_preempt()
    assert gate.before_schedule(scheduler, _held(scheduler), lambda request: FULL) is True
    assert scheduler.max_num_active_reqs == 4
    for _ in range(PREEMPTION_MEMORY_STEPS):
        gate.before_schedule(scheduler, _held(scheduler), lambda request: FULL)
    assert not gate.lookahead and scheduler.max_num_active_reqs == CONFIGURED  # a quiet pool is vLLM's again


def _fitted(*, fixed: float, per_request: float, per_token: float) -> StepCostFit:
    fit = StepCostFit()
    for step in range(64):
        requests, extra = 1 + step % 8, (200 if step % 5 == 0 else 0)
        seconds = fixed + per_request * requests + per_token * extra
        fit.record(requests=requests, tokens=requests + extra, seconds=seconds)
    return fit


def test_measured_admission_looks_ahead_only_where_a_recompute_costs_more_than_the_width():
    scheduler = _scheduler(running=4, waiting=8)
    # unmeasured: the host's prior (a CPU without a priced prior looks ahead, a GPU admits as vLLM does)
    for prior, holds in ((LOOK_AHEAD_PRIOR, True), (ADMIT_PRIOR, False)):
        gate = AdmissionGate(BLOCK, 39, policy="measured", prior_costs=prior)
        assert gate.before_schedule(scheduler, _held(scheduler), lambda request: FULL) is holds
        assert gate.lookahead is holds
        scheduler.max_num_active_reqs = CONFIGURED
    # prefill costs what decode does per token: a preemption's recompute is dear, hold
    dear = AdmissionGate(BLOCK, 39, policy="measured", prior_costs=ADMIT_PRIOR,
                         step_costs=_fitted(fixed=0.0135, per_request=0.0265, per_token=0.0265))
    assert dear.before_schedule(scheduler, _held(scheduler), lambda request: FULL) is True
    assert scheduler.max_num_active_reqs == 4 and dear.lookahead
    scheduler.max_num_active_reqs = CONFIGURED
    # a step's fixed part dominates and prefill batches cheaply: the wider batch is worth the recompute
    cheap = AdmissionGate(BLOCK, 39, policy="measured", prior_costs=LOOK_AHEAD_PRIOR,
                          step_costs=_fitted(fixed=0.012, per_request=0.0029, per_token=0.0002))
    assert cheap.before_schedule(scheduler, _held(scheduler), lambda request: FULL) is False
    assert scheduler.max_num_active_reqs == CONFIGURED and not cheap.lookahead and cheap.holds_total == 0


@pytest.mark.parametrize(("cpu", "prompt", "max_tokens", "holds"), [
    ("amx", 96, 160, False),  # decode-heavy: a recompute of 176 tokens is 1.6 % of the 40 steps a hold gives up
    ("avx512", 96, 160, False),
    ("avx512", 1000, 16, True),  # a long prompt with a short answer: its recompute outweighs the width
    ("avx2", 96, 160, True),  # not priced: looks ahead until the fit answers
])
def test_before_its_fit_answers_measured_admission_runs_the_same_rule_on_the_hosts_prior(cpu, prompt, max_tokens,
                                                                                       holds):
    """A priced prior admits a decode-heavy batch as vLLM does from the first step, instead of holding
    starts for the 8-10 steps the fit takes (5 engine steps more than vLLM alone's 299 on the AMX host)."""
    _, plugin = split_settings({"mode": "enforce"}, env={}, block_size=BLOCK)
    scheduler = _scheduler(running=4, waiting=8, prompt=prompt, max_tokens=max_tokens)
    gate = AdmissionGate(BLOCK, 39, policy="measured", prior_costs=plugin.prior_step_costs("cpu", cpu))
    gate.before_schedule(scheduler, _held(scheduler, pages=9), lambda request: FULL)
    assert gate.lookahead is holds and not gate.decides_on_evidence
    assert (scheduler.max_num_active_reqs < CONFIGURED) is holds


def test_a_prior_that_holds_starts_one_request_more_until_a_prefill_has_priced_a_token():
    """The CPU prior looks ahead; were it to hold every start, no prompt would prefill and the fit
    that should replace it would never answer (make run prefilled again only at step 92)."""
    scheduler = _scheduler(running=4, waiting=8)
    fit = StepCostFit()
    gate = AdmissionGate(BLOCK, 39, policy="measured", prior_costs=LOOK_AHEAD_PRIOR, step_costs=fit)
    # no warm step timed yet (the engine's cold first one is left out): the prior alone
    assert gate.before_schedule(scheduler, _held(scheduler), lambda request: FULL) is True
    assert scheduler.max_num_active_reqs == 4
    fit.record(requests=4, tokens=4, seconds=0.02)  # a warm decode step: a token is not priced yet
    assert gate.before_schedule(scheduler, _held(scheduler), lambda request: FULL) is False
    assert scheduler.max_num_active_reqs == 5 and gate.lookahead  # one start beyond the projection
    fit.record(requests=5, tokens=80, seconds=0.07)  # its prefill prices a token
    assert gate.before_schedule(scheduler, _held(scheduler), lambda request: FULL) is True
    assert scheduler.max_num_active_reqs == 4  # the prior again, until the fit has its steps
    scheduler.max_num_active_reqs = CONFIGURED
    # a start that left the fit unable to part its costs (one prefill, at the only other width) is
    # measured again, but two starts at most until the fit answers (the first priced the token)
    for _ in range(MIN_FIT_STEPS):
        fit.record(requests=4, tokens=4, seconds=0.02)
    assert fit.prices_a_token and fit.costs() is None
    limits = []
    for _ in range(4):
        scheduler.max_num_active_reqs = CONFIGURED
        gate.before_schedule(scheduler, _held(scheduler), lambda request: FULL)
        limits.append(scheduler.max_num_active_reqs)
    assert limits == [5, 4, 4, 4]  # the second measuring start, then the prior until the fit answers
    scheduler.max_num_active_reqs = CONFIGURED
    projected = AdmissionGate(BLOCK, 39, policy="projected", step_costs=StepCostFit())
    projected.step_costs.record(requests=4, tokens=4, seconds=0.02)
    assert projected.before_schedule(scheduler, _held(scheduler), lambda request: FULL) is True
    assert scheduler.max_num_active_reqs == 4  # a policy that always looks ahead measures nothing


def test_the_step_meter_times_each_output_from_schedule_to_update_leaving_out_the_cold_first_step():
    now = [0.0]
    meter = StepMeter(lambda: now[0])
    meter.finished(types.SimpleNamespace())  # an output it never saw scheduled: nothing recorded, nor cold
    meter.scheduled(types.SimpleNamespace(num_scheduled_tokens={}))  # an empty step: nothing to time
    outputs = []
    for step in range(40):
        output = types.SimpleNamespace(num_scheduled_tokens={f"r{i}": 1 for i in range(1 + step % 4)}
                                       | ({"p": 101} if step % 5 == 0 else {}))
        meter.scheduled(output)
        outputs.append(output)
        width = len(output.num_scheduled_tokens)
        now[0] += 0.01 + 0.002 * width + (0.0001 * 100 if step % 5 == 0 else 0.0)
        now[0] += 2.0 if step == 0 else 0.0  # the engine's first step pays its start-up
        meter.finished(output)
    costs = meter.fit.costs()
    assert costs is not None and costs.steps == 40 - StepMeter.COLD_STEPS
    fitted = (round(costs.fixed_s, 6), round(costs.per_request_s, 6), round(costs.per_token_s, 6))
    assert fitted == (0.01, 0.002, 0.0001)


def test_aborted_requests_teach_nothing():
    gate = _gate()
    for index in range(MIN_FINISHED):
        aborted = _request(f"gone{index}", output=1)
        aborted.status = types.SimpleNamespace(name="FINISHED_ABORTED")
        gate.on_finish(aborted, need_share=0.1)
    assert gate.shares.finished == 0


def test_a_request_without_max_tokens_may_use_the_models_length():
    gate = _gate()
    scheduler = _scheduler(running=1, waiting=1, max_tokens=None)
    gate.before_schedule(scheduler, _held(scheduler), lambda request: FULL)
    assert gate.projected_pages == 2048 // BLOCK and scheduler.max_num_active_reqs == 1


def test_an_empty_batch_always_starts_its_oldest_request():
    gate = _gate()
    scheduler = _scheduler(running=0, waiting=3, max_tokens=4000)
    assert gate.before_schedule(scheduler, {}, lambda request: FULL) is False
    assert scheduler.max_num_active_reqs == 1


def test_a_fault_while_projecting_leaves_vllms_own_limit():
    gate = _gate()
    scheduler = _scheduler(running=4, waiting=8)
    gate.before_schedule(scheduler, _held(scheduler), lambda request: FULL)
    assert scheduler.max_num_active_reqs == 4
    del scheduler.waiting[0].num_output_tokens  # a request the gate cannot read
    with pytest.raises(AttributeError):
        gate.before_schedule(scheduler, _held(scheduler), lambda request: FULL)
    assert scheduler.max_num_active_reqs == CONFIGURED  # put back before anything was read


def test_a_scheduler_without_the_admission_limit_runs_its_own_admission():
    gate = _gate()
    scheduler = _scheduler(running=4, waiting=8)
    del scheduler.max_num_active_reqs
    assert gate.before_schedule(scheduler, _held(scheduler), lambda request: FULL) is False
    assert not hasattr(scheduler, "max_num_active_reqs")


def _controller(**config) -> GrowthController:
    values = {"mode": Mode.ENFORCE, "block_size": BLOCK, "base_pages": 4, "sink_tokens": 4,
              "recent_window_tokens": 64, "attention_coverage": 0.95, **config}
    return GrowthController(GrowPageConfig(**values), num_layers=None, clock=lambda: 0.0)


def test_compression_follows_the_mode_and_the_observed_attention_need():
    controller = _controller()
    waiting = _request("w")
    assert compression_of(controller, waiting, Mode.ENFORCE) == Compression(4, 4, 64, None)  # not observed
    assert compression_of(controller, waiting, Mode.MONITOR) is None  # it will be enforced, not monitored
    controller.admit("r", prompt_tokens=96, mode=Mode.ENFORCE)
    running = _request("r", output=24)  # 120 tokens computed
    controller.update_attention_need("r", 30)
    assert compression_of(controller, running, Mode.ENFORCE).need_share == 0.25
    finished = _request("r", output=104)  # 200 tokens
    assert need_share_at_end(controller, finished) == 30 / 200
    capped = _controller(attention_coverage=0.0)  # no attention need kept: the floor is the cap's
    assert compression_of(capped, waiting, Mode.ENFORCE).need_share == 0.0
    assert need_share_at_end(capped, finished) is None


def test_the_gate_exports_its_holds_and_projection():
    gate = _gate()
    scheduler = _scheduler(running=4, waiting=8)
    gate.before_schedule(scheduler, _held(scheduler), lambda request: FULL)
    source = types.SimpleNamespace(admission=gate, stats=None)
    families = {family.name: family.samples[0].value for family in AdmissionCollector(source, "m").collect()}
    assert families == {"growpage_admission_holds": 1.0, "growpage_admission_projected_pages": 32.0,
                        "growpage_admission_lookahead": 1.0}
    assert list(AdmissionCollector(types.SimpleNamespace(admission=None), "m").collect()) == []


def test_admission_is_a_setting_with_a_fix_in_its_error():
    _, plugin = split_settings({"mode": "enforce"}, env={}, block_size=BLOCK)
    assert plugin.admission == "auto"  # the default
    assert plugin.admission_on("cpu") == plugin.admission_on("cuda") == "measured"
    # before the costs are measured: the host's priced prior, growth-aware on a CPU not priced, vLLM's own on a GPU
    assert plugin.prior_step_costs("cpu", "amx") == token_share_prior(PRIOR_TOKEN_SHARE_BY_CPU["amx"])
    assert plugin.prior_step_costs("cpu", "avx2") == plugin.prior_step_costs("cpu", "") == LOOK_AHEAD_PRIOR
    assert plugin.prior_step_costs("cuda", "amx") == ADMIT_PRIOR
    for choice in ("vllm", "projected", "after_preemption"):
        _, plugin = split_settings({"mode": "enforce", "admission": choice}, env={}, block_size=BLOCK)
        assert plugin.admission == choice and plugin.admission_on("cpu") == plugin.admission_on("cuda") == choice
    with pytest.raises(ConfigError, match="admission must be one of auto, vllm, projected, after_preemption"):
        split_settings({"mode": "enforce", "admission": "greedy"}, env={}, block_size=BLOCK)
