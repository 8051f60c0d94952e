"""How many clients the game day's storm grows to on a host (the storm itself runs in test_gameday)."""

from __future__ import annotations

from growpage.gameday.storm import WAIT_THRESHOLDS, concurrency_for


def test_a_faster_pod_gets_more_clients_so_a_queued_request_still_waits_past_the_threshold():
    slow = concurrency_for(0.5, ttft_threshold_s=2.5, floor=6)
    fast = concurrency_for(2.2, ttft_threshold_s=2.5, floor=6)  # what the AVX-512 host's pod completed
    assert slow < fast
    for clients, completed_per_s in ((slow, 0.5), (fast, 2.2)):
        added_wait_s = (clients - 6) / completed_per_s  # Little's law on a saturated pod
        assert added_wait_s >= WAIT_THRESHOLDS * 2.5


def test_the_count_stays_bounded_whatever_the_pod():
    assert concurrency_for(0.0, ttft_threshold_s=2.5, floor=6) == 6  # nothing completed: the floor
    assert concurrency_for(100.0, ttft_threshold_s=2.5, floor=6) == 48
    assert concurrency_for(100.0, ttft_threshold_s=2.5, floor=6, ceiling=20) == 20
