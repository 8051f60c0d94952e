"""The growth contract table, branch by branch, at and around every threshold."""

import dataclasses

import pytest

from growpage.config import GrowPageConfig
from growpage.core.policy import (
    Action,
    BoundaryState,
    Reason,
    Refusal,
    capacity_boundary_pages,
    decide,
    refill_growth_budget,
)

CONFIG = GrowPageConfig(base_pages=10)
EPS = 1e-6


def at_boundary(**changes) -> BoundaryState:
    """A request sitting exactly on its capacity boundary with everything possible."""
    state = BoundaryState(pages_held=10, base_pages=10, sts_density=0.5, lts_entropy=0.0,
                          pool_free_pages=100, growth_budget_pages=5.0, can_quantize=True,
                          can_evict=True)
    state = dataclasses.replace(state, **changes)
    if "pages_held" not in changes:
        boundary = capacity_boundary_pages(state.base_pages, state.lts_entropy, CONFIG.growth_coefficient)
        state = dataclasses.replace(state, pages_held=int(boundary) + 1 if boundary % 1 else int(boundary))
    return state


def test_capacity_boundary_follows_lts():
    assert capacity_boundary_pages(128, 0.0, 0.2) == 128
    assert capacity_boundary_pages(128, 2.5, 0.2) == pytest.approx(192)
    assert capacity_boundary_pages(128, -1.0, 0.2) == 128  # entropy is never negative; clamp noise


@pytest.mark.parametrize("density, action", [
    (0.7 - EPS, Action.EVICT),  # just below: not dense, low LTS -> evict
    (0.7, Action.EVICT),  # at: "density > 0.7" is strict
    (0.7 + EPS, Action.QUANTIZE),  # just above: quantize
    (1.0, Action.QUANTIZE),
])
def test_density_threshold(density, action):
    decision = decide(at_boundary(sts_density=density, lts_entropy=1.0), CONFIG)
    assert decision.action is action
    assert decision.refusal is None


@pytest.mark.parametrize("lts, action", [
    (2.1 - EPS, Action.EVICT),
    (2.1, Action.EVICT),  # "LTS > 2.1" is strict
    (2.1 + EPS, Action.ALLOCATE),
])
def test_lts_threshold_at_low_density(lts, action):
    decision = decide(at_boundary(sts_density=0.2, lts_entropy=lts), CONFIG)
    assert decision.action is action
    expected_reason = Reason.BROAD_DEMAND if action is Action.ALLOCATE else Reason.NARROW_DEMAND
    assert decision.reason is expected_reason


def test_dense_wins_over_high_lts():
    decision = decide(at_boundary(sts_density=0.9, lts_entropy=5.0), CONFIG)
    assert (decision.action, decision.reason) == (Action.QUANTIZE, Reason.DENSE_WORKING_SET)


def test_below_capacity_boundary_grows_without_compressing():
    # LTS 2.5 -> boundary 10 * 1.5 = 15 pages; at 14 the request still grows freely.
    state = at_boundary(sts_density=0.9, lts_entropy=2.5, pages_held=14)
    assert decide(state, CONFIG).action is Action.ALLOCATE
    assert decide(state, CONFIG).reason is Reason.WITHIN_BOUNDARY
    assert decide(dataclasses.replace(state, pages_held=15), CONFIG).action is Action.QUANTIZE


def test_pool_exhausted_falls_back_to_compression_in_density_order():
    sparse = decide(at_boundary(sts_density=0.2, lts_entropy=3.0, pool_free_pages=0), CONFIG)
    assert (sparse.action, sparse.refusal) == (Action.EVICT, Refusal.DENIED)
    dense_within = decide(at_boundary(sts_density=0.9, lts_entropy=3.0, pages_held=11, pool_free_pages=0), CONFIG)
    assert (dense_within.action, dense_within.refusal) == (Action.QUANTIZE, Refusal.DENIED)


def test_throttle_falls_back_to_compression():
    decision = decide(at_boundary(sts_density=0.2, lts_entropy=3.0, growth_budget_pages=0.99), CONFIG)
    assert (decision.action, decision.refusal) == (Action.EVICT, Refusal.THROTTLED)
    exactly_one = decide(at_boundary(sts_density=0.2, lts_entropy=3.0, growth_budget_pages=1.0), CONFIG)
    assert exactly_one.action is Action.ALLOCATE


def test_other_compression_when_preferred_one_cannot_free_a_page():
    assert decide(at_boundary(sts_density=0.9, can_quantize=False), CONFIG).action is Action.EVICT
    assert decide(at_boundary(sts_density=0.2, can_evict=False), CONFIG).action is Action.QUANTIZE


def test_nothing_to_compress_allocates_if_it_can():
    decision = decide(at_boundary(sts_density=0.9, can_quantize=False, can_evict=False), CONFIG)
    assert (decision.action, decision.reason) == (Action.ALLOCATE, Reason.NOTHING_TO_COMPRESS)


def test_nothing_to_free_and_pool_empty_preempts():
    decision = decide(at_boundary(can_quantize=False, can_evict=False, pool_free_pages=0), CONFIG)
    assert (decision.action, decision.refusal) == (Action.PREEMPT, Refusal.DENIED)
    wanted_growth = decide(at_boundary(lts_entropy=3.0, sts_density=0.1, can_quantize=False,
                                       can_evict=False, pool_free_pages=0), CONFIG)
    assert (wanted_growth.action, wanted_growth.refusal) == (Action.PREEMPT, Refusal.DENIED)


def test_nothing_to_free_and_throttled_defers_instead_of_preempting():
    decision = decide(at_boundary(can_quantize=False, can_evict=False, growth_budget_pages=0.0), CONFIG)
    assert (decision.action, decision.refusal) == (Action.DEFER, Refusal.THROTTLED)


def test_thresholds_come_from_config():
    strict = GrowPageConfig(base_pages=10, density_threshold=0.95, lts_grow_threshold=0.5)
    assert decide(at_boundary(sts_density=0.9, lts_entropy=1.0), strict).action is Action.ALLOCATE


@pytest.mark.parametrize("elapsed_s, expected", [
    (0.0, 0.0),  # no time, no refill
    (0.5, 1.5),  # 0.3 * 10 pages * 0.5 s
    (1.0, 3.0),
    (10.0, 3.0),  # capped at one second of growth
])
def test_growth_budget_refills_at_max_growth_rate(elapsed_s, expected):
    assert refill_growth_budget(0.0, 10, elapsed_s, 0.3) == pytest.approx(expected)


def test_growth_budget_lets_small_requests_grow_one_page():
    # 0.3 * 2 pages = 0.6 pages/s: the bucket still holds a whole page after enough time.
    assert refill_growth_budget(0.0, 2, 100.0, 0.3) == pytest.approx(1.0)
    assert refill_growth_budget(0.0, 2, 1.0, 0.3) == pytest.approx(0.6)
