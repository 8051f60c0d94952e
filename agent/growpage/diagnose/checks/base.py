"""What every check shares: the thresholds it reads, and small helpers for evidence and units."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from growpage import catalog
from growpage.diagnose.findings import NotChecked, ScopeFinding, Status
from growpage.diagnose.observations import Scope, Window, round_number
from growpage.monitoring.promql import duration_seconds


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Every number a check compares against; :meth:`from_catalog` is the only production source.

    ``alerting`` is the mixin config's thresholds (the alerts' numbers): the fields above it are read
    from it, so a deployment that changes a threshold gets the same verdict from diagnose and from its
    alerts.
    """

    utilization_slo: float
    compress_ratio_slo: float
    latency_slo_threshold_s: float
    latency_slo_objective: float
    checklist: catalog.ChecklistThresholds
    diagnose: catalog.DiagnoseThresholds
    block_size_by_gpu: Mapping[str, int]
    min_vllm_version: str
    alerting: catalog.MixinThresholds = catalog.MIXIN_THRESHOLDS

    @classmethod
    def from_catalog(cls, alerting: catalog.MixinThresholds = catalog.MIXIN_THRESHOLDS) -> Thresholds:
        """The catalog's diagnose numbers with ``alerting`` (default: the catalog's own)."""
        return cls(
            utilization_slo=alerting.utilization_objective,
            compress_ratio_slo=alerting.compress_ratio_objective,
            latency_slo_threshold_s=alerting.allocation_latency_s,
            latency_slo_objective=alerting.allocation_latency_objective,
            checklist=alerting.checklist,
            diagnose=dataclasses.replace(catalog.DIAGNOSE_THRESHOLDS,
                                         pool_free_low_fraction=alerting.checklist.pool_free_low),
            block_size_by_gpu=dict(catalog.RECOMMENDED_BLOCK_SIZE_BY_GPU),
            min_vllm_version=catalog.MIN_SUPPORTED_VLLM_VERSION,
            alerting=alerting,
        )


CheckFunction = Callable[[Scope, Window, Thresholds], ScopeFinding]


@dataclasses.dataclass(frozen=True)
class Check:
    """One checklist item: a stable id (JSON, runbooks), its title for the thresholds in force, and a
    pure scope evaluator."""

    id: str
    title_for: Callable[[Thresholds], str]
    evaluate: CheckFunction

    @property
    def title(self) -> str:
        """The title with the catalog's thresholds."""
        return self.title_for(Thresholds.from_catalog())


