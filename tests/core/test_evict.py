"""Token selection for eviction: protected tokens survive, the least attended go first."""

import torch

from growpage.core.evict import protected_mask, select_keep, tokens_for_coverage, tokens_to_drop


def test_tokens_to_drop_frees_whole_pages():
    assert tokens_to_drop(64, 16, 1) == 16  # 4 full pages -> 3
    assert tokens_to_drop(60, 16, 1) == 12  # tail slack counts: 4 pages (last has 12) -> 3
    assert tokens_to_drop(64, 16, 2) == 32
    assert tokens_to_drop(10, 16, 1) == 10  # one partial page -> none
    assert tokens_to_drop(0, 16, 1) == 0


def test_keeps_sinks_and_recent_window_and_drops_lowest_scores():
    positions = torch.arange(20)
    scores = torch.tensor([0.0] * 20)
    scores[[5, 6, 7, 8]] = torch.tensor([0.9, 0.1, 0.8, 0.2])
    scores[4] = 0.95
    scores[9:16] = 0.5
    keep = select_keep(positions, scores, num_to_drop=3, logical_length=20, sink_tokens=4,
                       recent_window_tokens=4)
    dropped = set(torch.nonzero(~keep).flatten().tolist())
    assert dropped == {6, 8, 9}  # 0.1, 0.2, then the oldest of the 0.5 ties
    assert keep[:4].all() and keep[16:].all()


def test_zero_scored_sinks_are_still_kept():
    positions = torch.arange(12)
    scores = torch.ones(12)
    scores[:2] = 0.0
    keep = select_keep(positions, scores, 4, 12, sink_tokens=2, recent_window_tokens=2)
    assert keep[:2].all() and int((~keep).sum()) == 4


def test_returns_none_when_protected_tokens_leave_too_few_candidates():
    positions = torch.arange(10)
    assert select_keep(positions, torch.zeros(10), 5, 10, sink_tokens=4, recent_window_tokens=2) is None
    assert select_keep(positions, torch.zeros(10), 4, 10, sink_tokens=4, recent_window_tokens=2) is not None


def test_protection_is_by_logical_position_after_earlier_evictions():
    positions = torch.tensor([0, 1, 7, 9, 30, 31])  # holes from earlier evictions
    mask = protected_mask(positions, logical_length=32, sink_tokens=2, recent_window_tokens=3)
    assert mask.tolist() == [True, True, False, False, True, True]


def test_tokens_for_coverage_counts_protected_tokens_and_the_fewest_others_holding_the_share():
    scores = torch.tensor([50.0, 1.0, 6.0, 3.0, 0.0, 9.0])  # the sink's mass is left out of the share
    protected = torch.tensor([True, False, False, False, False, True])
    # others: 6, 3, 1, 0 (total 10): 6 holds 60 %, 6+3 holds 90 %, 6+3+1 all of it
    assert tokens_for_coverage(scores, protected, 0.5) == 2 + 1
    assert tokens_for_coverage(scores, protected, 0.9) == 2 + 2
    assert tokens_for_coverage(scores, protected, 0.95) == 2 + 3
    assert tokens_for_coverage(scores, protected, 1.0) == 2 + 3  # a token nobody attends is never needed
    assert tokens_for_coverage(torch.zeros(6), protected, 0.95) == 2  # nothing observed: protected only
    assert tokens_for_coverage(scores, torch.ones(6, dtype=torch.bool), 0.95) == 6
