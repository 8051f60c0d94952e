"""Parse Prometheus text / OpenMetrics expositions into flat samples, and date saved snapshots.

A saved snapshot is the raw body of ``/metrics/growpage`` (or of a DCGM exporter). Its time is the
first line ``# growpage-snapshot-time: <unix seconds>`` when present (``gpctl diagnose --bundle``
writes it), else the file's modification time.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from growpage import catalog
from growpage.diagnose.errors import DiagnoseError

SNAPSHOT_TIME_PREFIX = "# growpage-snapshot-time:"
_SNAPSHOT_TIME_RE = re.compile(r"^# growpage-snapshot-time:\s*([0-9]+(?:\.[0-9]*)?)\s*$", re.MULTILINE)
_SNAPSHOT_TIME_LINE_RE = re.compile(r"^# growpage-snapshot-time:[^\n]*\n?", re.MULTILINE)
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text"


@dataclasses.dataclass(frozen=True)
class Sample:
    """One exposition line: full series name (``_total``/``_bucket`` kept), labels, value."""

    name: str
    labels: Mapping[str, str]
    value: float


@dataclasses.dataclass(frozen=True)
class Exposition:
    """One scrape or snapshot: when it was taken, its samples, and the raw text (for bundles)."""

    origin: str  # URL or file name, for messages
    time_s: float
    samples: tuple[Sample, ...]
    text: str

    @property
    def has_growpage(self) -> bool:
        """GrowPage's series, or the ``up`` of its scrape job (a federated or replayed snapshot)."""
        return any(sample.name.startswith("growpage_")
                   or (sample.name == "up" and sample.labels.get("job") == catalog.SCRAPE_JOB)
                   for sample in self.samples)

    @property
    def has_vllm(self) -> bool:
        """vLLM's own series (its /metrics), read next to GrowPage's."""
        return any(sample.name.startswith("vllm:") for sample in self.samples)

    @property
    def has_dcgm(self) -> bool:
        return any(sample.name in (catalog.DCGM_FB_USED, catalog.DCGM_FB_FREE) for sample in self.samples)


def parse_exposition(text: str, origin: str, time_s: float, content_type: str = "") -> Exposition:
    """Parse ``text``; raises :class:`DiagnoseError` naming ``origin`` when it is not Prometheus data."""
    # deferred: gpctl imports this module at start-up; prometheus_client loads only to parse
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
    from prometheus_client.parser import text_string_to_metric_families as parse_text

    body = _SNAPSHOT_TIME_LINE_RE.sub("", text)  # OpenMetrics allows no free comments
    is_openmetrics = OPENMETRICS_CONTENT_TYPE in content_type or body.rstrip().endswith("# EOF")
    parser = parse_openmetrics if is_openmetrics else parse_text
    if is_openmetrics and not body.endswith("\n"):
        body += "\n"
    try:
        samples = tuple(
            Sample(sample.name, dict(sample.labels), float(sample.value))
            for family in parser(body)
            for sample in family.samples
        )
    except (ValueError, TypeError, KeyError, IndexError) as error:
        first_line = next((line for line in text.splitlines() if line.strip()), "")[:60]
        raise DiagnoseError(
            f"{origin} is not a Prometheus exposition ({_short(error)}; first line: {first_line!r}): "
            f"point at the agent's {catalog.METRICS_PATH} route or a DCGM exporter's /metrics") from None
    return Exposition(origin=origin, time_s=time_s, samples=samples, text=text)


def snapshot_time(text: str) -> float | None:
    """The ``# growpage-snapshot-time:`` value in ``text``, or ``None`` when it has none."""
    match = _SNAPSHOT_TIME_RE.search(text)
    return float(match.group(1)) if match else None


def with_snapshot_time(text: str, time_s: float) -> str:
    """``text`` with its snapshot-time line set to ``time_s`` (first line), for bundles."""
    return f"{SNAPSHOT_TIME_PREFIX} {time_s:.3f}\n" + _SNAPSHOT_TIME_LINE_RE.sub("", text)


def _short(error: Exception) -> str:
    message = " ".join(str(error).split())
    return message if len(message) <= 80 else message[:77] + "..."
