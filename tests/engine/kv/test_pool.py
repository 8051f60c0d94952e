"""Page ledger: states, sharing, and the accounting invariant under random operations."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from growpage.engine.kv.pool import PagePool, PageState, PoolExhausted
from growpage.errors import GrowPageError


def test_reserve_use_release_cycle():
    pool = PagePool(4)
    pages = pool.reserve(3)
    assert (pool.num_free, pool.num_reserved, pool.num_used) == (1, 3, 0)
    pool.mark_used(pages[0])
    assert pool.state(pages[0]) is PageState.USED
    for page in pages:
        pool.release(page)
    assert pool.num_free == 4
    pool.check_invariants()


def test_no_over_commit():
    pool = PagePool(2)
    assert not pool.can_reserve(3)
    with pytest.raises(PoolExhausted):
        pool.reserve(3)
    assert pool.num_free == 2  # a refused reservation takes nothing


def test_empty_pool_is_a_user_error():
    with pytest.raises(GrowPageError, match="at least 1 page"):
        PagePool(0)


def test_published_pages_are_shared_and_survive_their_first_holder():
    pool = PagePool(2)
    page = pool.reserve(1)[0]
    pool.mark_used(page)
    pool.publish(page, block_hash=1234)
    assert pool.is_shared(page)  # hashed pages are read-only even with one holder
    assert pool.lookup(1234) == page
    pool.share(page)
    pool.release(page)
    assert pool.state(page) is PageState.USED and pool.lookup(1234) == page
    pool.release(page)
    assert pool.lookup(1234) is None and pool.num_free == 2
    pool.check_invariants()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["reserve", "use", "release", "publish", "share"]),
                          st.integers(0, 7)), max_size=60))
def test_ledger_invariant_under_random_operations(operations):
    pool = PagePool(8)
    holders: list[int] = []  # one entry per hold
    for op, arg in operations:
        if op == "reserve" and pool.can_reserve(arg % 3 + 1):
            holders.extend(pool.reserve(arg % 3 + 1))
        elif op == "use" and holders:
            page = holders[arg % len(holders)]
            if pool.state(page) is PageState.RESERVED:
                pool.mark_used(page)
        elif op == "release" and holders:
            pool.release(holders.pop(arg % len(holders)))
        elif op == "publish" and holders:
            page = holders[arg % len(holders)]
            if pool.state(page) is PageState.USED:
                pool.publish(page, block_hash=page * 1000 + arg)
        elif op == "share" and holders:
            page = holders[arg % len(holders)]
            if pool.lookup(page * 1000 + arg) == page:
                pool.share(page)
                holders.append(page)
        pool.check_invariants()
        assert pool.num_free + pool.num_reserved + pool.num_used == pool.num_pages
    for page in list(holders):
        pool.release(page)
    pool.check_invariants()
    assert pool.num_free == 8
