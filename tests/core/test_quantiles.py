"""The one percentile: numpy's default interpolation, and no number invented for no samples; the
benchmarks' spread of repeated rounds."""

import pytest

from growpage.core.quantiles import percentile, spread


@pytest.mark.parametrize(("values", "expected"), [
    ((7.0,), 7.0), ((1.0, 2.0), 1.95), ((2.0, 1.0), 1.95), (tuple(range(1, 101)), 95.05)])
def test_percentile_interpolates_between_closest_ranks(values, expected):
    assert percentile(values, 0.95) == pytest.approx(expected)


def test_no_values_have_no_percentile():
    assert percentile((), 0.5) is None  # callers say what "none" means (0 pages of demand, no latency yet)


@pytest.mark.parametrize("fraction", [-0.1, 1.5])
def test_a_fraction_outside_0_1_is_refused(fraction):
    with pytest.raises(ValueError, match="fraction"):
        percentile((1.0,), fraction)


def test_spread_is_median_and_range_of_every_value_in_round_order():
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "range": [1.0, 3.0], "values": [3.0, 1.0, 2.0]}
    # an even count: the median is the mean of the middle two
    assert spread([1, 2]) == {"median": 1.5, "range": [1, 2], "values": [1, 2]}
