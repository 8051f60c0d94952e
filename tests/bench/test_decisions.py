"""Sampled observation against full observation, boundary by boundary."""

from growpage.bench.decisions import decision_agreement


def test_decisions_are_compared_at_the_same_boundary_even_when_a_request_meets_it_twice():
    full = [[0, 4, "allocate"], [1, 4, "evict"], [0, 5, "evict"], [1, 4, "allocate"]]  # request 1 preempted
    sampled = [[1, 4, "evict"], [0, 4, "allocate"], [0, 5, "allocate"], [1, 4, "allocate"]]
    result = decision_agreement(full, sampled)
    assert (result["boundaries"], result["matched"]) == (4, 4)
    assert result["agreement"] == 0.75  # only request 0's second boundary differs
    assert result["disagreements"] == {"evict->allocate": 1}
    assert result["by_kind_full"] == {"allocate": 2, "evict": 2}
    assert result["by_kind_sampled"] == {"allocate": 3, "evict": 1}


def test_boundaries_only_one_run_met_are_left_out_and_no_match_is_no_agreement():
    result = decision_agreement([[0, 4, "evict"], [2, 9, "evict"]], [[0, 4, "allocate"]])
    assert (result["boundaries"], result["matched"], result["agreement"]) == (2, 1, 0.0)
    assert decision_agreement([], [])["agreement"] is None


def test_a_decision_trace_reads_the_request_index_from_vllms_internal_request_id():
    # vLLM 0.32 appends "-" and 8 random characters to every request id; decisions of other runs
    # in the same engine are not this run's.
    import types

    from growpage.core.stats import StatsRecorder
    from growpage.tooling.vllm_child import DecisionTrace

    stats = StatsRecorder()
    trace = DecisionTrace(stats, "1.monitor-")
    stats.add_listener(trace)
    for request_id, pages, kind in (("1.monitor-12-1a2b3c4d", 5, "evict"), ("1.monitor-3-00000042", 4, "allocate"),
                                    ("1.monitor_full-3-9f8e7d6c", 4, "evict"), ("11.monitor-3-abcdef01", 4, "evict")):
        trace.on_decision(types.SimpleNamespace(request_id=request_id, pages_before=pages, kind=kind))
    assert trace.stop() == [[12, 5, "evict"], [3, 4, "allocate"]]
    assert trace not in stats.listeners


def test_freed_pages_count_a_boundary_eviction_against_growing_and_a_relief_by_what_it_cut():
    import types

    from growpage.core.stats import StatsRecorder
    from growpage.tooling.vllm_child import FreedPages

    stats = StatsRecorder()
    freed = FreedPages(stats)
    stats.add_listener(freed)
    for enforced, kind, reason, before, after in (
            (True, "evict", "budget_reached", 6, 6),  # at its boundary: the page it did not grow by
            (True, "evict", "pool_pressure", 8, 5),  # relief: what it cut
            (True, "evict", "prompt_budget", 10, 4),  # a prompt compressed for admission
            (False, "evict", "budget_reached", 9, 9),  # monitor's decision frees nothing
            (True, "allocate", "within_boundary", 4, 5)):
        freed.on_decision(types.SimpleNamespace(enforced=enforced, kind=kind, reason=reason, pages_before=before,
                                                pages_after=after))
    assert freed.stop() == 1 + 3 + 6 and freed not in stats.listeners
