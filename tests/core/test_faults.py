"""The one fault guard every component uses: catch, count, log the first traceback per key."""

from __future__ import annotations

import collections
import logging

from growpage.core.faults import FaultGuard

LOGGER = logging.getLogger("growpage.test.faults")


def test_every_fault_is_counted_and_only_the_first_per_key_is_logged_with_its_traceback(caplog):
    counts: collections.Counter[str] = collections.Counter()
    guard = FaultGuard(lambda component: counts.update([component]), LOGGER, suffix="carrying on")
    with caplog.at_level(logging.DEBUG, logger=LOGGER.name):
        for _ in range(3):
            with guard.guard("observer", "observing failed"):
                raise ValueError("boom")
        for family in ("family_a", "family_b", "family_a"):
            with guard.guard("collector", "scrape failed", log_key=family):
                raise ValueError(family)
    assert counts == {"observer": 3, "collector": 3}
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 3  # observer once, each collector family once
    assert errors[0].exc_text and "boom" in errors[0].exc_text and "carrying on" in errors[0].getMessage()


def test_a_call_that_succeeds_returns_its_value_and_counts_nothing():
    counts: collections.Counter[str] = collections.Counter()
    guard = FaultGuard(lambda component: counts.update([component]), LOGGER)
    assert guard.call("plugin", "adding", lambda a, b: a + b, 2, 3) == 5
    assert not counts
