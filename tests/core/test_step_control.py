"""The per-step controller call: pressure, the growth reserve, floors, boundaries and reclaims in one place;
and its pool arithmetic alone: growth and the next admission against free pages, whom to compress, never
below a floor."""

from __future__ import annotations

import dataclasses

from growpage.config import GrowPageConfig, Mode
from growpage.core.controller import GrowthController, Reading
from growpage.core.methods import build_method
from growpage.core.policy import Action, Reason
from growpage.core.step_control import (
    ReclaimCandidate,
    RequestView,
    StepPool,
    enforceable_action,
    evict_pages_after,
    floor_pages,
    holds_everyone,
    measure_pressure,
    plan_reclaim,
)
from support.factories import FakeClock

VLLM = frozenset((Action.ALLOCATE, Action.EVICT, Action.PREEMPT))


def make_controller(method=None, **config) -> GrowthController:
    defaults = dict(mode="enforce", block_size=4, base_pages=3, sink_tokens=1, recent_window_tokens=2,
                    growth_coefficient=0.0, lts_grow_threshold=100.0, max_growth_rate=100.0)
    defaults.update(config)
    return GrowthController(GrowPageConfig(**defaults), num_layers=None, clock=FakeClock(),
                            **({"method": method} if method else {}))


def admit(controller: GrowthController, request_id: str, lts: float = 1.0, mode: str = "enforce") -> None:
    controller.admit(request_id, prompt_tokens=2, mode=mode, pages_granted=1)
    controller.update_reading(request_id, Reading(sts_density=0.0, lts_entropy=lts))


def view(request_id: str, held: int, *, allowance: int | None = None, needs_page: bool = False,
         protected: int = 3, compressible: bool = True) -> RequestView:
    return RequestView(request_id, pages_held=held, allowance_pages=held if allowance is None else allowance,
                       needs_page=needs_page, protected_tokens=protected, compressible=compressible,
                       can_evict=compressible)


def test_the_floor_is_base_pages_or_the_protected_tokens_plus_the_next_page():
    assert floor_pages(3, protected=3, block_size=4) == 3
    assert floor_pages(3, protected=13, block_size=4) == 5  # 4 pages of protected tokens + the next one
    assert floor_pages(3, protected=3, block_size=4, attention_tokens=13) == 5  # what attention needs counts alike
    # a boundary eviction never goes below the floor, and only pays if it saves a page over growing
    at_cap = view("r", 6, needs_page=True)
    assert evict_pages_after(at_cap, floor=3, pages_to_free=1) == 6
    assert evict_pages_after(at_cap, floor=3, pages_to_free=5) == 3
    assert evict_pages_after(view("r", 3, needs_page=True), floor=4, pages_to_free=1) is None
    assert evict_pages_after(view("r", 6, needs_page=True, compressible=False), floor=3, pages_to_free=1) is None


def test_actions_a_home_cannot_carry_out_degrade_and_growth_needs_a_free_page():
    assert enforceable_action(Action.QUANTIZE, can_evict=True, free_pages=2, enforceable=VLLM) is Action.EVICT
    assert enforceable_action(Action.DEFER, can_evict=False, free_pages=2, enforceable=VLLM) is Action.ALLOCATE
    assert enforceable_action(Action.QUANTIZE, can_evict=False, free_pages=2) is Action.QUANTIZE  # the reference home
    assert enforceable_action(Action.ALLOCATE, can_evict=False, free_pages=0) is Action.PREEMPT


def test_a_narrow_request_at_its_cap_evicts_and_the_pool_is_not_touched():
    controller = make_controller()
    admit(controller, "r")
    control = controller.plan_step(StepPool(free_pages=5, total_pages=20), [view("r", 4, needs_page=True)])
    (plan,) = control.boundaries
    assert (plan.action, plan.pages_after, plan.enforced) == (Action.EVICT, 4, True)
    assert control.reclaims == () and control.reserve_pages == 0


def test_growth_reserves_pages_for_the_others_and_the_next_admission():
    controller = make_controller()
    for request_id in ("a", "b"):
        admit(controller, request_id)
    views = [view("a", 3, needs_page=True, compressible=False), view("b", 3, needs_page=True, compressible=False)]
    control = controller.plan_step(StepPool(free_pages=6, total_pages=20, waiting_prompt_tokens=7), views)
    # b's page this step and the waiting request's 2 pages ((7 + 1) / 4)
    assert control.pressure.admission_pages == 2 and control.reserve_pages == 1 + 2
    # admission is not reserved while it would break a running request's floor
    tight = controller.plan_step(StepPool(free_pages=6, total_pages=8, waiting_prompt_tokens=7), views)
    assert tight.pressure.admission_pages == 0


