"""The one percentile GrowPage reports (benchmarks, the demo, the telemetry agent), and the benchmarks' spread."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default method).

    Args:
        values: samples, any order.
        fraction: in [0, 1], e.g. 0.99.

    Returns:
        The percentile, or None when there are no values (callers say what "none" means).
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    if not values:
        return None
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread(values: Sequence[float], digits: int = 3) -> dict:
    """Median, range and every value (rounded): how every benchmark reports repeated rounds."""
    return {"median": round(statistics.median(values), digits), "range": [round(min(values), digits),
                                                                            round(max(values), digits)],
            "values": [round(value, digits) for value in values]}