def evidence(metric: str, value: Any, threshold: Any, window: Window, **extra: Any) -> dict[str, Any]:
    """The four keys every finding's evidence has, then check-specific extras (floats rounded)."""
    document = {"metric": metric, "value": _clean(value), "threshold": _clean(threshold),
                "window": window.describe()}
    document.update({key: _clean(item) for key, item in extra.items()})
    return document


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return round_number(value)
    if isinstance(value, Mapping):
        return {str(key): _clean(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(item) for item in value]
    return value


def unknown(metric: str, reason: str, window: Window, to_check: str, threshold: Any = None) -> ScopeFinding:
    """A check that could not be evaluated: ``reason`` says what was missing, ``to_check`` what to
    scrape, save or run so that it can be."""
    return ScopeFinding(Status.UNKNOWN, reason, evidence(metric, None, threshold, window, reason=reason),
                        not_checked=NotChecked(reason, to_check))


def missing(scope: Scope, metric: str, window: Window, what: str | None = None, threshold: Any = None) -> ScopeFinding:
    """Unknown because ``metric`` has no usable value: absent, or only NaN/Inf (which is said)."""
    if metric in scope.non_finite:
        return unknown(metric, f"{metric} is NaN or Inf: read as unknown, not as a value", window,
                       "the agent exported NaN or Inf: report it with a --bundle", threshold)
    return unknown(metric, f"{what or metric} not found", window, to_read(metric, window), threshold)


def to_read(metric: str, window: Window) -> str:
    """What to scrape or save so that ``metric`` reaches diagnose, for the source the window says."""
    if metric.startswith("vllm:"):
        return {"scrapes": f"vLLM's {catalog.VLLM_METRICS_PATH} must answer on the agent's server (diagnose "
                           f"reads it beside {catalog.METRICS_PATH})",
                "range": f"scrape vLLM's {catalog.VLLM_METRICS_PATH} (job {catalog.VLLM_SCRAPE_JOB}) into the "
                         "same Prometheus, with the pod's namespace and pod labels",
                }.get(window.kind, f"save vLLM's {catalog.VLLM_METRICS_PATH} beside {catalog.METRICS_PATH} "
                                   "(into the same file, or with the same '# growpage-snapshot-time:' line)")
    return {"scrapes": f"an agent that exports {metric} on {catalog.METRICS_PATH} (upgrade GrowPage)",
            "range": f"scrape {catalog.METRICS_PATH} (job {catalog.SCRAPE_JOB}) of an agent that exports {metric}",
            }.get(window.kind, f"save {catalog.METRICS_PATH} of an agent that exports {metric}")


def no_history(window: Window) -> NotChecked:
    """Why burn rates are not judged from scrapes or snapshots, and how to judge them."""
    windows = sorted({w for alert in catalog.ALLOCATION_LATENCY_BURN_RATE_ALERTS for pair in alert.windows
                      for w in (pair.long_window, pair.short_window)}, key=duration_seconds)
    source = "two scrapes" if window.kind == "scrapes" else "snapshots"
    return NotChecked(f"burn-rate alerts not checked: they compare error ratios over windows of "
                      f"{windows[0]} to {windows[-1]} ending now, and {source} hold no such history",
                      "diagnose with --prometheus (the Prometheus that scrapes this pod)")


def is_idle(scope: Scope) -> bool:
    """No page was granted and no request ran: ratios of nothing are not findings."""
    granted_none = scope.page_allocations == 0 or (scope.page_allocations is None
                                                   and scope.requests_running_max is not None)
    return granted_none and not scope.requests_running_max


def is_mode_off(scope: Scope) -> bool:
    """Every GrowPage of the scope runs in mode off: nothing it exports can be a finding."""
    return scope.build_values("mode") == ("off",)


def in_modes(scope: Scope, modes: tuple[str, ...]) -> bool:
    """Some GrowPage of the scope runs in one of ``modes``; an unknown mode (no build info) counts,
    so a check still runs against an agent that predates build info."""
    found = scope.build_values("mode")
    return not found or any(mode in modes for mode in found)


def idle_reason(window: Window) -> str:
    return f"no pages granted and no requests running ({window.describe()})"


def idle(metric: str, what: str, window: Window, threshold: Any = None, **extra: Any) -> ScopeFinding:
    """The check ran and found no traffic to judge: ok, as for the alerts (a ratio of no events never
    fires). ``what`` says what was absent, e.g. "no page grants"."""
    return ScopeFinding(Status.OK, f"idle: {what}: nothing to judge",
                        evidence(metric, None, threshold, window, idle=True, **extra))


def ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f} ms"


def pct(ratio: float | None) -> str:
    """``0.6`` -> ``60 %``, ``0.0909`` -> ``9.1 %``."""
    return "n/a" if ratio is None else f"{ratio * 100:.1f}".removesuffix(".0") + " %"


def pct_floor(ratio: float | None) -> str:
    """A share compared with a ">=" objective, rounded DOWN (0.98996 -> ``98.99 %``, never ``99 %``)."""
    if ratio is None:
        return "n/a"
    return f"{math.floor(ratio * 10000) / 100:.2f}".rstrip("0").rstrip(".") + " %"


def throttle_share(scope: Scope) -> float | None:
    """throttled / (allocate + throttled): the share of growth attempts the rate limit refused."""
    if not scope.decisions:
        return None
    throttled = scope.decisions.get("throttled", 0.0)
    attempts = scope.decisions.get("allocate", 0.0) + throttled
    return throttled / attempts if attempts > 0 else None
