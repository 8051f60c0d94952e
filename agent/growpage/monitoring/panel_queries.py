"""Run every dashboard panel's PromQL against a real Prometheus, as Grafana would.

Used by the tests (backfilled data, a live agent) and usable by hand::

    from growpage.monitoring.dashboards import dashboards
    from growpage.monitoring.panel_queries import run_panel_queries
    for result in run_panel_queries("http://localhost:9090", dashboards().values()):
        print(result)

Grafana variables are replaced first: ``$cluster``/``$job``/``$namespace``/``$pod``/``$model_name`` by
``.*`` (the "All" value),
``$__rate_interval`` and ``$__range`` by fixed durations.
"""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping

DEFAULT_VARIABLES = {
    "cluster": ".*", "job": ".*", "namespace": ".*", "pod": ".*", "model_name": ".*",
    "__rate_interval": "5m", "__range": "30m", "__interval": "1m",
}
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$([A-Za-z_]\w*)")  # $1 is a regex group (label_replace), not a variable


@dataclasses.dataclass(frozen=True)
class PanelQuery:
    """One target of one panel."""

    dashboard: str
    panel_id: int
    panel: str
    ref_id: str
    expr: str


@dataclasses.dataclass(frozen=True)
class PanelQueryResult:
    """What Prometheus answered for a panel query (``error`` None when it ran)."""

    query: PanelQuery
    promql: str
    num_series: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def has_data(self) -> bool:
        return self.ok and self.num_series > 0

    def __str__(self) -> str:
        status = f"error: {self.error}" if self.error else f"{self.num_series} series"
        return f"{self.query.dashboard} / {self.query.panel} [{self.query.ref_id}]: {status}"


def substitute_variables(expr: str, variables: Mapping[str, str] | None = None) -> str:
    """Replaces ``$name`` and ``${name}``; unknown variables raise (a panel would break in Grafana)."""
    values = {**DEFAULT_VARIABLES, **(variables or {})}

    def replace(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for Grafana variable ${name} in: {expr}")
        return values[name]

    return _VARIABLE.sub(replace, expr)


def _panels(panels: list[dict]) -> Iterator[dict]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # collapsed rows nest their panels


def panel_queries(dashboard: Mapping) -> list[PanelQuery]:
    """Every non-empty, non-hidden target of every panel, in panel order."""
    return [PanelQuery(dashboard["title"], panel["id"], panel.get("title", ""), target.get("refId", ""),
                       target["expr"])
            for panel in _panels(dashboard.get("panels", []))
            for target in panel.get("targets", [])
            if target.get("expr") and not target.get("hide")]


def _instant_query(prometheus_url: str, promql: str, at: float | None, timeout_s: float) -> list:
    params = {"query": promql, **({"time": f"{at:.3f}"} if at is not None else {})}
    request = urllib.request.Request(f"{prometheus_url.rstrip('/')}/api/v1/query",
                                     data=urllib.parse.urlencode(params).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 (caller's URL)
            body = json.loads(response.read())
    except urllib.error.HTTPError as error:  # 400/422: Prometheus explains in the body
        body = json.loads(error.read() or b"{}")
    if body.get("status") != "success":
        raise ValueError(f"{body.get('errorType', 'error')}: {body.get('error', body)}")
    result = body["data"]["result"]
    return result if isinstance(result, list) else [result]


def run_panel_queries(prometheus_url: str, dashboards: Iterable[Mapping], at: float | None = None,
                      variables: Mapping[str, str] | None = None,
                      timeout_s: float = 10.0) -> list[PanelQueryResult]:
    """Runs every panel query as an instant query.

    Args:
        prometheus_url: e.g. ``http://127.0.0.1:9090``.
        dashboards: Grafana dashboard JSON models.
        at: evaluation time (unix seconds); default now.
        variables: overrides of :data:`DEFAULT_VARIABLES` (e.g. ``{"namespace": "prod"}``).
        timeout_s: per query.

    Returns:
        One result per query; a failed query has ``error`` set (nothing raises for it).
    """
    results = []
    for dashboard in dashboards:
        for query in panel_queries(dashboard):
            promql = substitute_variables(query.expr, variables)
            try:
                series = _instant_query(prometheus_url, promql, at, timeout_s)
            except (OSError, ValueError) as error:
                results.append(PanelQueryResult(query, promql, 0, str(error)))
                continue
            results.append(PanelQueryResult(query, promql, len(series)))
    return results
