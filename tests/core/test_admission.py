"""Growth-aware admission's arithmetic: projections to full KV or to GrowPage's floor, who starts,
and the learned shares."""

from __future__ import annotations

from growpage.core.admission import (
    MIN_FINISHED,
    CompletionHistory,
    Compression,
    KVDemand,
    admissible,
    full_peak_tokens,
    projected_demand,
    standing_need_share,
)

GROWPAGE = Compression(base_pages=4, sink_tokens=4, recent_window_tokens=64)  # a 128-token floor at 32


def test_a_request_is_projected_to_its_max_tokens_scaled_by_the_output_share():
    assert full_peak_tokens(100, output_tokens=20, max_tokens=160, output_share=1.0) == 240
    assert full_peak_tokens(100, output_tokens=20, max_tokens=160, output_share=0.5) == 170
    assert full_peak_tokens(100, output_tokens=200, max_tokens=160, output_share=1.0) == 100  # past max: nothing


def test_a_request_vllm_pages_is_projected_to_full_kv():
    assert projected_demand("a", pages_now=3, peak_tokens=256, block_size=32) == KVDemand("a", 3, 8)


def test_a_compressed_request_is_projected_to_its_floor_at_its_end_never_above_full_kv():
    # observed attention needs 30 % of its tokens: 77 of 256, 3 pages and the next token's: 4; base 4
    needy = Compression(4, 4, 64, need_share=0.3)
    assert projected_demand("a", pages_now=3, peak_tokens=256, block_size=32, compression=needy).peak_pages == 4
    # needing 60 %: 154 tokens, 5 pages + 1
    assert projected_demand("a", pages_now=3, peak_tokens=256, block_size=32,
                            compression=Compression(4, 4, 64, need_share=0.6)).peak_pages == 6
    # not observed yet: the learned share stands in (1.0 before any request finished: full KV)
    assert projected_demand("a", pages_now=3, peak_tokens=256, block_size=32, compression=GROWPAGE).peak_pages == 8
    assert projected_demand("a", pages_now=3, peak_tokens=256, block_size=32, compression=GROWPAGE,
                            learned_need_share=0.3).peak_pages == 4
    # a fixed cap keeps no attention need: its cap
    cap = Compression(5, 4, 64, need_share=0.0)
    assert projected_demand("a", pages_now=7, peak_tokens=256, block_size=32, compression=cap).peak_pages == 5


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
        history.record(output_tokens=40, max_tokens=160, need_share=0.5)
    assert (history.shares().output_share, history.shares().need_share) == (1.0, None)  # the caller stands in
    history.record(output_tokens=40, max_tokens=160, need_share=0.5)
    shares = history.shares()
    assert (shares.output_share, shares.need_share, shares.finished) == (0.25, 0.5, MIN_FINISHED)
    for _ in range(20):  # a run of long answers raises the share: admission plans for the long ones
        history.record(output_tokens=160, max_tokens=160)
    assert history.shares().output_share == 1.0
    assert history.shares().need_share == 0.5  # requests whose attention was not observed say nothing of it


def test_history_forgets_old_traffic():
    history = CompletionHistory(history=8)
    for _ in range(8):
        history.record(output_tokens=160, max_tokens=160)
    for _ in range(8):
        history.record(output_tokens=16, max_tokens=160)
    assert history.shares().output_share == 0.1


def test_before_requests_finish_an_unobserved_request_is_planned_like_the_neediest_running_one():
    assert standing_need_share(0.2, [Compression(4, 4, 64, need_share=0.9)]) == 0.2  # learned wins
    running = [Compression(4, 4, 64, need_share=0.1), Compression(4, 4, 64, need_share=0.4), None,
               Compression(4, 4, 64, need_share=None)]
    assert standing_need_share(None, running) == 0.4
    assert standing_need_share(None, [None, Compression(4, 4, 64)]) == 1.0  # nothing observed: every token
