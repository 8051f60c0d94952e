"""The cumulative state behind the collector: bucket semantics, the windowed compress ratio, p95."""

import math

import pytest

from growpage import catalog
from growpage.telemetry.collector import SAMPLE_READERS
from growpage.telemetry.state import HISTOGRAM_SAMPLES, CumulativeHistogram, LinkedExemplar, MetricState
from support.factories import make_manager


def test_every_contract_metric_has_exactly_one_source():
    sources = [*SAMPLE_READERS, *HISTOGRAM_SAMPLES, catalog.AGENT_ERRORS.name]
    assert sorted(sources) == sorted(spec.name for spec in catalog.METRICS)
    histograms = {spec.name for spec in catalog.METRICS if spec.type is catalog.MetricType.HISTOGRAM}
    assert set(HISTOGRAM_SAMPLES) == histograms


def test_histogram_uses_le_semantics_and_accumulates_across_windows():
    histogram = CumulativeHistogram((0.005, 0.01, 0.015))
    histogram.observe([0.005, 0.0051, 0.02])
    histogram.observe([0.001, float("nan")])  # NaN is skipped, never poisons the sum
    view = histogram.view()
    assert view.upper_bounds == (0.005, 0.01, 0.015, math.inf)
    assert view.cumulative_counts == (2, 3, 3, 4)
    assert view.count == 4
    assert view.sum == pytest.approx(0.005 + 0.0051 + 0.02 + 0.001)


def test_exemplar_is_shown_only_once_the_window_holding_its_sample_is_folded():
    histogram = CumulativeHistogram((0.005, 0.01))
    exemplar = LinkedExemplar("a" * 32, "b" * 16, 0.007, 1.0)
    histogram.add_exemplar(exemplar)
    assert histogram.view().exemplars == (None, None, None)
    histogram.observe([0.007])
    assert histogram.view().exemplars == (None, exemplar, None)


def snapshot_with_compressions(manager, bytes_in: int, bytes_out: int):
    if bytes_in or bytes_out:
        manager.stats.record_compression(bytes_in, bytes_out)
    return manager.make_stats()


def test_compress_ratio_covers_a_fixed_window_keeps_its_last_value_and_is_absent_before_any():
    manager = make_manager()
    state = MetricState({})
    state.fold(snapshot_with_compressions(manager, 0, 0), now_s=0.0)
    assert state.view().compress_ratio is None  # no compression yet: the series is absent
    state.fold(snapshot_with_compressions(manager, 300, 100), now_s=10.0)
    state.fold(snapshot_with_compressions(manager, 100, 100), now_s=20.0)
    assert state.view().compress_ratio == pytest.approx(400 / 200)
    assert state.view().compress_ratio == pytest.approx(400 / 200)  # reading closes nothing
    state.fold(snapshot_with_compressions(manager, 250, 50), now_s=200.0)
    assert state.view().compress_ratio == pytest.approx(650 / 250)  # still inside the 300 s window
    # At 560 s the window starts at 260 s: the polls up to 200 s have left it.
    state.fold(snapshot_with_compressions(manager, 90, 10), now_s=560.0)
    assert state.view().compress_ratio == pytest.approx(90 / 10)
    state.fold(snapshot_with_compressions(manager, 0, 0), now_s=2000.0)
    assert state.view().compress_ratio == pytest.approx(9.0)  # an idle window keeps the last value


def test_agent_errors_list_every_contract_component_and_add_telemetry_faults():
    manager = make_manager()
    manager.stats.record_error("policy")
    state = MetricState({})
    state.fold(manager.make_stats())
    errors = state.agent_errors({"collector": 2})
    assert set(catalog.ERROR_COMPONENTS) <= set(errors)
    assert errors["policy"] == 1 and errors["collector"] == 2 and errors["tracing"] == 0
