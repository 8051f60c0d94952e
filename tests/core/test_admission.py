"""Growth-aware admission's arithmetic: projections, who starts, and the learned shares."""

from __future__ import annotations

from growpage.core.admission import (
    MIN_FINISHED,
    CompletionHistory,
    KVDemand,
    admissible,
    full_peak_tokens,
    projected_demand,
)


def test_a_request_is_projected_to_its_max_tokens_scaled_by_the_output_share():
    assert full_peak_tokens(100, output_tokens=20, max_tokens=160, output_share=1.0) == 240
    assert full_peak_tokens(100, output_tokens=20, max_tokens=160, output_share=0.5) == 170
    assert full_peak_tokens(100, output_tokens=200, max_tokens=160, output_share=1.0) == 100  # past max: nothing


def test_an_enforced_request_is_projected_to_its_kept_share_never_below_what_it_holds():
    full = projected_demand("a", pages_now=3, peak_tokens=256, block_size=32)
    assert full == KVDemand("a", 3, 8)
    kept = projected_demand("a", pages_now=3, peak_tokens=256, block_size=32, kept_share=0.6)
    assert kept.peak_pages == 5  # ceil(8 * 0.6)
    assert projected_demand("a", pages_now=7, peak_tokens=256, block_size=32, kept_share=0.6).peak_pages == 7


def test_waiting_requests_start_in_order_while_the_projected_peaks_fit():
    running = [KVDemand("r1", 3, 8), KVDemand("r2", 3, 8)]
    waiting = [KVDemand(f"w{i}", 0, 8) for i in range(4)]
    assert admissible(running, waiting, total_pages=39) == 2  # 16 + 8 + 8 = 32; a fifth 8 makes 40
    assert admissible(running, waiting, total_pages=15) == 0
    # queue order: a large head is not skipped for a small one behind it (no starvation)
    assert admissible(running, [KVDemand("big", 0, 30), KVDemand("small", 0, 1)], total_pages=39) == 0


def test_an_empty_batch_always_takes_its_first_request():
    assert admissible([], [KVDemand("huge", 0, 500), KVDemand("next", 0, 1)], total_pages=39) == 1


def test_shares_stay_one_until_enough_requests_finished_then_follow_a_high_quantile():
    history = CompletionHistory()
    for _ in range(MIN_FINISHED - 1):
        history.record(output_tokens=40, max_tokens=160, peak_pages=4, full_pages=8)
    assert (history.shares().output_share, history.shares().kept_share) == (1.0, 1.0)
    history.record(output_tokens=40, max_tokens=160, peak_pages=4, full_pages=8)
    shares = history.shares()
    assert (shares.output_share, shares.kept_share, shares.finished) == (0.25, 0.5, MIN_FINISHED)
    for _ in range(20):  # a run of long answers raises the share: admission plans for the long ones
        history.record(output_tokens=160, max_tokens=160)
    assert history.shares().output_share == 1.0
    assert history.shares().kept_share == 0.5  # requests vLLM paged (not enforced) say nothing of it


def test_history_forgets_old_traffic():
    history = CompletionHistory(history=8)
    for _ in range(8):
        history.record(output_tokens=160, max_tokens=160)
    for _ in range(8):
        history.record(output_tokens=16, max_tokens=160)
    assert history.shares().output_share == 0.1