def test_pressure_compresses_the_lowest_entropy_request_down_to_its_floor_and_no_further():
    controller = make_controller()
    admit(controller, "grower", lts=2.0)
    admit(controller, "broad", lts=3.0)
    admit(controller, "narrow", lts=0.5)
    views = [view("grower", 3, needs_page=True, compressible=False),  # shared blocks: cannot compress
             view("broad", 6), view("narrow", 5, protected=9)]  # narrow's floor: 9 tokens -> 3 pages + 1
    control = controller.plan_step(StepPool(free_pages=0, total_pages=20), views, enforceable=VLLM)
    (plan,) = control.boundaries
    assert plan.action is Action.PREEMPT and plan.fallback is Action.ALLOCATE  # grows into the room made
    assert [(r.request_id, r.pages_after) for r in control.reclaims] == [("narrow", 4)]
    # more missing than narrow can give: broad gives the rest, floors hold
    control = controller.plan_step(StepPool(free_pages=0, total_pages=20, waiting_prompt_tokens=9), views,
                                   enforceable=VLLM)
    assert [(r.request_id, r.pages_after) for r in control.reclaims] == [("narrow", 4), ("broad", 3)]


def test_a_request_is_never_compressed_below_what_its_attention_needs():
    controller = make_controller()
    admit(controller, "narrow", lts=0.5)
    admit(controller, "broad", lts=3.0)
    views = [view("narrow", 8), view("broad", 8)]
    assert [(r.request_id, r.pages_after) for r in controller.plan_relief(6, views)] == [("narrow", 3), ("broad", 7)]
    waiting = StepPool(free_pages=6, total_pages=12, waiting_prompt_tokens=7)
    assert controller.plan_step(waiting, views).pressure.admission_pages == 2
    controller.update_attention_need("narrow", 21)  # 21 tokens: 6 pages of 4, and the next token's page
    controller.update_attention_need("narrow", 5)  # read after a compaction: shares of the survivors
    assert controller.requests["narrow"].attention_tokens == 21
    assert controller.floor_of(views[0]) == 7
    relief = controller.plan_relief(6, views)
    assert [(r.request_id, r.pages_after) for r in relief] == [("narrow", 7), ("broad", 3)]  # broad gives the rest
    # a boundary eviction stops at the need too, and the floors it adds up keep a waiting request out
    at_cap = controller.plan_step(StepPool(free_pages=5, total_pages=20), [view("narrow", 8, needs_page=True)])
    assert at_cap.boundary("narrow").pages_after == 8
    assert controller.plan_step(waiting, views).pressure.admission_pages == 0  # 7 + 3 + 3 floor pages > 12


def test_monitor_decides_without_acting_and_methods_without_relief_leave_pressure_to_the_engine():
    controller = make_controller(mode="monitor")
    admit(controller, "r", mode="monitor")
    control = controller.plan_step(StepPool(free_pages=0, total_pages=20),
                                   [view("r", 4, needs_page=True), view("x", 6)])
    (plan,) = control.boundaries
    assert not plan.enforced and control.reclaims == ()
    no_relief = make_controller(method=build_method("growpage_no_pressure"))
    admit(no_relief, "r")
    assert no_relief.plan_relief(3, [view("r", 8)]) == []


def test_a_home_that_records_monitored_boundaries_itself_gets_only_the_enforced_ones():
    controller = make_controller()
    admit(controller, "m", mode="monitor")
    admit(controller, "e")
    views = [view("m", 4, needs_page=True), view("e", 4, needs_page=True)]
    control = controller.plan_step(StepPool(5, 20), views, decide_modes=frozenset((Mode.ENFORCE,)))
    assert [b.request_id for b in control.boundaries] == ["e"]


def test_growpage_when_it_pays_grows_while_nothing_waits_and_compresses_once_a_request_does():
    controller = make_controller(method=build_method("growpage_when_it_pays"))
    admit(controller, "r")
    at_cap = [view("r", 4, needs_page=True)]
    quiet = controller.plan_step(StepPool(free_pages=5, total_pages=20), at_cap)
    assert [(b.action, b.call.decision.reason) for b in quiet.boundaries] == [(Action.ALLOCATE, Reason.NO_PRESSURE)]
    waiting = controller.plan_step(StepPool(free_pages=5, total_pages=20, waiting_prompt_tokens=7), at_cap)
    assert [b.action for b in waiting.boundaries] == [Action.EVICT]  # it widens the batch
    empty = controller.plan_step(StepPool(free_pages=0, total_pages=20), at_cap)
    assert [b.action for b in empty.boundaries] == [Action.EVICT]  # it avoids a preemption


