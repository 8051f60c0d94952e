"""Headroom and router load: free plus reclaimable pages, never below a floor; the load a router compares."""

from __future__ import annotations

from growpage.core.headroom import Floors, Headroom, RunningKV, headroom, reclaimable_pages
from growpage.core.step_control import floor_pages, protected_tokens

FLOORS = Floors(base_pages=3, block_size=4, sink_tokens=1, recent_window_tokens=4)


def kv(held: int, physical: int, shared: int = 0, compressible: bool = True) -> RunningKV:
    return RunningKV(pages_held=held, physical_tokens=physical, shared_prefix_pages=shared, compressible=compressible)


def test_reclaimable_is_what_compression_to_the_shared_floor_frees():
    # 10 pages, 40 tokens: the floor is base_pages 3 (sink + recent window = 5 tokens, 2 pages + 1)
    assert reclaimable_pages([kv(10, 40)], FLOORS) == 7
    # the same floor the pressure relief uses
    floor = floor_pages(3, protected_tokens(40, 0, 1, 4), 4)
    assert reclaimable_pages([kv(10, 40)], FLOORS) == 10 - floor


def test_a_long_shared_prefix_raises_the_floor_and_a_request_at_its_floor_gives_nothing():
    # 5 shared pages (20 tokens) + recent window 4 = 24 protected tokens: 6 pages + 1 for the next token
    assert reclaimable_pages([kv(10, 40, shared=5)], FLOORS) == 3
    assert reclaimable_pages([kv(3, 12)], FLOORS) == 0
    assert reclaimable_pages([kv(2, 8)], FLOORS) == 0  # below base_pages already: never negative


def test_what_a_requests_attention_needs_is_not_offered_to_the_router():
    needy = RunningKV(pages_held=10, physical_tokens=40, shared_prefix_pages=0, compressible=True, attention_tokens=21)
    assert reclaimable_pages([needy], FLOORS) == 10 - 7  # 21 tokens: 6 pages of 4, and the next token's page


def test_requests_grow_page_may_not_compress_add_nothing():
    """monitor, off, an enforcer that cannot run, or blocks shared past the prefix run."""
    assert reclaimable_pages([kv(10, 40, compressible=False)], FLOORS) == 0
    assert reclaimable_pages([kv(10, 40), kv(8, 32, compressible=False)], FLOORS) == 7


def test_load_is_percent_of_the_requests_the_replica_holds_without_preempting():
    idle = headroom(running=0, waiting=0, free_pages=30, used_pages=0, requests=(), floors=FLOORS)
    assert idle.load == 0 and idle.headroom_pages == 30
    # 2 running at 5 pages each, 10 free: room for 2 more -> 2 of 4 taken
    half = Headroom(running=2, waiting=0, free_pages=10, used_pages=10, reclaimable_pages=0, base_pages=3)
    assert half.capacity_requests == 4 and half.load == 50
    # queueing past capacity reads above 100
    assert Headroom(running=2, waiting=1, free_pages=0, used_pages=10, reclaimable_pages=0, base_pages=3).load == 150


def test_a_smaller_pool_reads_higher_with_the_same_requests_and_reclaimable_pages_lower_it():
    small = Headroom(running=2, waiting=0, free_pages=2, used_pages=10, reclaimable_pages=0, base_pages=3)
    large = Headroom(running=2, waiting=0, free_pages=40, used_pages=10, reclaimable_pages=0, base_pages=3)
    assert small.load > large.load
    elastic = Headroom(running=2, waiting=0, free_pages=2, used_pages=10, reclaimable_pages=8, base_pages=3)
    assert elastic.headroom_pages == 10 and elastic.load < small.load


def test_no_room_and_nothing_running_still_reads_a_finite_load():
    stuck = Headroom(running=0, waiting=3, free_pages=0, used_pages=0, reclaimable_pages=0, base_pages=3)
    assert stuck.load == 300
