"""Monitor's forecast of enforce (``growpage.vllm_plugin.forecast``) on a real growth controller:
what it counts as freed, compacted and avoidable, and that it never changes what monitor decides."""

from __future__ import annotations

import types

import pytest

from growpage import catalog
from growpage.config import GrowPageConfig, Mode
from growpage.core.admission import ADMIT_PRIOR, LOOK_AHEAD_PRIOR, StepCostFit
from growpage.core.controller import GrowthController, Reading
from growpage.vllm_plugin.admission import AdmissionGate
from growpage.vllm_plugin.forecast import EnforceForecast, ForecastCollector, StepRequest, WaitingRequest

BLOCK = 16


def _controller(**config) -> GrowthController:
    values = {"mode": Mode.MONITOR, "block_size": BLOCK, "base_pages": 4, "sink_tokens": 4,
              "recent_window_tokens": 16, "attention_coverage": 0.95, **config}
    return GrowthController(GrowPageConfig(**values), num_layers=None, clock=lambda: 0.0)


def _waiting(prompt_tokens: int | None, request_id: str = "w") -> list[WaitingRequest]:
    """The waiting queue of one fresh request of ``prompt_tokens`` (None: nothing waits)."""
    return [] if prompt_tokens is None else [WaitingRequest(request_id, prompt_tokens, prompt_tokens)]


