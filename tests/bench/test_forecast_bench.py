"""``gpctl bench vllm --part forecast`` without engines: how a forecast is scored against enforce."""

from __future__ import annotations

import math

from growpage.bench.forecast import FORECAST_TOLERANCE, compare, relative_error
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
