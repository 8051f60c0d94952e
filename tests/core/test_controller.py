"""The controller both homes share: admission grant, boundary routine, layer choice, fault guard."""

from __future__ import annotations

import logging

import pytest

from growpage.config import GrowPageConfig, Mode
from growpage.core.controller import GrowthController, PoolView, Reading, ceil_div, observed_layer_indices
from growpage.core.methods import build_method
from growpage.core.policy import Action, Reason, Refusal
from support.factories import FakeClock


def make_controller(clock=None, method=None, **config) -> GrowthController:
    defaults = dict(mode="enforce", block_size=16, base_pages=4, max_growth_rate=1.0, sink_tokens=4,
                    recent_window_tokens=16)
    defaults.update(config)
    return GrowthController(GrowPageConfig(**defaults), num_layers=30, clock=clock or FakeClock(),
                            **({"method": method} if method else {}))


def test_observed_layers_are_interior_and_pinned_for_the_packaged_model():
    # SmolLM2-135M: 30 layers, 3 observed. Both homes use this one answer.
    assert observed_layer_indices(30, 3) == {8, 15, 22}
    assert observed_layer_indices(30, 1) == {15}
    assert observed_layer_indices(4, 10) == {0, 1, 2, 3}
    assert make_controller().observed_layers == {8, 15, 22}
    with pytest.raises(ValueError):
        observed_layer_indices(0, 3)


def test_ceil_div_counts_pages_for_tokens():
    assert [ceil_div(n, 16) for n in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]


def test_grant_is_on_demand_or_reserving_by_method():
    reserving = make_controller(method=build_method("growpage_reserving"))
    on_demand = make_controller()  # GrowPage's default, as vLLM admits
    # 20 prompt tokens + the first generated one fit in 2 pages of 16.
    assert on_demand.grant_pages(20) == 2
    assert reserving.grant_pages(20) == 4
    assert reserving.grant_pages(200) == ceil_div(201, 16)  # a long prompt gets what it needs


def test_admission_records_an_event_and_the_request_mode_can_only_be_lowered():
    controller = make_controller(mode="monitor")
    request = controller.admit("a", prompt_tokens=10, mode="enforce", pages_granted=1)
    assert request.mode is Mode.MONITOR
    assert controller.stats.pages_allocated_total == 1
    with pytest.raises(RuntimeError, match="already admitted"):
        controller.admit("a", prompt_tokens=10)


def test_boundary_routine_decides_records_and_spends_the_growth_budget():
    clock = FakeClock()
    controller = make_controller(clock=clock, max_growth_rate=0.25)  # 4 pages held: one page per second
    controller.admit("r", prompt_tokens=10, pages_granted=4)
    reading = Reading(sts_density=0.1, lts_entropy=3.0)  # broad demand: allocate
    # Capacity boundary 4 x (1 + 0.2 x 3.0) = 6.4 pages: at 7 the contract reads the summaries.
    call = controller.decide("r", pages_held=7, pool=PoolView(free_pages=10), can_quantize=False,
                             can_evict=True, reading=reading)
    assert call.decision.action is Action.ALLOCATE and call.decision.reason is Reason.BROAD_DEMAND
    event = controller.record_decision(call, kind=Action.ALLOCATE, enforced=True, pages_after=8)
    assert (event.kind, event.pages_before, event.pages_after, event.lts_entropy) == ("allocate", 7, 8, 3.0)
    assert controller.stats.decisions_total["allocate"] == 1
    # The budget is spent: at the same instant the next boundary is throttled and evicts instead.
    again = controller.decide("r", pages_held=8, pool=PoolView(free_pages=10), can_quantize=False, can_evict=True)
    assert again.decision.action is Action.EVICT and again.decision.refusal is Refusal.THROTTLED
    clock.now += 10.0  # it refills with time
    later = controller.decide("r", pages_held=8, pool=PoolView(free_pages=10), can_quantize=False, can_evict=True)
    assert later.decision.action is Action.ALLOCATE


def test_growth_yields_to_the_admission_reserve():
    controller = make_controller()
    controller.admit("r", prompt_tokens=10, pages_granted=4)
    reading = Reading(sts_density=0.1, lts_entropy=3.0)
    call = controller.decide("r", pages_held=7, pool=PoolView(free_pages=2, admission_reserve_pages=2),
                             can_quantize=False, can_evict=True, reading=reading)
    assert call.decision.action is Action.EVICT and call.decision.refusal is Refusal.DENIED


def test_release_reports_the_last_lts_reading_once():
    controller = make_controller()
    finished = []

    class Listener:
        def on_admit(self, event): pass
        def on_decision(self, event): pass
        def on_finish(self, event): finished.append(event)

    controller.stats.add_listener(Listener())
    controller.admit("never-observed", prompt_tokens=3)
    controller.admit("observed", prompt_tokens=3)
    controller.update_reading("observed", Reading(0.5, 2.25))
    controller.release("never-observed", "aborted", num_tokens=3)
    controller.release("observed", "finished", num_tokens=40)
    assert controller.release("observed", "finished", num_tokens=40) is None  # idempotent
    assert [(e.request_id, e.lts_entropy) for e in finished] == [("never-observed", None), ("observed", 2.25)]


def test_fault_guard_counts_every_fault_and_logs_the_first(caplog):
    controller = make_controller()
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            with controller.guard("observer", "observing failed"):
                raise ValueError("boom")
    assert controller.stats.agent_errors_total["observer"] == 3
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "observing failed" in errors[0].getMessage()


def test_pool_gauges_combine_the_homes_counts_with_the_controllers_view():
    controller = make_controller(growth_coefficient=0.5)
    controller.admit("a", prompt_tokens=3, namespace="team-a")
    controller.admit("off", prompt_tokens=3, mode="off")
    controller.update_reading("a", Reading(0.25, 2.0))
    gauges = controller.pool_gauges(num_pages=10, pages_free=6, pages_reserved=1, pages_used=3, live_tokens=40,
                                    granted_token_slots=64, used_token_slots=48, logical_bytes=400,
                                    stored_bytes=200)
    assert gauges.requests_running == 2
    assert gauges.capacity_boundaries == (4 * (1 + 0.5 * 2.0),)  # requests with GrowPage off have none
    assert gauges.lts_by_namespace == {"team-a": (2.0,)}
    assert gauges.utilization == 40 / 64 and gauges.compression_ratio == 2.0