def test_with_room_for_every_request_growpage_grows_where_it_would_compress_and_a_fixed_cap_still_caps():
    at_cap = [view("r", 4, needs_page=True)]
    for method in ("growpage", "growpage_when_it_pays"):
        controller = make_controller(method=build_method(method))
        admit(controller, "r")
        roomy = controller.plan_step(StepPool(free_pages=5, total_pages=20, room_for_all=True), at_cap)
        assert [(b.action, b.pages_after, b.call.decision.reason) for b in roomy.boundaries] == [
            (Action.ALLOCATE, 5, Reason.ROOM_FOR_ALL)], method
    controller = make_controller()
    admit(controller, "r")
    assert [b.action for b in controller.plan_step(StepPool(5, 20), at_cap).boundaries] == [Action.EVICT]
    cap = make_controller(method=build_method("streaming_llm"))
    admit(cap, "r")
    capped = cap.plan_step(StepPool(free_pages=5, total_pages=20, room_for_all=True), at_cap)
    assert [b.action for b in capped.boundaries] == [Action.EVICT]  # a fixed budget is the baseline it is


def test_while_compression_is_idle_growpage_grows_or_leaves_the_request_to_the_engine_and_makes_no_room():
    controller = make_controller()
    admit(controller, "r")
    at_cap = [view("r", 4, needs_page=True)]
    idle = controller.plan_step(StepPool(free_pages=5, total_pages=20, waiting_prompt_tokens=7,
                                         compression_idle=True), at_cap, enforceable=VLLM)
    assert [(b.action, b.call.decision.reason) for b in idle.boundaries] == [(Action.ALLOCATE, Reason.WOULD_NOT_PAY)]
    # no page free: vLLM alone would preempt, and so does the idle gate (no relief compresses the others)
    admit(controller, "narrow", lts=0.5)
    views = [view("r", 4, needs_page=True), view("narrow", 6)]
    empty = controller.plan_step(StepPool(free_pages=0, total_pages=20, compression_idle=True), views,
                                 enforceable=VLLM)
    assert [(b.action, b.fallback) for b in empty.boundaries] == [(Action.PREEMPT, Action.PREEMPT)]
    assert empty.reclaims == ()
    on = controller.plan_step(StepPool(free_pages=0, total_pages=20), views, enforceable=VLLM)
    assert [b.action for b in on.boundaries] == [Action.EVICT]  # the same step with the gate open compresses


def test_an_idle_gate_still_compresses_a_fresh_prompt_for_admission_and_leaves_the_caps_alone():
    controller = make_controller(attention_coverage=0.95)
    admit(controller, "fresh")
    controller.update_attention_need("fresh", 9)
    prompt = dataclasses.replace(view("fresh", 8), prompt_uncompressed=True)
    blocked = controller.plan_step(StepPool(free_pages=1, total_pages=20, waiting_prompt_tokens=7,
                                            compression_idle=True), [prompt])
    assert [(c.request_id, c.pages_after) for c in blocked.prompt_compressions] == [("fresh", 4)]
    # where the engine's steps say one more request buys less than the work its width switches on,
    # the idle gate leaves the prompt whole; an open gate compresses it whatever the width buys
    unpaid = StepPool(free_pages=1, total_pages=20, waiting_prompt_tokens=7, compression_idle=True,
                      wider_batch_pays=False)
    assert controller.plan_step(unpaid, [prompt]).prompt_compressions == ()
    opened = controller.plan_step(dataclasses.replace(unpaid, compression_idle=False), [prompt])
    assert [(c.request_id, c.pages_after) for c in opened.prompt_compressions] == [("fresh", 4)]
    for method in ("streaming_llm", "growpage_no_sts"):  # a baseline and an ablation compress as decided
        other = make_controller(method=build_method(method))
        admit(other, "r")
        plan = other.plan_step(StepPool(free_pages=0, total_pages=20, compression_idle=True),
                               [view("r", 4, needs_page=True)], enforceable=VLLM)
        assert [b.action for b in plan.boundaries] == [Action.EVICT], method


def test_room_for_all_never_turns_a_compression_into_growth_the_pool_or_the_rate_refuses():
    controller = make_controller(max_growth_rate=0.001)
    admit(controller, "r")
    controller.requests["r"].growth_budget_pages = 0.0  # spent: the rate refuses growth this step
    control = controller.plan_step(StepPool(free_pages=5, total_pages=20, room_for_all=True),
                                   [view("r", 4, needs_page=True)])
    assert [b.action for b in control.boundaries] == [Action.EVICT]


def test_the_pool_holds_everyone_only_when_every_request_still_fits_at_its_full_length():
    assert holds_everyone(6, [2, 0, 4])
    assert not holds_everyone(6, [2, 0, 5])
    assert holds_everyone(0, [])
    assert holds_everyone(3, [-2, 3])  # a request holding more than it needs frees nothing for the others

    def queue():  # a long queue is read only until the pool is exceeded
        yield from (1, 1)
        yield 10
        raise AssertionError("read past the request the pool cannot hold")

    assert not holds_everyone(5, queue())


