"""Prometheus source: PromQL over ``[at - since, at]``, overall and per namespace (or per pod).

"Sustained" means sustained: gauges come from ``avg/min/max/last_over_time`` over the whole window,
counters from ``increase()``, histograms from ``increase()`` of each bucket (the checks compute
fractions and quantiles from the buckets themselves, exactly as for scraped data). ``namespace``
and ``pod`` are the labels the scrape attaches (kube-prometheus, ServiceMonitor); ``--namespace``
and ``--pod`` filter on them, and the breakdown is by namespace, or by pod within ``--namespace``.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from growpage import catalog
from growpage.diagnose.errors import DiagnoseError
from growpage.diagnose.observations import BuildInfo, GaugeStats, HistogramCounts, Observations, Scope, Window
from growpage.diagnose.sources import http
from growpage.diagnose.sources.result import SourceResult

if TYPE_CHECKING:
    import httpx

OVERALL = "all"
# Exported names, and the ones agents used before home/home_version (BuildInfo reads either).
_BUILD_LABELS = (*catalog.BUILD_INFO.exported_labels, "engine", "engine_version")
# Scope field -> the metric it is read from, to name the metrics whose values were NaN or +-Inf.
_FIELD_METRICS = {
    "utilization": catalog.UTILIZATION.name, "fragmentation": catalog.FRAGMENTATION.name,
    "intra_page_compress_ratio": catalog.INTRA_PAGE_COMPRESS_RATIO.name,
    "compress_input_bytes": catalog.COMPRESS_INPUT_BYTES.name,
    "compress_output_bytes": catalog.COMPRESS_OUTPUT_BYTES.name, "page_allocations": catalog.ALLOCATIONS.name,
    "oom_events": catalog.OOM_EVENTS.name, "decisions": catalog.DECISIONS.name,
    "agent_errors": catalog.AGENT_ERRORS.name, "allocation_latency": catalog.ALLOCATION_LATENCY.name,
    "lts_entropy": catalog.LTS_ENTROPY.name, "request_tokens": catalog.REQUEST_TOKENS.name,
    "requests_running_max": catalog.REQUESTS_RUNNING.name, "pool_free_fraction_min": catalog.POOL_PAGES.name,
    "stranded_slots_max": catalog.LIVE_TOKENS.name,
}
_QUERY_THREADS = 8  # queries are independent; a handful in flight keeps a 60-query run well under 1 s
_MIN_SUBQUERY_STEP_S = 15  # subqueries (ratios over time) sample at the common scrape interval or coarser


class _Queries:
    """Builds the PromQL of one diagnosis: selector, window and grouping are fixed per run."""

    def __init__(self, matchers: Sequence[str], window_s: int, breakdown_label: str | None):
        self.matchers = tuple(matchers)
        self.range = f"[{window_s}s]"
        self.subquery = f"[{window_s}s:{max(_MIN_SUBQUERY_STEP_S, window_s // 240)}s]"
        self.breakdown_label = breakdown_label

    def select(self, name: str, *extra: str) -> str:
        matchers = (*self.matchers, *extra)
        return name + ("{" + ",".join(matchers) + "}" if matchers else "")

    def by(self, breakdown: bool, *labels: str) -> str:
        grouping = ((self.breakdown_label,) if breakdown and self.breakdown_label else ()) + labels
        return f"by ({', '.join(grouping)})"


def _label_matcher(label: str, value: str) -> str:
    return f"{label}={json.dumps(value)}"  # JSON string escaping is valid PromQL string escaping


class _Client:
    """Runs instant queries at one evaluation time; keeps every query and result for the bundle."""

    def __init__(self, client: httpx.Client, base_url: str, at_s: float):
        self.client, self.base_url, self.at_s = client, base_url, at_s
        self.recorded: list[dict] = []
        self.warnings: set[str] = set()

    def vector(self, expr: str) -> list[tuple[dict[str, str], float]]:
        url = f"{self.base_url}/api/v1/query"
        response = http.get(self.client, url, "Prometheus", params={"query": expr, "time": f"{self.at_s:.3f}"},
                            accept="application/json")
        document = _json_or_none(response.text)
        if document is None or "status" not in document:
            raise DiagnoseError(
                f"{self.base_url} is not a Prometheus API (HTTP {response.status_code} from /api/v1/query, "
                "not Prometheus JSON): pass the server's base URL, e.g. http://prometheus:9090")
        if document["status"] != "success":
            raise DiagnoseError(
                f"Prometheus rejected a query ({document.get('errorType', 'error')}: "
                f"{' '.join(str(document.get('error', '')).split())}); query: {expr}")
        self.warnings.update(document.get("warnings") or ())
        data = document.get("data") or {}
        if data.get("resultType") != "vector":
            raise DiagnoseError(f"Prometheus answered a {data.get('resultType')!r}, not a vector; query: {expr}")
        result = [(dict(item["metric"]), float(item["value"][1])) for item in data.get("result", [])]
        self.recorded.append({"query": expr, "time": self.at_s, "result": data.get("result", [])})
        return result


def observe(base_url: str, since_s: float, at_s: float | None = None, namespace: str | None = None,
            pod: str | None = None, timeout_s: float = 10.0,
            dcgm_labels: Mapping[str, str] | None = None) -> SourceResult:
    """Query Prometheus at ``at_s`` (default: now) over the ``since_s`` before it.

    Args:
        dcgm_labels: target -> source label naming the GPU's user in DCGM series (default
            catalog.DCGM_EXPORTED_LABELS).
    """
    base_url = http.check_url(base_url, "--prometheus").rstrip("/")
    at_s = round(time.time() if at_s is None else at_s, 3)
    window_s = max(1, int(round(since_s)))
    matchers = [_label_matcher(label, value) for label, value in (("namespace", namespace), ("pod", pod)) if value]
    breakdown_label = None if pod else ("pod" if namespace else "namespace")
    queries = _Queries(matchers, window_s, breakdown_label)
    with http.make_client(timeout_s) as client:
        prom = _Client(client, base_url, at_s)
        _require_growpage_series(prom, queries, namespace, pod)
        scopes = _collect(prom, queries, catalog.DCGM_EXPORTED_LABELS if dcgm_labels is None else dcgm_labels)
    window = Window(at_s - window_s, at_s, "range")
    overall = scopes.pop(OVERALL, None) or Scope(name=OVERALL)
    breakdown = {name: scope for name, scope in scopes.items() if scope.has_growpage_data}
    source = {"kind": "prometheus", "target": base_url, "since_s": window_s, "at": at_s,
              "selector": "{" + ",".join(matchers) + "}"}
    notes = [f"Prometheus warning: {w}" for w in sorted(prom.warnings)]
    if overall.non_finite:
        notes.append(f"NaN or Inf values read as unknown (no value), never as data: {', '.join(overall.non_finite)}")
    observations = Observations(source=source, window=window, overall=overall,
                                breakdown_label=breakdown_label if breakdown else None, breakdown=breakdown,
                                notes=tuple(notes))
    raw = (("raw/prometheus-queries.json", json.dumps(prom.recorded, indent=1)),)
    return SourceResult(observations=observations, raw_files=raw)


def _require_growpage_series(prom: _Client, queries: _Queries, namespace: str | None, pod: str | None) -> None:
    found = prom.vector(f'count(last_over_time({{__name__=~"growpage_.+"{_comma(queries.matchers)}}}{queries.range}))')
    if found:
        return
    window = queries.range.strip("[]")
    if queries.matchers:
        anywhere = prom.vector(f'count by (namespace) (last_over_time(growpage_build_info{queries.range}))')
        namespaces = sorted(labels.get("namespace", "") for labels, _ in anywhere if labels.get("namespace"))
        hint = f" (GrowPage series exist in namespaces: {', '.join(namespaces[:5])})" if namespaces else ""
        raise DiagnoseError(f"no growpage_* series for namespace={namespace!r} pod={pod!r} in the {window} "
                            f"before the evaluation time{hint}: check --namespace/--pod and --since")
    raise DiagnoseError(f"Prometheus has no growpage_* series in the {window} before the evaluation time: "
                        f"is the agent scraped (job {catalog.SCRAPE_JOB}, path {catalog.METRICS_PATH})? "
                        "Check --since/--at, and Prometheus' targets page")


def _comma(matchers: Sequence[str]) -> str:
    return "".join("," + matcher for matcher in matchers)


def _dcgm_joined(expr: str, mapping: Mapping[str, str], agents: str) -> str:
    """``expr`` over DCGM series, relabeled to the pod using the GPU and kept only for the pods in
    ``agents`` (the selection's GrowPage pods): the exporter's own namespace/pod are not the GPU's user,
    so the selection's --namespace/--pod matchers cannot go on the DCGM selector itself."""
    for target, source_label in mapping.items():
        expr = f'label_replace({expr}, "{target}", "$1", "{source_label}", "(.+)")'
    return f"(({expr}) and on (namespace, pod) max by (namespace, pod) ({agents}))"


def _collect(prom: _Client, q: _Queries, dcgm_labels: Mapping[str, str]) -> dict[str, Scope]:
    """Run every query twice (overall, then by the breakdown label) and assemble one Scope per name."""
    return _run_templates(prom, q, _templates(q, dcgm_labels))


# Scope key (field, or field and statistic) -> (PromQL with a ``{by}`` placeholder, labels to group by).
_Templates = dict[tuple[str, ...], tuple[str, tuple[str, ...]]]


def _templates(q: _Queries, dcgm_labels: Mapping[str, str]) -> _Templates:
    """The PromQL behind every Scope field, with ``{by}`` where the grouping goes."""
    return {**_growpage_templates(q), **_dcgm_templates(q, dcgm_labels), **_vllm_templates(q),
            **_target_templates(q)}


def _growpage_templates(q: _Queries) -> _Templates:
    """GrowPage's own series: gauges as mean/min/max/last, counters and histograms as increases."""
    c = catalog
    r, sub = q.range, q.subquery

    def gauge(name: str) -> dict[str, str]:
        s = q.select(name)
        return {"mean": f"avg {{by}} (avg_over_time({s}{r}))", "min": f"min {{by}} (min_over_time({s}{r}))",
                "max": f"max {{by}} (max_over_time({s}{r}))", "last": f"avg {{by}} (last_over_time({s}{r}))"}

    def increase(name: str) -> str:
        return f"sum {{by}} (increase({q.select(name)}{r}))"

    pool, free = q.select(c.POOL_PAGES.name), q.select(c.POOL_PAGES.name, 'state="free"')
    live, granted = q.select(c.LIVE_TOKENS.name), q.select(c.GRANTED_TOKEN_SLOTS.name)
    templates: _Templates = {}
    for field, name in (("utilization", c.UTILIZATION.name), ("fragmentation", c.FRAGMENTATION.name),
                        ("intra_page_compress_ratio", c.INTRA_PAGE_COMPRESS_RATIO.name)):
        for stat, expr in gauge(name).items():
            templates[(field, stat)] = (expr, ())
    for field, name in (("compress_input_bytes", c.COMPRESS_INPUT_BYTES.name),
                        ("compress_output_bytes", c.COMPRESS_OUTPUT_BYTES.name),
                        ("page_allocations", c.ALLOCATIONS.name), ("oom_events", c.OOM_EVENTS.name)):
        templates[(field,)] = (increase(name), ())
    templates[("decisions",)] = (increase(c.DECISIONS.name), ("decision",))
    templates[("agent_errors",)] = (increase(c.AGENT_ERRORS.name), ("component",))
    for field, spec in (("allocation_latency", c.ALLOCATION_LATENCY), ("lts_entropy", c.LTS_ENTROPY),
                        ("request_tokens", c.REQUEST_TOKENS)):
        templates[(field, "buckets")] = (increase(f"{spec.name}_bucket"), ("le",))
        templates[(field, "sum")] = (increase(f"{spec.name}_sum"), ())
    templates[("pool_free_fraction_min",)] = (
        f"min {{by}} (min_over_time((sum without (state) ({free}) / sum without (state) ({pool})){sub}))", ())
    templates[("pool_pages_last",)] = (f"sum {{by}} (last_over_time({pool}{r}))", ("state",))
    templates[("requests_running_max",)] = (f"max {{by}} (max_over_time({q.select(c.REQUESTS_RUNNING.name)}{r}))", ())
    templates[("build_infos",)] = (f"max {{by}} (last_over_time({q.select(c.BUILD_INFO.name)}{r}))", _BUILD_LABELS)
    templates[("stranded_slots_max",)] = (
        f"max {{by}} (max_over_time((1 - sum {{by}} ({live}) / (sum {{by}} ({granted}) > 0)){sub}))", ())
    # Pooled utilization as the alerts read it: sum of live tokens over sum of granted slots.
    pooled = f"(sum {{by}} ({live}) / (sum {{by}} ({granted}) > 0))"
    for stat, function in (("mean", "avg"), ("min", "min"), ("max", "max"), ("last", "last")):
        templates[("pooled_utilization", stat)] = (f"{function}_over_time({pooled}{sub})", ())
    templates[("inactive_components",)] = (
        f"max {{by}} (last_over_time({q.select(c.AGENT_ACTIVE.name)}{r}) < 1)", ("component", "reason"))
    return templates


def _dcgm_templates(q: _Queries, dcgm_labels: Mapping[str, str]) -> _Templates:
    """The GPUs of the selection's pods, from a DCGM exporter: framebuffer use and models."""
    r, sub = q.range, q.subquery
    agents = q.select(catalog.BUILD_INFO.name)
    used, unused = catalog.DCGM_FB_USED, catalog.DCGM_FB_FREE
    framebuffer = _dcgm_joined(f"{used} / ({used} + {unused})", dcgm_labels, agents)
    models = _dcgm_joined(f"last_over_time({used}{r})", dcgm_labels, f"last_over_time({agents}{r})")
    return {("gpu_framebuffer_used_max",): (f"max {{by}} (max_over_time({framebuffer}{sub}))", ()),
            ("gpu_models",): (f"count {{by}} ({models})", (catalog.DCGM_MODEL_NAME_LABEL,))}


def _vllm_templates(q: _Queries) -> _Templates:
    """vLLM's own series of the selection's pods (another scrape job: joined on the pod, never on $job)."""
    c, r = catalog, q.range
    vllm_pods = f"max by (namespace, pod) (last_over_time({q.select(c.BUILD_INFO.name)}{r}))"

    def vllm(expr: str) -> str:
        return f"({expr} and on (namespace, pod) {vllm_pods})"

    templates: _Templates = {}
    for field, histogram in (("vllm_ttft", c.VLLM_TTFT), ("vllm_itl", c.VLLM_ITL)):
        templates[(field, "buckets")] = (f"sum {{by}} ({vllm(f'increase({histogram}_bucket{r})')})", ("le",))
        templates[(field, "sum")] = (f"sum {{by}} ({vllm(f'increase({histogram}_sum{r})')})", ())
    templates[("vllm_preemptions",)] = (f"sum {{by}} ({vllm(f'increase({c.VLLM_PREEMPTIONS}{r})')})", ())
    templates[("vllm_kv_cache_usage_max",)] = (
        f"max {{by}} ({vllm(f'max_over_time({c.VLLM_KV_CACHE_USAGE}{r})')})", ())
    templates[("vllm_queue_growth",)] = (
        f"sum {{by}} ({vllm(f'delta({c.VLLM_REQUESTS_WAITING}{r})')})", ())
    templates[("router_load_min_by_pod",)] = (f"min {{by}} (min_over_time({q.select(c.ROUTER_LOAD.name)}{r}))",
                                              ("pod",))
    return templates


def _target_templates(q: _Queries) -> _Templates:
    """The scrape itself: targets up and down, and how old the newest sample is."""
    info = f"last_over_time({q.select(catalog.BUILD_INFO.name)}{q.range})"
    # Targets whose scrape exported GrowPage in the window, by job/instance: works with any job name.
    up = q.select("up")
    return {
        ("targets_total",): (f"count {{by}} ({up} and on (job, instance) {info})", ()),
        ("targets_down",): (f"count {{by}} (({up} == 0) and on (job, instance) {info})", ()),
        # Age of the newest sample: timestamp() of the raw samples, newest over the window.
        ("sample_age_s",): (
            f"time() - max {{by}} (max_over_time(timestamp({q.select(catalog.BUILD_INFO.name)}){q.subquery}))", ()),
    }


def _run_templates(prom: _Client, q: _Queries, templates: _Templates) -> dict[str, Scope]:
    """Query each template overall and, when there is one, by the breakdown label; group rows by scope."""
    jobs = [(key, breakdown, expr.replace("{by}", q.by(breakdown, *labels)), labels)
            for key, (expr, labels) in templates.items()
            for breakdown in ((False, True) if q.breakdown_label else (False,))]
    with concurrent.futures.ThreadPoolExecutor(_QUERY_THREADS) as pool_executor:
        results = list(pool_executor.map(lambda job: prom.vector(job[2]), jobs))
    # values[scope][key] = list of (labels, value)
    values: dict[str, dict[tuple[str, ...], list[tuple[dict[str, str], float]]]] = {}
    for (key, breakdown, _, _), rows in zip(jobs, results, strict=True):
        for labels, value in rows:
            scope = labels.pop(q.breakdown_label, "") if breakdown and q.breakdown_label else OVERALL
            if scope:
                values.setdefault(scope, {}).setdefault(key, []).append((labels, value))
    return {scope: _scope(scope, found) for scope, found in values.items()}


_Rows = Mapping[tuple[str, ...], list[tuple[dict[str, str], float]]]


class _ScopeRows:
    """One scope's query results (template key -> rows of labels and value), read as Scope's field types.

    NaN and Inf are no data: a field whose rows are all non-finite reads ``None``.
    """

    def __init__(self, found: _Rows):
        self.found = found

    def one(self, key: tuple[str, ...]) -> float | None:
        rows = [value for _, value in self.found.get(key, ()) if math.isfinite(value)]
        return rows[0] if rows else None

    def by_label(self, key: tuple[str, ...], label: str) -> dict[str, float] | None:
        rows = [(labels, value) for labels, value in self.found.get(key, ()) if math.isfinite(value)]
        return {labels.get(label, ""): value for labels, value in rows} if rows else None

    def gauge(self, field: str) -> GaugeStats | None:
        mean, low, high, last = (self.one((field, stat)) for stat in ("mean", "min", "max", "last"))
        if mean is None or low is None or high is None or last is None:
            return None
        return GaugeStats(mean=mean, min=low, max=high, last=last)

    def histogram(self, field: str) -> HistogramCounts | None:
        buckets = self.by_label((field, "buckets"), "le")
        if not buckets:
            return None
        return HistogramCounts(buckets=tuple(sorted((float(le), count) for le, count in buckets.items() if le)),
                               total_sum=self.one((field, "sum")))


def _scope(name: str, found: _Rows) -> Scope:
    rows = _ScopeRows(found)
    one, by_label, gauge, histogram = rows.one, rows.by_label, rows.gauge, rows.histogram
    targets_total, targets_down = one(("targets_total",)), one(("targets_down",))
    return Scope(
        name=name,
        utilization=gauge("utilization"),
        intra_page_compress_ratio=gauge("intra_page_compress_ratio"),
        compress_input_bytes=one(("compress_input_bytes",)),
        compress_output_bytes=one(("compress_output_bytes",)),
        allocation_latency=histogram("allocation_latency"),
        page_allocations=one(("page_allocations",)),
        decisions=by_label(("decisions",), "decision"),
        oom_events=one(("oom_events",)),
        fragmentation=gauge("fragmentation"),
        stranded_slots_max=one(("stranded_slots_max",)),
        inactive_components=({labels.get("component", ""): labels.get("reason", "")
                              for labels, _ in found[("inactive_components",)]}
                             if ("inactive_components",) in found else None),
        non_finite=tuple(sorted({_FIELD_METRICS[key[0]] for key, rows in found.items()
                                 if key[0] in _FIELD_METRICS and any(not math.isfinite(v) for _, v in rows)})),
        pool_free_fraction_min=one(("pool_free_fraction_min",)),
        pool_pages_last=by_label(("pool_pages_last",), "state"),
        lts_entropy=histogram("lts_entropy"),
        request_tokens=histogram("request_tokens"),
        requests_running_max=one(("requests_running_max",)),
        agent_errors=by_label(("agent_errors",), "component"),
        build_infos=tuple(sorted({BuildInfo.from_labels(labels) for labels, _ in found.get(("build_infos",), ())},
                                 key=repr)),
        pooled_utilization=gauge("pooled_utilization"),
        vllm_ttft=histogram("vllm_ttft"),
        vllm_itl=histogram("vllm_itl"),
        vllm_preemptions=one(("vllm_preemptions",)),
        vllm_kv_cache_usage_max=one(("vllm_kv_cache_usage_max",)),
        vllm_queue_growth=one(("vllm_queue_growth",)),
        router_load_min_by_pod=by_label(("router_load_min_by_pod",), "pod"),
        gpu_framebuffer_used_max=one(("gpu_framebuffer_used_max",)),
        gpu_models=tuple(sorted(m for m in (by_label(("gpu_models",), catalog.DCGM_MODEL_NAME_LABEL) or {}) if m)),
        sample_age_s=one(("sample_age_s",)),
        # A scope with GrowPage series but no matching `up` has no target information (None), not 0.
        targets_total=int(targets_total) if targets_total is not None else None,
        targets_down=int(targets_down or 0) if targets_total is not None else None,
    )


def _json_or_none(text: str) -> dict | None:
    try:
        document = json.loads(text)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None
