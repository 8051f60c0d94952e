"""Pool pressure: growth and the next admission against free pages; whom to compress, never below a floor."""

from __future__ import annotations

from growpage.core.pressure import ReclaimCandidate, measure_pressure, plan_reclaim


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
