"""Where the distributions come from: a live agent, Prometheus, or saved expositions.

HTTP goes through diagnose's reader (:mod:`growpage.diagnose.sources.http`: streamed, size-capped,
an overall deadline, every transport failure one line), and expositions through its parser, so
calibrate survives a misbehaving agent exactly as diagnose does.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from growpage import catalog
from growpage.calibrate.evidence import (
    DISTRIBUTIONS,
    NAMESPACE_LABEL,
    Evidence,
    ModelEvidence,
    agreed,
    block_sizes,
    evidence_from_expositions,
)
from growpage.diagnose.exposition import Exposition, parse_exposition, snapshot_time
from growpage.diagnose.observations import HistogramCounts, Window
from growpage.diagnose.sources import http
from growpage.errors import GrowPageError
from growpage.rollout import COST_COUNTERS, FORECAST_COUNTERS, forecast_evidence

if TYPE_CHECKING:
    import httpx  # imported when a source is read over HTTP (diagnose's reader does that)


def from_endpoint(url: str, duration_s: float | None = None, timeout_s: float = 10.0,
                  sleep: Callable[[float], None] = time.sleep) -> Evidence:
    """One scrape (distributions since the agent started) or two ``duration_s`` apart (their increase).

    Raises:
        GrowPageError: the agent cannot be reached or read, or serves no GrowPage metrics.
    """
    target = http.with_default_path(http.check_url(url, "--endpoint"), catalog.METRICS_PATH)
    expositions = []
    with http.make_client(timeout_s) as client:
        for index in range(1 if duration_s is None else 2):
            if index:
                sleep(duration_s or 0.0)
            expositions.append(_scrape(client, target))
    source = {"kind": "endpoint", "target": target, "where": f"the agent at {target}", "duration_s": duration_s,
              "wider": "" if duration_s is None
              else "a longer --duration, or none (everything since the agent started)"}
    return evidence_from_expositions(expositions, source, "scrapes")


def _scrape(client: httpx.Client, url: str) -> Exposition:
    response = http.get(client, url, "the agent")
    if response.status_code != 200:
        hint = (f"check the path (the agent serves {catalog.METRICS_PATH})" if response.status_code == 404
                else "check that the agent is healthy (its logs) and that this is its metrics URL")
        raise GrowPageError(f"the agent at {url} answered HTTP {response.status_code}: {hint}")
    exposition = parse_exposition(response.text, url, response.received_at_s, response.content_type)
    if not exposition.has_growpage:
        raise GrowPageError(f"{url} serves no growpage_* metrics: is GrowPage loaded (mode monitor or enforce) "
                            f"and is this its {catalog.METRICS_PATH} route?")
    return exposition


def from_snapshots(paths: Sequence[Path]) -> Evidence:
    """Saved ``/metrics/growpage`` expositions: one gives totals since the agent started; two or
    more, the increase from the oldest to the newest (dated like diagnose's snapshots).

    Raises:
        GrowPageError: a file is missing, unreadable, not an exposition, or has no GrowPage series.
    """
    if not paths:
        raise GrowPageError("--snapshot needs at least one file")
    expositions = [_read_snapshot(Path(path)) for path in paths]
    times = sorted(exposition.time_s for exposition in expositions)
    if len(set(times)) < len(times):
        raise GrowPageError("two snapshots have the same time: increases need different times; add a "
                            "'# growpage-snapshot-time: <unix seconds>' first line to each file")
    source = {"kind": "snapshot", "target": ", ".join(str(path) for path in paths),
              "where": f"snapshot {paths[0]}" if len(paths) == 1 else f"snapshots {', '.join(map(str, paths))}",
              "wider": "" if len(paths) == 1
              else "snapshots further apart, or only the newest (totals since the agent started)"}
    return evidence_from_expositions(expositions, source, "snapshots")


def _read_snapshot(path: Path) -> Exposition:
    if not path.is_file():
        what = "is a directory: pass the files (e.g. DIR/*.prom)" if path.is_dir() else "does not exist"
        raise GrowPageError(f"snapshot {path} {what}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise GrowPageError(f"snapshot {path} is not UTF-8 text: save the exposition as text "
                            f"(curl -s http://AGENT{catalog.METRICS_PATH} > file.prom)") from None
    except OSError as error:
        raise GrowPageError(f"snapshot {path} cannot be read ({error.strerror}): check its permissions") from None
    written = snapshot_time(text)
    exposition = parse_exposition(text, str(path), written if written is not None else os.path.getmtime(path))
    if not exposition.has_growpage:
        raise GrowPageError(f"snapshot {path} has no growpage_* series: save the agent's {catalog.METRICS_PATH} "
                            f"(curl -s http://AGENT{catalog.METRICS_PATH} > file.prom)")
    return exposition


def from_prometheus(base_url: str, since_s: float, at_s: float | None = None, namespace: str | None = None,
                    model_name: str | None = None, timeout_s: float = 10.0) -> Evidence:
    """``increase()`` of each histogram's buckets over ``[at - since, at]``, per model and namespace.

    Raises:
        GrowPageError: Prometheus cannot be reached, answers something else, or has no GrowPage
            distributions for the selection.
    """
    base_url = http.check_url(base_url, "--prometheus").rstrip("/")
    at_s = round(time.time() if at_s is None else at_s, 3)
    window_s = max(1, int(round(since_s)))
    matchers = [f"{label}={json.dumps(value)}"  # JSON string escaping is valid PromQL string escaping
                for label, value in ((NAMESPACE_LABEL, namespace), (catalog.MODEL_LABEL, model_name)) if value]
    selector = "{" + ",".join(matchers) + "}"
    by = f"{catalog.MODEL_LABEL}, {NAMESPACE_LABEL}"
    with http.make_client(timeout_s) as client:
        def query(expr: str) -> list[tuple[dict[str, str], float]]:
            return _vector(client, base_url, expr, at_s)

        buckets = {spec.name: query(f"sum by ({by}, le) (increase({spec.name}_bucket{selector}[{window_s}s]))")
                   for spec in DISTRIBUTIONS}
        forecasts = {spec.name: query(f"sum by ({catalog.MODEL_LABEL}) (increase({spec.name}{selector}[{window_s}s]))")
                     for spec in (*FORECAST_COUNTERS, *COST_COUNTERS)}
        infos = query(f"max by ({catalog.MODEL_LABEL}, block_size, mode) "
                      f"(last_over_time({catalog.BUILD_INFO.name}{selector}[{window_s}s]))")
    models = sorted({labels.get(catalog.MODEL_LABEL, "") for rows in buckets.values() for labels, _ in rows}
                    | {labels.get(catalog.MODEL_LABEL, "") for labels, _ in infos})
    found = {}
    for model in models:
        def rows_of(name: str, model: str = model) -> list[tuple[dict[str, str], float]]:
            return [(labels, value) for labels, value in buckets[name]
                    if labels.get(catalog.MODEL_LABEL, "") == model]

        lts_rows = rows_of(catalog.LTS_ENTROPY.name)
        namespaces = sorted({labels.get(NAMESPACE_LABEL, "") for labels, _ in lts_rows} - {""})
        model_infos = [labels for labels, _ in infos if labels.get(catalog.MODEL_LABEL, "") == model]
        found[model] = ModelEvidence(
            model=model, lts_entropy=_histogram(lts_rows), sts_density=_histogram(rows_of(catalog.STS_DENSITY.name)),
            request_tokens=_histogram(rows_of(catalog.REQUEST_TOKENS.name)),
            lts_by_namespace={namespace: histogram for namespace in namespaces
                              if (histogram := _histogram([row for row in lts_rows
                                                           if row[0].get(NAMESPACE_LABEL) == namespace]))},
            block_sizes=block_sizes(model_infos), mode=agreed(model_infos, "mode"),
            forecast=forecast_evidence({name: next((value for labels, value in rows
                                                    if labels.get(catalog.MODEL_LABEL, "") == model), None)
                                        for name, rows in forecasts.items()}))
    window = Window(at_s - window_s, at_s, "range")
    scope = f"{selector}, " if matchers else ""
    source = {"kind": "prometheus", "target": base_url, "selector": selector, "since_s": window_s, "at": at_s,
              "where": f"Prometheus at {base_url} ({scope}{window.describe()})", "wider": "a longer --since"}
    return Evidence(source=source, window=window, models=found)


def _histogram(rows: Sequence[tuple[Mapping[str, str], float]]) -> HistogramCounts | None:
    """Bucket increases summed per bound (over namespaces), made cumulative-monotonic again.

    ``increase()`` extrapolates each bucket on its own, so neighbours can come out a hair out of
    order; ``histogram_quantile`` evens that out the same way before interpolating.
    """
    by_bound: dict[float, float] = {}
    for labels, value in rows:
        if labels.get("le") and math.isfinite(value):
            bound = float(labels["le"])
            by_bound[bound] = by_bound.get(bound, 0.0) + value
    if not by_bound:
        return None
    buckets, running = [], 0.0
    for bound in sorted(by_bound):
        running = max(running, by_bound[bound])
        buckets.append((bound, running))
    return HistogramCounts(buckets=tuple(buckets))


def _vector(client: httpx.Client, base_url: str, expr: str, at_s: float) -> list[tuple[dict[str, str], float]]:
    url = f"{base_url}/api/v1/query"
    response = http.get(client, url, "Prometheus", params={"query": expr, "time": f"{at_s:.3f}"},
                        accept="application/json")
    try:
        document = json.loads(response.text)
    except ValueError:
        document = None
    if not isinstance(document, dict) or "status" not in document:
        raise GrowPageError(f"{base_url} is not a Prometheus API (HTTP {response.status_code} from /api/v1/query, "
                            "not Prometheus JSON): pass the server's base URL, e.g. http://prometheus:9090")
    if document["status"] != "success":
        raise GrowPageError(f"Prometheus rejected a query ({document.get('errorType', 'error')}: "
                            f"{' '.join(str(document.get('error', '')).split())}); query: {expr}")
    data = document.get("data") or {}
    if data.get("resultType") != "vector":
        raise GrowPageError(f"Prometheus answered a {data.get('resultType')!r}, not a vector; query: {expr}")
    return [(dict(item["metric"]), float(item["value"][1])) for item in data.get("result", [])]