def _decode(forecast: EnforceForecast, request_id: str, prompt: int, steps: int, *, free: int,
            waiting: int | None = None, room_for_all: bool = False) -> None:
    """``steps`` decode steps of one request whose vLLM blocks grow with it (monitor changes nothing)."""
    for step in range(steps):
        tokens = prompt + step + 1
        forecast.on_step([StepRequest(request_id, -(-tokens // BLOCK), tokens, 1, prompt)], free_pages=free,
                         waiting=_waiting(waiting), room_for_all=room_for_all)


def _sparing_request(*, at_its_floor: bool = True,
                     admission: AdmissionGate | None = None) -> tuple[GrowthController, EnforceForecast]:
    """A forecast over one request "a" that enforce would hold in 5 pages where vLLM holds 9 (4
    spare); ``at_its_floor``: its floor raised to those 5 by its attention need (relief can take
    nothing more; else its floor is 4); ``admission``: the forecast's gate (its step costs price
    what enforce saves)."""
    controller = _controller()
    controller.admit("a", prompt_tokens=40, mode=Mode.MONITOR)
    controller.update_reading("a", Reading(sts_density=0.2, lts_entropy=0.5))
    forecast = EnforceForecast(controller, admission)
    forecast.on_step([StepRequest("a", 3, 40, 40, 40)], free_pages=10)
    _decode(forecast, "a", 40, 100, free=10)
    if at_its_floor:
        controller.update_attention_need("a", 64)
    return controller, forecast


def test_a_low_entropy_request_past_its_floor_is_forecast_to_evict_and_free_a_page_per_boundary():
    controller = _controller()
    controller.admit("a", prompt_tokens=40, mode=Mode.MONITOR)
    controller.update_reading("a", Reading(sts_density=0.2, lts_entropy=0.5))  # sparse, focused: evict
    budget = controller.requests["a"].growth_budget_pages
    forecast = EnforceForecast(controller)
    forecast.on_step([StepRequest("a", 3, 40, 40, 40)], free_pages=10)  # prefill
    _decode(forecast, "a", 40, 100, free=10)
    totals = forecast.totals()
    assert controller.requests["a"].growth_budget_pages == budget  # a preview: monitor's own state unchanged
    # vLLM grew the request to 9 blocks (140 tokens); enforce would have grown it to its capacity
    # boundary (4 x (1 + 0.2 x 0.5) = 4.4: 5 pages), then evicted at every boundary after: one page
    # freed at each of the 4 (80, 96, 112, 128 tokens), and the difference spare now
    assert forecast.shadows["a"].pages == 5
    assert totals.compactions == totals.pages_freed == 4
    assert totals.spare_pages == 9 - 5
    assert totals.preemptions == totals.preemptions_avoidable == 0


def test_with_room_for_every_request_the_same_request_is_forecast_to_grow_and_free_nothing():
    controller = _controller()
    controller.admit("a", prompt_tokens=40, mode=Mode.MONITOR)
    controller.update_reading("a", Reading(sts_density=0.2, lts_entropy=0.5))  # would evict under pressure
    forecast = EnforceForecast(controller)
    forecast.on_step([StepRequest("a", 3, 40, 40, 40)], free_pages=10, room_for_all=True)
    _decode(forecast, "a", 40, 100, free=10, room_for_all=True)
    totals = forecast.totals()
    assert forecast.shadows["a"].pages == 9  # as vLLM grew it: enforce would have compressed nothing
    assert totals.compactions == totals.pages_freed == totals.spare_pages == 0


def test_the_floor_follows_the_attention_need_so_a_needy_request_is_forecast_to_keep_its_tokens():
    controller = _controller()
    controller.admit("a", prompt_tokens=40, mode=Mode.MONITOR)
    controller.update_reading("a", Reading(sts_density=0.2, lts_entropy=0.5))
    controller.update_attention_need("a", 200)  # its attention needs every token it will have
    forecast = EnforceForecast(controller)
    forecast.on_step([StepRequest("a", 3, 40, 40, 40)], free_pages=10)
    _decode(forecast, "a", 40, 100, free=10)
    assert forecast.totals().pages_freed == 0 and forecast.shadows["a"].pages == 9


def test_a_high_entropy_request_is_forecast_to_grow_and_frees_nothing():
    controller = _controller()
    controller.admit("a", prompt_tokens=40, mode=Mode.MONITOR)
    controller.update_reading("a", Reading(sts_density=0.2, lts_entropy=5.0))  # diffuse: grows while it may
    forecast = EnforceForecast(controller)
    forecast.on_step([StepRequest("a", 3, 40, 40, 40)], free_pages=50)
    _decode(forecast, "a", 40, 30, free=50)
    assert forecast.totals().pages_freed == 0 and forecast.totals().spare_pages == 0


def test_a_fresh_prompt_is_forecast_compressed_only_when_a_waiting_request_cannot_be_admitted():
    for free, waiting, freed in ((0, 200, 7), (40, 200, 0), (0, None, 0)):
        controller = _controller()
        controller.admit("a", prompt_tokens=160, mode=Mode.MONITOR)
        controller.update_attention_need("a", 30)
        forecast = EnforceForecast(controller)
        forecast.on_step([StepRequest("a", 11, 160, 160, 160)], free_pages=free, waiting=_waiting(waiting))
        forecast.on_step([StepRequest("a", 11, 161, 1, 160)], free_pages=free, waiting=_waiting(waiting))
        # floor: max(4 pages, (30 needed tokens -> 2 pages) + 1) = 4; 11 pages (161 tokens) -> 4
        assert forecast.totals().pages_freed == freed, (free, waiting)


def _resumed_beside_a_decoding_one(controller: GrowthController, forecast: EnforceForecast,
                                   waiting: list[WaitingRequest]) -> None:
    """Request "b" decodes; vLLM resumes "a" (a 40-token prompt and 60 tokens of output, 7 pages)
    and it decodes its first token beside "b", which reaches a boundary in that step. The pool's
    free pages would hold the oldest waiting request's prompt, but not once "b" grows."""
    for request_id in ("a", "b"):
        controller.admit(request_id, prompt_tokens=40, mode=Mode.MONITOR)
    controller.update_attention_need("a", 30)  # its floor: 4 pages
    forecast.on_step([StepRequest("b", 3, 40, 40, 40)], free_pages=20)
    for tokens in range(41, 48):
        forecast.on_step([StepRequest("b", 3, tokens, 1, 40)], free_pages=20)
    # vLLM's free pages after it scheduled the step: "b"'s page for its growth is taken already
    free = controller.grant_pages(40) - 1
    forecast.on_step([StepRequest("a", 7, 100, 100, 40), StepRequest("b", 3, 48, 1, 40)],
                     free_pages=free, waiting=waiting)
    forecast.on_step([StepRequest("a", 7, 101, 1, 40), StepRequest("b", 4, 49, 1, 40)],
                     free_pages=free, waiting=waiting)


@pytest.mark.parametrize(("waiting", "freed"), [
    (_waiting(40, "c"), 3),  # a request waits that the pool cannot take once "b" grows: enforce compresses "a"
    (_waiting(None), 0),  # nothing waits: "a" keeps its whole context
])
def test_a_resumed_request_is_compressed_at_its_recomputes_end_where_the_steps_growth_leaves_no_room_to_admit(
        waiting, freed):
    controller = _controller()
    forecast = EnforceForecast(controller, compression_gate=True)
    _resumed_beside_a_decoding_one(controller, forecast, waiting)
    # 100 cached tokens in 7 pages down to its floor of 4, its generated tokens too (as enforce
    # compresses a resumed request at its recompute's end), with the gate idle throughout
    assert forecast.gate.idle
    assert (forecast.totals().pages_freed, forecast.shadows["a"].pages) == (freed, 7 - freed)


def _fitted_steps(fixed_s: float, per_request_s: float) -> StepCostFit:
    """An engine whose steps cost ``fixed_s`` + ``per_request_s`` a request + 1 ms a prefilled token."""
    fit = StepCostFit()
    for step in range(40):
        requests, extra = 1 + step % 4, 20 if step % 3 == 0 else 0
        fit.record(requests=requests, tokens=requests + extra,
                   seconds=fixed_s + per_request_s * requests + 0.001 * extra)
    return fit


@pytest.mark.parametrize(("fixed_s", "per_request_s", "freed"), [
    (0.03, 0.001, 3),  # the step's fixed part dominates: one more request nearly doubles the batch's speed
    (0.0005, 0.02, 0),  # every request costs its own time (an AVX2 CPU): the width buys nothing
])
def test_with_the_gate_idle_the_shadows_compress_for_admission_only_where_the_engines_steps_say_the_width_pays(
        fixed_s, per_request_s, freed):
    controller = _controller()
    gate = AdmissionGate(BLOCK, 40, policy="projected", step_costs=_fitted_steps(fixed_s, per_request_s))
    forecast = EnforceForecast(controller, gate, compression_gate=True)
    _resumed_beside_a_decoding_one(controller, forecast, _waiting(40, "c"))
    assert forecast.gate.idle and forecast.totals().pages_freed == freed


def test_a_waiting_request_enforces_admission_holds_makes_no_prompt_compression():
    controller = _controller()
    forecast = EnforceForecast(controller, AdmissionGate(BLOCK, 40, policy="projected"), enforce_admits_so=True)
    forecast._would_hold, forecast._enforce_looks_ahead = frozenset({"c"}), True  # its admission holds "c"
    _resumed_beside_a_decoding_one(controller, forecast, _waiting(40, "c"))
    # enforce's step sees no request waiting while its admission holds the oldest: nothing to widen
    assert forecast.totals().pages_freed == 0


@pytest.mark.parametrize(("waiting", "total_pages", "pages", "freed"), [
    (None, 200, 7, 0),  # nothing waits: it grows into the pool's last pages
    # a request waits whose admission fits the floors: its pages are reserved for it; and once
    # enforce admits it into the pages spared, a page of it at its boundary past the floor (4)
    (40, 200, 4, 4),
    (40, 6, 7, 0),  # it waits, but its floor and the running floors overflow the pool: no reserve
])
def test_a_request_that_waits_for_admission_makes_the_shadows_compress_where_enforce_would(
        waiting, total_pages, pages, freed):
    controller = _controller()
    controller.admit("a", prompt_tokens=40, mode=Mode.MONITOR)
    controller.update_reading("a", Reading(sts_density=0.2, lts_entropy=5.0))  # broad: grows while it may
    forecast = EnforceForecast(controller)
    for tokens in range(40, 101):  # its prefill, then 60 decode steps with 2 pages free throughout
        forecast.on_step([StepRequest("a", -(-tokens // BLOCK), tokens, 40 if tokens == 40 else 1, 40)],
                         free_pages=2, waiting=_waiting(waiting), total_pages=total_pages)
    # enforce's step reserves the waiting prompt's pages (3) out of the 2 free, so each boundary
    # past the floor (4 pages) compresses, as the step's pressure makes it in enforce's plan_step
    assert (forecast.shadows["a"].pages, forecast.totals().pages_freed) == (pages, freed)


def test_a_preemption_is_avoidable_only_while_enforce_would_have_had_a_page():
    controller = _controller()
    for request_id in ("a", "b"):
        controller.admit(request_id, prompt_tokens=40, mode=Mode.MONITOR)
        controller.update_reading(request_id, Reading(sts_density=0.2, lts_entropy=5.0))  # grow: no spare
    forecast = EnforceForecast(controller)
    steps = [StepRequest(r, 3, 40, 40, 40) for r in ("a", "b")]
    forecast.on_step(steps, free_pages=0)
    forecast.on_preempt("b")
    assert forecast.totals().preemptions == 1 and forecast.totals().preemptions_avoidable == 0
    # "a" has decoded past its floor: pressure relief takes a page off it, so the next preemption is
    # avoidable, and the forecast counts the compaction that made the room
    forecast.on_step([StepRequest("a", 8, 120, 1, 40)], free_pages=0)
    forecast.shadows["a"].prompt_settled = True
    forecast.on_step([StepRequest("a", 8, 121, 1, 40)], free_pages=0)
    controller.admit("c", prompt_tokens=40, mode=Mode.MONITOR)
    forecast.on_preempt("c")
    totals = forecast.totals()
    assert (totals.preemptions, totals.preemptions_avoidable) == (2, 1)
    assert (totals.pages_freed, totals.compactions, forecast.shadows["a"].pages) == (1, 1, 7)
    # more preemptions in the same step: relief goes on down to the floor (4 pages: 4 sinks + 16
    # recent tokens need 3) and no further
    for index in range(4):
        controller.admit(f"w{index}", prompt_tokens=40, mode=Mode.MONITOR)
        forecast.on_preempt(f"w{index}")
    totals = forecast.totals()
    assert (totals.preemptions, totals.preemptions_avoidable, forecast.shadows["a"].pages) == (6, 4, 4)


def test_with_enforces_compression_gate_idle_the_shadows_grow_and_no_preemption_is_avoidable():
    """The shadows run enforce's gate: nothing spares a request's pages and no recompute is priced
    (the engine's steps are not measured here), so the gate stays idle as enforce's would."""
    controller = _controller()
    controller.admit("a", prompt_tokens=40, mode=Mode.MONITOR)
    controller.update_reading("a", Reading(sts_density=0.2, lts_entropy=0.5))  # ungated: evicts at each boundary
    forecast = EnforceForecast(controller, compression_gate=True)
    forecast.on_step([StepRequest("a", 3, 40, 40, 40)], free_pages=10)
    _decode(forecast, "a", 40, 100, free=10)
    assert forecast.gate.idle and forecast.shadows["a"].pages == 9  # as vLLM holds it
    assert forecast.totals().compactions == forecast.totals().pages_freed == 0
    forecast.on_step([StepRequest("a", 9, 141, 1, 40)], free_pages=0)
    controller.admit("b", prompt_tokens=40, mode=Mode.MONITOR)
    forecast.on_preempt("b", tokens=40)
    totals = forecast.totals()
    assert (totals.preemptions, totals.preemptions_avoidable) == (1, 0)  # vLLM preempts, as enforce lets it


def test_a_request_enforce_keeps_running_owes_its_pages_until_vllm_runs_it_again_or_it_would_end():
    controller, forecast = _sparing_request()

    def step(tokens_a: int, others: tuple[str, ...] = (), free: int = 0) -> None:
        for other in others:
            controller.admit(other, prompt_tokens=40, mode=Mode.MONITOR)
        forecast.on_step([StepRequest("a", 9, tokens_a, 1, 40)] + [StepRequest(o, 3, 45, 1, 40) for o in others],
                         free_pages=free)

    # vLLM preempts "b" for a page another request needs: it frees b's 3 pages and grants one of them
    step(141, ("b",))
    forecast.on_preempt("b", steps_left=2)  # 4 spare pages: enforce keeps it running on its 3
    assert forecast.kept_pages == 3
    step(142, ("c",), free=2)
    forecast.on_preempt("c", steps_left=None)  # 4 spare, 3 owed to "b": one page left, so kept too
    controller.update_attention_need("c", 64)  # its floor: 5 pages, so no boundary of it compresses
    assert forecast.kept_pages == 6
    step(143, ("d",), free=4)
    forecast.on_preempt("d", steps_left=None)  # the same 4 spare pages are owed: not avoidable again
    # an avoided preemption counts once it settles, so the counter never goes back
    assert forecast.totals().preemptions == 3 and forecast.totals().preemptions_avoidable == 0
    # "b" would have ended after its last 2 steps (settled: avoided); "c" decodes on (its 46th to
    # 48th tokens fill 3 pages, the 49th needs a fourth) on the pages vLLM left free
    for tokens_a, kept_pages in ((144, 3), (145, 3), (146, 4)):
        step(tokens_a, free=6)
        assert forecast.kept_pages == kept_pages, tokens_a
    assert forecast.totals().preemptions_avoidable == 1
    # vLLM hands its free pages to others: the spare 4 hold "c" until it needs a fifth page, which
    # relief cannot give ("a" is at its floor), so enforce preempts it after all
    for tokens_a in range(147, 162):  # "c" holds 50 to 64 tokens: 4 pages
        step(tokens_a)
    assert forecast.kept_pages == 4
    step(162)  # its 65th: preempted in enforce's pool too, so never counted as avoided
    assert (forecast.kept_pages, forecast.totals().preemptions_avoidable) == (0, 1)
    # no step costs measured (no admission forecast here): nothing is priced
    assert forecast.totals().recompute_seconds_avoidable == forecast.totals().wider_batch_seconds == 0.0


@pytest.mark.parametrize(("attention_need", "kept_pages", "freed"), [
    (0, 4, 1),  # its floor is 4 pages: at its 65th token enforce evicts a page of it instead of growing
    (64, 0, 0),  # its attention needs its 64 tokens (floor 5): it grows, relief has nothing, so it is preempted
])
def test_a_request_enforce_keeps_running_is_compressed_at_its_boundary_where_compression_pays(
        attention_need, kept_pages, freed):
    controller, forecast = _sparing_request()
    controller.admit("c", prompt_tokens=40, mode=Mode.MONITOR)
    forecast.on_step([StepRequest("a", 9, 141, 1, 40), StepRequest("c", 3, 45, 1, 40)], free_pages=0)
    forecast.on_preempt("c", steps_left=None)  # 4 spare pages: enforce keeps it running on its 3
    controller.update_attention_need("c", attention_need)
    freed_before = forecast.totals().pages_freed
    for tokens_a in range(142, 162):  # "c" decodes its 46th to 65th tokens beside vLLM's batch; no page free
        forecast.on_step([StepRequest("a", 9, tokens_a, 1, 40)], free_pages=0)
    assert forecast.kept_pages == kept_pages
    # and "a" at its floor frees a page at each of its two boundaries meanwhile (its 144th and 160th)
    assert forecast.totals().pages_freed - freed_before == freed + 2


def _priced_gate() -> AdmissionGate:
    """A gate whose step meter measured 30 ms a step's fixed part and 0.2 ms a prefilled token."""
    return AdmissionGate(BLOCK, 40, policy="projected", step_costs=_step_costs(fixed=0.03, per_token=0.0002))


def test_an_avoided_preemption_saves_its_recompute_and_the_width_of_the_steps_enforce_ran_it_in():
    gate = _priced_gate()
    costs = gate.step_costs.costs()
    assert costs is not None
    controller, forecast = _sparing_request(admission=gate)
    controller.admit("b", prompt_tokens=40, mode=Mode.MONITOR)
    forecast.on_step([StepRequest("a", 9, 141, 1, 40), StepRequest("b", 3, 45, 1, 40)], free_pages=0)
    forecast.on_preempt("b", steps_left=2, tokens=45)  # kept on the 4 spare pages: 45 tokens not recomputed
    assert forecast.kept_pages == 3 and forecast.totals().recompute_seconds_avoidable == 0.0  # not settled yet
    for tokens_a in (142, 143):  # vLLM runs "a" alone; enforce runs "b" beside it, in steps that run anyway
        forecast.on_step([StepRequest("a", 9, tokens_a, 1, 40)], free_pages=4)
    forecast.on_step([StepRequest("a", 9, 144, 1, 40)], free_pages=4)  # "b" would have ended: settled
    totals = forecast.totals()
    assert totals.preemptions_avoidable == 1
    assert totals.recompute_seconds_avoidable == pytest.approx(45 * costs.per_token_s, rel=1e-4)
    # two tokens, each in a step of vLLM's width 1: the whole fixed part of a step vLLM runs later
    assert totals.wider_batch_seconds == pytest.approx(2 * costs.fixed_s, rel=1e-4)


def test_a_waiting_request_enforce_admits_earlier_saves_the_width_of_its_tokens_and_no_recompute():
    gate = _priced_gate()
    costs = gate.step_costs.costs()
    assert costs is not None
    controller, forecast = _sparing_request(admission=gate)
    controller.admit("z", prompt_tokens=40, mode=Mode.MONITOR)  # vLLM runs a second request beside "a"
    running = [StepRequest("a", 9, 141, 1, 40), StepRequest("z", 3, 41, 1, 40)]
    forecast.on_step(running, free_pages=0, waiting=_waiting(40))  # "w" fits the 4 spare pages: admitted
    assert forecast.kept_pages == 3
    for _ in range(3):  # three steps of enforce running "w" where vLLM's batch of 2 waits for room
        forecast.on_step(running, free_pages=0, waiting=_waiting(40))
    assert forecast.totals().wider_batch_seconds == 0.0  # counted when it settles
    forecast.on_step(running + [StepRequest("w", 3, 40, 40, 40)], free_pages=0)  # vLLM admits it too
    totals = forecast.totals()
    assert totals.preemptions_avoidable == 0 and totals.recompute_seconds_avoidable == 0.0
    assert totals.wider_batch_seconds == pytest.approx(3 * costs.fixed_s / 2, rel=1e-4)


def test_vllm_running_a_kept_request_again_ends_what_enforce_owes_for_it():
    controller, forecast = _sparing_request(at_its_floor=False)
    controller.admit("b", prompt_tokens=40, mode=Mode.MONITOR)
    forecast.on_step([StepRequest("a", 9, 141, 1, 40), StepRequest("b", 3, 45, 1, 40)], free_pages=0)
    forecast.on_preempt("b", steps_left=None)
    assert forecast.kept_pages == 3
    freed = forecast.totals().pages_freed
    # vLLM's "a" holds 2 pages over enforce's 5 now and none is free: 3 owed, 1 short, so enforce's
    # relief takes a page off "a" (above its floor of 4) in this step, though vLLM preempts nothing
    forecast.on_step([StepRequest("a", 7, 142, 1, 40)], free_pages=0)
    assert forecast.shadows["a"].pages == 4 and forecast.totals().pages_freed == freed + 1
    # recomputed: both pools hold it again
    forecast.on_step([StepRequest("a", 7, 143, 1, 40), StepRequest("b", 3, 46, 46, 40)], free_pages=0)
    assert forecast.kept_pages == 0 and forecast.totals().preemptions_avoidable == 1


@pytest.mark.parametrize(("waiting_tokens", "admitted", "avoidable"), [
    (40, True, 1),  # its 3 pages fit the 4 spare: enforce admits it, one page is left for growth
    (100, False, 2),  # its 7 do not: it waits in both pools, and the spare pages are growth's
])
def test_enforce_admits_a_waiting_request_into_the_pages_its_compactions_spare(waiting_tokens, admitted, avoidable):
    controller, forecast = _sparing_request()
    forecast.on_step([StepRequest("a", 9, 141, 1, 40)], free_pages=0, waiting=_waiting(waiting_tokens))
    assert forecast.totals().spare_pages == 4 and forecast.kept_pages == (3 if admitted else 0)
    for request_id in ("c", "d"):  # vLLM preempts two requests it never let run (nothing of them to keep)
        controller.admit(request_id, prompt_tokens=40, mode=Mode.MONITOR)
        forecast.on_preempt(request_id)
    assert forecast.totals().preemptions_avoidable == avoidable
    # vLLM admits the waiting request too: both pools hold it, and it was never a preemption avoided
    forecast.on_step([StepRequest("a", 9, 142, 1, 40), StepRequest("w", 2, waiting_tokens, waiting_tokens, 40)],
                     free_pages=0)
    totals = forecast.totals()
    assert forecast.kept_pages == 0 and totals.preemptions_avoidable == avoidable
    assert totals.compactions == totals.pages_freed == 4  # no relief ran


def test_enforced_and_unknown_requests_are_left_out():
    controller = _controller(mode=Mode.ENFORCE)
    controller.admit("e", prompt_tokens=40, mode=Mode.ENFORCE)
    forecast = EnforceForecast(controller)
    forecast.on_step([StepRequest("e", 3, 40, 40, 40), StepRequest("x", 3, 40, 40, 40)], free_pages=0)
    forecast.on_preempt("e")
    forecast.on_preempt("x")
    assert forecast.shadows == {} and forecast.totals().preemptions == 0


def test_the_collector_serves_every_forecast_series_and_a_broken_forecast_is_counted_not_raised():
    from prometheus_client import CollectorRegistry, generate_latest

    from growpage.core.stats import StatsRecorder

    class Source:
        def __init__(self, forecast):
            self.forecast, self.stats = forecast, StatsRecorder()

    controller = _controller()
    source = Source(EnforceForecast(controller))
    registry = CollectorRegistry()
    registry.register(ForecastCollector(source, "m"))
    text = generate_latest(registry).decode()
    for spec in catalog.FORECAST_METRICS:
        assert f'{spec.name}{{model_name="m"}}' in text
    source.forecast = None
    assert "growpage_forecast" not in generate_latest(registry).decode()  # off: nothing to forecast

    class Broken:
        def totals(self):
            raise RuntimeError("boom")

    source.forecast = Broken()
    assert "growpage_forecast" not in generate_latest(registry).decode()
    assert source.stats.agent_errors_total["plugin"] == 1


def test_only_a_deployment_that_can_monitor_a_request_keeps_a_forecast():
    from growpage.vllm_plugin.scheduler_agent import may_monitor
    from growpage.vllm_plugin.settings import PluginSettings

    ignore = PluginSettings(client_mode="ignore")
    assert may_monitor(GrowPageConfig(mode=Mode.MONITOR), ignore)
    assert not may_monitor(GrowPageConfig(mode=Mode.OFF), PluginSettings(client_mode="honour"))
    assert not may_monitor(GrowPageConfig(mode=Mode.ENFORCE), ignore)  # every request enforced: no work per step
    assert may_monitor(GrowPageConfig(mode=Mode.ENFORCE, enforce_namespaces=("a",)), ignore)  # the rest monitored
    assert may_monitor(GrowPageConfig(mode=Mode.ENFORCE), PluginSettings(client_mode="honour"))  # clients may ask


def _waiting_scheduler(controller: GrowthController, running: list[str], waiting: list[str]):
    """vLLM's scheduler as the forecast reads it before a step: 96-token prompts that may decode 160
    tokens (16 pages of 16 at their ends), each running one holding 6 pages."""
    def request(request_id: str):
        return types.SimpleNamespace(request_id=request_id, num_prompt_tokens=96, num_output_tokens=0,
                                     num_computed_tokens=96, num_tokens=96, max_tokens=160, status=None,
                                     sampling_params=types.SimpleNamespace(extra_args={}))

    single = types.SimpleNamespace(req_to_blocks={request_id: [object()] * 6 for request_id in running})
    manager = types.SimpleNamespace(coordinator=types.SimpleNamespace(single_type_managers=[single]))
    return types.SimpleNamespace(running=[request(r) for r in running], waiting=[request(w) for w in waiting],
                                 kv_cache_manager=manager, max_num_active_reqs=16)


@pytest.mark.parametrize("enforce_admits_so", [True, False])
def test_a_preemption_of_a_request_admission_would_have_held_is_avoidable_whatever_the_room(enforce_admits_so):
    controller = _controller()
    for request_id in ("a", "b"):
        controller.admit(request_id, prompt_tokens=96, mode=Mode.MONITOR)
    forecast = EnforceForecast(controller, AdmissionGate(BLOCK, 40, policy="projected"),
                               enforce_admits_so=enforce_admits_so)
    # a and b run; c and d wait: 3 x 16 pages would not fit 40, so admission starts neither
    forecast.before_schedule(_waiting_scheduler(controller, ["a", "b"], ["c", "d"]), limit=16)
    for request_id in ("c", "d"):  # vLLM starts both anyway (their prompts fit now)
        controller.admit(request_id, prompt_tokens=96, mode=Mode.MONITOR)
    forecast.on_step([StepRequest(r, 6, 96, 96, 96) for r in "abcd"], free_pages=0, waiting=_waiting(200))
    assert [r for r, shadow in forecast.shadows.items() if shadow.over_projection] == ["c", "d"]
    forecast.on_preempt("d")  # requests wait (no room would count), yet admission never started d
    forecast.on_preempt("a")  # admitted within the projection: the room rule decides, and it says no
    totals = forecast.totals()
    assert (totals.preemptions, totals.preemptions_avoidable_by_admission) == (2, 1)
    # among what enforce avoids only where enforce runs that admission
    assert totals.preemptions_avoidable == (1 if enforce_admits_so else 0)


def _step_costs(*, fixed: float, per_token: float) -> StepCostFit:
    """A fit of ``fixed + 0.001 x requests + per_token x extra tokens`` seconds a step."""
    fit = StepCostFit()
    for step in range(64):
        requests, extra = 1 + step % 8, (200 if step % 5 == 0 else 0)
        fit.record(requests=requests, tokens=requests + extra, seconds=fixed + 0.001 * requests + per_token * extra)
    return fit


@pytest.mark.parametrize(("step_costs", "counted"), [
    (None, False),  # unmeasured: enforce looks ahead on its prior only until its own fit is ready
    (_step_costs(fixed=0.001, per_token=0.01), True),  # a recompute is dear: enforce holds the start
    (_step_costs(fixed=0.03, per_token=0.0002), False),  # the width is dear: enforce admits as vLLM does
])
def test_under_measured_admission_a_start_counts_as_held_only_where_the_measured_costs_say_enforce_holds_it(
        step_costs, counted):
    controller = _controller()
    for request_id in ("a", "b"):
        controller.admit(request_id, prompt_tokens=96, mode=Mode.MONITOR)
    gate = AdmissionGate(BLOCK, 40, policy="measured", step_costs=step_costs, prior_costs=LOOK_AHEAD_PRIOR)
    forecast = EnforceForecast(controller, gate, enforce_admits_so=True)
    forecast.before_schedule(_waiting_scheduler(controller, ["a", "b"], ["c", "d"]), limit=16)
    for request_id in ("c", "d"):
        controller.admit(request_id, prompt_tokens=96, mode=Mode.MONITOR)
    forecast.on_step([StepRequest(r, 6, 96, 96, 96) for r in "abcd"], free_pages=0, waiting=_waiting(200))
    forecast.on_preempt("d")
    totals = forecast.totals()
    assert totals.preemptions_avoidable_by_admission == 1  # what growth-aware admission would buy, always
    assert totals.preemptions_avoidable == int(counted)


@pytest.mark.parametrize(("prior", "would_hold"), [(LOOK_AHEAD_PRIOR, {"d"}), (ADMIT_PRIOR, {"c", "d"})])
def test_the_forecast_plans_a_measuring_start_only_where_enforce_looks_ahead_on_its_prior(prior, would_hold):
    """Enforce on a prior that looks ahead starts one request more until a prefill prices a token;
    on a prior that admits it plans nothing, and neither does the forecast of it."""
    controller = _controller()
    for request_id in ("a", "b"):
        controller.admit(request_id, prompt_tokens=96, mode=Mode.MONITOR)
    fit = StepCostFit()
    fit.record(requests=2, tokens=2, seconds=0.02)  # one warm decode step: no token priced yet
    gate = AdmissionGate(BLOCK, 40, policy="measured", step_costs=fit, prior_costs=prior)
    forecast = EnforceForecast(controller, gate, enforce_admits_so=True)
    forecast.before_schedule(_waiting_scheduler(controller, ["a", "b"], ["c", "d"]), limit=16)
    for request_id in ("c", "d"):  # vLLM starts both (monitor changes nothing)
        controller.admit(request_id, prompt_tokens=96, mode=Mode.MONITOR)
    forecast.on_step([StepRequest(r, 6, 96, 96, 96) for r in "abcd"], free_pages=0)
    assert {r for r, shadow in forecast.shadows.items() if shadow.over_projection} == would_hold


def test_without_growth_aware_admission_nothing_is_marked():
    controller = _controller()
    forecast = EnforceForecast(controller)  # admission: vllm
    forecast.before_schedule(_waiting_scheduler(controller, ["a", "b"], ["c"]), limit=16)
    controller.admit("c", prompt_tokens=96, mode=Mode.MONITOR)
    forecast.on_step([StepRequest("c", 6, 96, 96, 96)], free_pages=0)
    assert not forecast.shadows["c"].over_projection


def test_the_forecasts_admission_learns_monitored_requests_attention_need():
    controller = _controller()
    forecast = EnforceForecast(controller, AdmissionGate(BLOCK, 40, policy="projected"))
    for index in range(4):  # monitored requests whose attention needed 64 of their 256 tokens
        request_id = f"done{index}"
        controller.admit(request_id, prompt_tokens=96, mode=Mode.MONITOR)
        controller.update_attention_need(request_id, 64)
        forecast.on_finish(types.SimpleNamespace(request_id=request_id, num_tokens=256, num_output_tokens=160,
                                                 max_tokens=160, status=None))
    assert forecast.admission.shares.need_share == 0.25
