"""``gpctl bench vllm --part forecast`` without engines: how a forecast is scored against enforce, in one
round and over repeated rounds, and the table a user reads."""

from __future__ import annotations

import math

import pytest

from growpage.bench.forecast import FORECAST_TOLERANCE, compare, compare_rounds, forecast_rows, relative_error
from growpage.bench.vllm_settings import PARTS


def _monitor(freed: int, avoidable: int, preemptions: int) -> dict:
    return {"forecast": {"pages_freed": freed, "compactions": freed, "preemptions": preemptions,
                         "preemptions_avoidable": avoidable, "spare_pages": 0}, "preemptions": preemptions}


def test_a_forecast_within_a_quarter_of_what_enforce_did_is_within_tolerance():
    enforce = {"pages_freed": 100, "preemptions": 2, "decisions": {"evict": 90}}
    result = compare(_monitor(freed=120, avoidable=9, preemptions=12), enforce)
    assert result["pages_freed"] == {"forecast": 120, "enforce": 100, "relative_error": 0.2}
    assert result["preemptions_avoided"]["enforce"] == 10 and result["preemptions_avoided"]["relative_error"] == 0.1
    assert result["within_tolerance"] and result["compactions"] == {"forecast": 120, "enforce_evictions": 90}
    assert not compare(_monitor(freed=60, avoidable=9, preemptions=12), enforce)["within_tolerance"]
    assert "forecast" in PARTS and FORECAST_TOLERANCE == 0.25


def test_nothing_forecast_where_enforce_did_nothing_is_right_and_something_is_infinitely_wrong():
    assert relative_error(0, 0) is None
    assert math.isinf(relative_error(3, 0))
    idle = {"pages_freed": 0, "preemptions": 0, "decisions": {}}
    assert compare(_monitor(freed=0, avoidable=0, preemptions=0), idle)["within_tolerance"]
    assert not compare(_monitor(freed=5, avoidable=0, preemptions=0), idle)["within_tolerance"]


def _enforce(freed: int, preemptions: int, evictions: int = 0) -> dict:
    return {"pages_freed": freed, "preemptions": preemptions, "decisions": {"evict": evictions}}


def test_the_verdict_reads_medians_over_the_rounds_so_one_odd_enforce_run_does_not_decide_it():
    # the same trace three times: enforce avoided 8, 1 and 1 preemptions (once it ran otherwise)
    rounds = [(_monitor(freed=40, avoidable=2, preemptions=14), _enforce(freed=44, preemptions=6, evictions=30)),
              (_monitor(freed=42, avoidable=2, preemptions=14), _enforce(freed=40, preemptions=13, evictions=28)),
              (_monitor(freed=38, avoidable=1, preemptions=14), _enforce(freed=41, preemptions=13, evictions=29))]
    result = compare_rounds(rounds)
    assert result["pages_freed"]["forecast"] == 40 and result["pages_freed"]["enforce"] == 41
    assert result["preemptions_avoided"]["forecast"] == 2 and result["preemptions_avoided"]["enforce"] == 1
    assert result["preemptions_avoided"]["relative_error"] == 1.0 and not result["within_tolerance"]
    assert result["compactions"] == {"forecast": 40, "enforce_evictions": 29}
    # the odd round is visible, not averaged away
    assert result["spread"]["preemptions_avoided_enforce"] == {"median": 1, "range": [1, 8], "values": [8, 1, 1]}
    assert result["spread"]["pages_freed_forecast"]["values"] == [40, 42, 38]
    assert [entry["preemptions_avoided"]["enforce"] for entry in result["rounds"]] == [8, 1, 1]
    assert result["rounds_within_tolerance"] == 1  # the third round alone: 38 against 41, 1 against 1


def test_one_round_compares_as_compare_does_and_no_round_is_refused():
    monitor = _monitor(freed=120, avoidable=9, preemptions=12)
    enforce = _enforce(freed=100, preemptions=2, evictions=90)
    once = compare_rounds([(monitor, enforce)])
    single = compare(monitor, enforce)
    for key in ("pages_freed", "preemptions_avoided", "compactions", "within_tolerance", "tolerance"):
        assert once[key] == single[key]
    assert once["rounds_within_tolerance"] == 1
    with pytest.raises(ValueError, match="at least one"):
        compare_rounds([])


def test_the_table_shows_each_count_as_forecast_over_enforce_with_ranges_and_skips_older_results():
    rounds = [(_monitor(freed=20, avoidable=4, preemptions=10), _enforce(freed=22, preemptions=6)),
              (_monitor(freed=24, avoidable=4, preemptions=10), _enforce(freed=20, preemptions=5))]
    entry = {"seed": 32, **compare_rounds(rounds)}
    older = {"seed": 9, **compare(*rounds[0])}  # a JSON written when each arm ran once
    assert forecast_rows({"forecasts": [older, entry]}) == [
        ("32", "22 [20-24] / 21 [20-22]", "4 [4-4] / 4.5 [4-5]", "2/2", "within")]
    assert forecast_rows({}) == []