def test_growpage_compresses_a_fresh_prompt_to_its_floor_only_when_a_waiting_request_cannot_be_admitted():
    controller = make_controller(attention_coverage=0.95)
    admit(controller, "fresh")
    controller.update_attention_need("fresh", 9)  # its prompt's attention needs 9 tokens: 3 pages + the next
    prompt = dataclasses.replace(view("fresh", 8), prompt_uncompressed=True)
    room = controller.plan_step(StepPool(free_pages=6, total_pages=20, waiting_prompt_tokens=7), [prompt])
    assert room.prompt_compressions == ()  # the waiting request fits as it is: the prompt stays whole
    quiet = controller.plan_step(StepPool(free_pages=0, total_pages=20), [prompt])
    assert quiet.prompt_compressions == ()  # nothing waits: nothing to widen
    blocked = controller.plan_step(StepPool(free_pages=1, total_pages=20, waiting_prompt_tokens=7), [prompt])
    assert [(c.request_id, c.pages_after) for c in blocked.prompt_compressions] == [("fresh", 4)]
    settled = controller.plan_step(StepPool(free_pages=1, total_pages=20, waiting_prompt_tokens=7), [view("fresh", 8)])
    assert settled.prompt_compressions == ()  # once decoding started the prompt rule is done with it
    # with the floor alone (no attention need measured) nothing says what the answer needs: whole
    floor_alone = make_controller()
    admit(floor_alone, "fresh")
    blocked_too = floor_alone.plan_step(StepPool(free_pages=1, total_pages=20, waiting_prompt_tokens=7), [prompt])
    assert blocked_too.prompt_compressions == ()
    # a fixed cap compresses its prompt to the cap whether or not anyone waits
    cap = make_controller(method=build_method("h2o"))
    admit(cap, "fresh")
    quiet_cap = cap.plan_step(StepPool(free_pages=6, total_pages=20), [prompt])
    assert [c.pages_after for c in quiet_cap.prompt_compressions] == [3]


def pressure(**overrides):
    values = dict(free_pages=4, total_pages=40, growth_pages=2, running_floor_pages=20, waiting_prompt_pages=3,
                  waiting_floor_pages=4, batch_full=False)
    values.update(overrides)
    return measure_pressure(**values)


def test_growth_plus_admission_beyond_the_free_pages_is_pressure():
    assert pressure().deficit_pages == 1 and pressure().under_pressure
    assert not pressure(free_pages=5).under_pressure


def test_admission_counts_only_when_it_can_happen_without_breaking_floors():
    assert pressure(waiting_prompt_pages=None).admission_pages == 0
    assert pressure(batch_full=True).admission_pages == 0
    # the waiting request's floor would push the running ones below theirs: it waits, nobody compresses for it
    assert pressure(running_floor_pages=38).admission_pages == 0
    assert pressure(running_floor_pages=36).admission_pages == 3


def test_reclaim_takes_low_entropy_requests_first_and_respects_floors():
    candidates = [
        ReclaimCandidate("broad", pages_held=9, floor_pages=4, lts_entropy=2.6, needs_page=False),
        ReclaimCandidate("narrow", pages_held=6, floor_pages=4, lts_entropy=1.2, needs_page=False),
        ReclaimCandidate("at-floor", pages_held=4, floor_pages=4, lts_entropy=0.5, needs_page=False),
    ]
    plan = plan_reclaim(3, candidates)
    # "narrow" (lowest entropy with room) gives 2 (6 -> 4 pages), then "broad" gives the last one
    assert [(r.request_id, r.pages_after, r.pages_gained) for r in plan] == [("narrow", 4, 2), ("broad", 8, 1)]
    assert sum(r.pages_gained for r in plan) == 3


def test_a_request_that_needs_a_page_anyway_gains_one_more_by_compressing():
    plan = plan_reclaim(2, [ReclaimCandidate("r", pages_held=5, floor_pages=4, lts_entropy=1.0, needs_page=True)])
    # it keeps 3 full pages + the one its next token takes: 5 held + 1 needed -> 4
    assert [(r.pages_after, r.pages_gained) for r in plan] == [(4, 2)]


def test_what_the_floors_cannot_cover_is_left_to_preemption():
    plan = plan_reclaim(10, [ReclaimCandidate("r", pages_held=6, floor_pages=4, lts_entropy=1.0, needs_page=False)])
    assert [(r.pages_after, r.pages_gained) for r in plan] == [(4, 2)]
    assert plan_reclaim(0, [ReclaimCandidate("r", 6, 4, 1.0, False)]) == []
