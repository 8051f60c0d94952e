"""What the user asked for (one source and its options), parsed and validated, and running it."""

from __future__ import annotations

import dataclasses
import datetime
import re
from pathlib import Path

from growpage import catalog
from growpage.diagnose.checks import run_checks
from growpage.diagnose.checks.base import Thresholds
from growpage.diagnose.errors import DiagnoseError
from growpage.diagnose.findings import Report
from growpage.diagnose.sources import endpoint, prometheus, snapshot
from growpage.diagnose.sources.choice import require_modules, require_one_source
from growpage.diagnose.sources.result import SourceResult
from growpage.monitoring.mixin import DEFAULT_CONFIG, MixinConfig

_DURATION_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")


def parse_duration_s(text: str, option: str) -> float:
    """``15s``, ``30m``, ``1h30m``, ``90`` (seconds) -> seconds; raises DiagnoseError otherwise."""
    cleaned = text.strip().lower()
    try:
        seconds = float(cleaned)
    except ValueError:
        match = _DURATION_RE.match(cleaned)
        if not cleaned or not match or not any(match.groups()):
            raise DiagnoseError(f"{option} {text!r} is not a duration: use e.g. 15s, 30m, 1h30m or seconds") from None
        hours, minutes, secs = (float(group or 0) for group in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if seconds <= 0:
        raise DiagnoseError(f"{option} must be longer than 0s (got {text!r})")
    return seconds


def parse_label_map(pairs: list[str] | tuple[str, ...], option: str) -> tuple[tuple[str, str], ...]:
    """``["namespace=exported_namespace", "pod=kubernetes_pod_name"]`` -> pairs, defaults kept for
    targets not given; raises DiagnoseError on anything else."""
    mapping = dict(catalog.DCGM_EXPORTED_LABELS)
    for pair in pairs:
        target, sep, source = pair.partition("=")
        if not sep or target not in catalog.DCGM_EXPORTED_LABELS or not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", source):
            raise DiagnoseError(f"{option} {pair!r} is not TARGET=LABEL with TARGET one of "
                                f"{', '.join(catalog.DCGM_EXPORTED_LABELS)} (e.g. {option} pod=kubernetes_pod_name)")
        mapping[target] = source
    return tuple(mapping.items())


def parse_time_s(text: str, option: str) -> float:
    """Unix seconds, or ISO 8601 (``2024-05-01T10:00:00Z``; no zone means UTC) -> unix seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise DiagnoseError(f"{option} {text!r} is neither unix seconds nor ISO 8601 "
                            "(e.g. 2024-05-01T10:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


@dataclasses.dataclass(frozen=True)
class DiagnoseRequest:
    """Exactly one of ``endpoint``, ``prometheus``, ``snapshots``; the rest tune that source."""

    endpoint: str | None = None
    dcgm: str | None = None
    duration_s: float = 15.0
    prometheus: str | None = None
    since_s: float = 1800.0
    at_s: float | None = None
    namespace: str | None = None
    pod: str | None = None
    snapshots: tuple[Path, ...] = ()
    timeout_s: float = 10.0
    # target -> source label naming the GPU's user in DCGM series; None: catalog.DCGM_EXPORTED_LABELS.
    dcgm_labels: tuple[tuple[str, str], ...] | None = None
    # The installation's mixin config: the alerts' thresholds (diagnose's verdicts use the same
    # numbers) and, with --prometheus, its cluster label and selectors.
    config: MixinConfig = DEFAULT_CONFIG
    cluster: str | None = None  # with --prometheus: only series whose cluster label has this value

    @property
    def thresholds(self) -> catalog.MixinThresholds:
        return self.config.thresholds

    @property
    def dcgm_label_map(self) -> dict[str, str]:
        return dict(catalog.DCGM_EXPORTED_LABELS if self.dcgm_labels is None else self.dcgm_labels)

    def __post_init__(self) -> None:
        require_one_source(self.endpoint, self.prometheus, self.snapshots, DiagnoseError)
        if self.dcgm and not self.endpoint:
            raise DiagnoseError("--dcgm goes with --endpoint (with --prometheus, DCGM series are queried; "
                                "with --snapshot, pass the DCGM exposition as another snapshot file)")
        if (self.namespace or self.pod or self.at_s is not None or self.cluster is not None) and not self.prometheus:
            raise DiagnoseError("--namespace, --pod, --cluster and --at go with --prometheus (an endpoint or a "
                                "snapshot is one pod already)")
        if self.cluster is not None and not self.cluster.strip():
            raise DiagnoseError(f"--cluster needs a cluster name, the value of the mixin config's cluster label "
                                f"{self.config.cluster_label!r} (e.g. --cluster prod-eu-1)")


def collect(request: DiagnoseRequest) -> SourceResult:
    require_modules("diagnose", reads_http=bool(request.endpoint or request.prometheus),
                    parses_expositions=not request.prometheus, error=DiagnoseError)
    if request.endpoint:
        return endpoint.observe(request.endpoint, request.dcgm, request.duration_s, request.timeout_s,
                                dcgm_labels=request.dcgm_label_map)
    if request.prometheus:
        selection = prometheus.Selection(request.namespace, request.pod, request.cluster, request.config)
        return prometheus.observe(request.prometheus, request.since_s, request.at_s, selection, request.timeout_s,
                                  dcgm_labels=request.dcgm_label_map)
    return snapshot.observe(request.snapshots, dcgm_labels=request.dcgm_label_map)


def diagnose(request: DiagnoseRequest) -> tuple[Report, SourceResult]:
    """Collect from the requested source and run the checklist; raises DiagnoseError (exit 3)."""
    result = collect(request)
    return run_checks(result.observations, Thresholds.from_catalog(request.thresholds)), result
