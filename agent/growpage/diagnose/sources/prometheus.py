"""Prometheus source: PromQL over ``[at - since, at]``, overall and per namespace (or per pod).

"Sustained" means sustained: gauges come from ``avg/min/max/last_over_time`` over the whole window,
counters from ``increase()``, histograms from ``increase()`` of each bucket (the checks compute
fractions and quantiles from the buckets themselves, exactly as for scraped data). ``namespace``
and ``pod`` are the labels the scrape attaches (kube-prometheus, ServiceMonitor); ``--namespace``
and ``--pod`` filter on them, and the breakdown is by namespace, or by pod within ``--namespace``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from growpage import catalog
from growpage.diagnose.errors import DiagnoseError
from growpage.diagnose.observations import BuildInfo, GaugeStats, HistogramCounts, Observations, Scope, Window
from growpage.diagnose.sources import http
from growpage.diagnose.sources.prometheus_burns import burn_queries, for_namespace, read_burn_ratios
from growpage.diagnose.sources.result import SourceResult
from growpage.monitoring.mixin import DEFAULT_CONFIG, MixinConfig

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
    """Builds the PromQL of one diagnosis: selector, window and grouping are fixed per run.

    ``join`` is the labels one pod's series share across scrape jobs (the mixin's cluster label,
    namespace, pod): vLLM's and DCGM's series are joined on them, never on ``$job``.
    """

    def __init__(self, matchers: Sequence[str], window_s: int, breakdown_label: str | None,
                 config: MixinConfig = DEFAULT_CONFIG):
        self.matchers = tuple(matchers)
        self.join = ", ".join(config.pod_join)
        self.growpage_job, self.vllm_job = config.growpage_job, config.vllm_job
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
    """Runs instant queries at one evaluation time; keeps every query and result for the bundle.

    ``scoped`` adds the mixin config's selectors to every selector of GrowPage's and vLLM's series,
    as the rules and dashboards built from the same config have them.
    """

    def __init__(self, client: httpx.Client, base_url: str, at_s: float,
                 scoped: Callable[[str], str] = lambda expr: expr):
        self.client, self.base_url, self.at_s, self.scoped = client, base_url, at_s, scoped
        self.recorded: list[dict] = []
        self.warnings: set[str] = set()

    def vector(self, expr: str, scoped: bool = True) -> list[tuple[dict[str, str], float]]:
        expr = self.scoped(expr) if scoped else expr
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


@dataclasses.dataclass(frozen=True)
class Selection:
    """What one Prometheus diagnosis reads: the scope the user chose and the installation's mixin
    config (its cluster label and selectors, and the thresholds of its burn alerts)."""

    namespace: str | None = None
    pod: str | None = None
    cluster: str | None = None
    config: MixinConfig = DEFAULT_CONFIG

    @property
    def matchers(self) -> list[str]:
        chosen = (("namespace", self.namespace), ("pod", self.pod), (self.config.cluster_label, self.cluster))
        return [_label_matcher(label, value) for label, value in chosen if value]


def observe(base_url: str, since_s: float, at_s: float | None = None, selection: Selection = Selection(),
            timeout_s: float = 10.0, dcgm_labels: Mapping[str, str] | None = None) -> SourceResult:
    """Query Prometheus at ``at_s`` (default: now) over the ``since_s`` before it.

    Args:
        dcgm_labels: target -> source label naming the GPU's user in DCGM series (default
            catalog.DCGM_EXPORTED_LABELS).
    """
    base_url = http.check_url(base_url, "--prometheus").rstrip("/")
    at_s = round(time.time() if at_s is None else at_s, 3)
    window_s = max(1, int(round(since_s)))
    matchers, config = selection.matchers, selection.config
    breakdown_label = None if selection.pod else ("pod" if selection.namespace else "namespace")
    queries = _Queries(matchers, window_s, breakdown_label, config)
    with http.make_client(timeout_s) as client:
        prom = _Client(client, base_url, at_s, config.scoped)
        _require_growpage_series(prom, queries, selection)
        scopes = _collect(prom, queries, catalog.DCGM_EXPORTED_LABELS if dcgm_labels is None else dcgm_labels)
        burn_reads = burn_queries(prom.vector, matchers, config, per_pod=selection.pod is not None)
        burns = read_burn_ratios(prom.vector, burn_reads, config.thresholds, config.slo_labels)
        clusters = _clusters(prom, queries, config.cluster_label) if selection.cluster is None else []
    window = Window(at_s - window_s, at_s, "range")
    overall = dataclasses.replace(scopes.pop(OVERALL, Scope(name=OVERALL)), burn_ratios=burns)
    breakdown = {name: (dataclasses.replace(scope, burn_ratios=for_namespace(burns, name))
                        if breakdown_label == "namespace" else scope)
                 for name, scope in scopes.items() if scope.has_growpage_data}
    source = {"kind": "prometheus", "target": base_url, "since_s": window_s, "at": at_s,
              "selector": "{" + ",".join(matchers) + "}"}
    notes = [f"Prometheus warning: {w}" for w in sorted(prom.warnings)]
    if len(clusters) > 1:
        notes.append(f"series from {len(clusters)} clusters ({', '.join(clusters[:5])}, label "
                     f"{config.cluster_label}): namespaces of the same name are read together; pass --cluster NAME")
    if overall.non_finite:
        notes.append(f"NaN or Inf values read as unknown (no value), never as data: {', '.join(overall.non_finite)}")
    observations = Observations(source=source, window=window, overall=overall,
                                breakdown_label=breakdown_label if breakdown else None, breakdown=breakdown,
                                notes=tuple(notes))
    raw = (("raw/prometheus-queries.json", json.dumps(prom.recorded, indent=1)),)
    return SourceResult(observations=observations, raw_files=raw)


def _require_growpage_series(prom: _Client, queries: _Queries, selection: Selection) -> None:
    """Something to diagnose: GrowPage's series, or the scrape targets of GrowPage's route (a route
    that fails everywhere leaves only ``up``: that is GrowPageAgentDown, a finding, not "nothing")."""
    chosen = [*queries.matchers, *([selection.config.growpage_selector] if selection.config.growpage_selector else [])]
    found = prom.vector(f'count(last_over_time({{__name__=~"growpage_.+"{_comma(chosen)}}}{queries.range}))')
    targets = f'up{{job="{selection.config.growpage_job}"{_comma(queries.matchers)}}}'
    if found or prom.vector(f"count(last_over_time({targets}{queries.range}))", scoped=False):
        return
    window = queries.range.strip("[]")
    if chosen:
        label = selection.config.cluster_label
        where = ", ".join(f"{name}s: {', '.join(values[:5])}" for name, values in (
            ("namespace", _label_values(prom, queries, "namespace")), (label, _label_values(prom, queries, label)))
            if values)
        hint = f" (GrowPage series exist in {where})" if where else ""
        config = (f" growpage_selector {selection.config.growpage_selector!r} (--mixin-config)"
                  if selection.config.growpage_selector else "")
        raise DiagnoseError(f"no growpage_* series for namespace={selection.namespace!r} pod={selection.pod!r} "
                            f"{label}={selection.cluster!r}{config} in the {window} before the evaluation "
                            f"time{hint}: check --namespace/--pod/--cluster, the mixin config's selector and --since")
    raise DiagnoseError(f"Prometheus has no growpage_* series in the {window} before the evaluation time: "
                        f"is the agent scraped (job {catalog.SCRAPE_JOB}, path {catalog.METRICS_PATH})? "
                        "Check --since/--at, and Prometheus' targets page")


def _label_values(prom: _Client, queries: _Queries, label: str) -> list[str]:
    """Values of ``label`` on any GrowPage build info in the window (no selection, no selector)."""
    rows = prom.vector(f"count by ({label}) (last_over_time({catalog.BUILD_INFO.name}{queries.range}))", scoped=False)
    return sorted(labels[label] for labels, _ in rows if labels.get(label))


def _clusters(prom: _Client, queries: _Queries, label: str) -> list[str]:
    """The clusters the selection's GrowPage series come from (a note when there are several)."""
    rows = prom.vector(f"count by ({label}) (last_over_time({queries.select(catalog.BUILD_INFO.name)}{queries.range}))")
    return sorted(labels[label] for labels, _ in rows if labels.get(label))


def _comma(matchers: Sequence[str]) -> str:
    return "".join("," + matcher for matcher in matchers)


def _dcgm_joined(expr: str, mapping: Mapping[str, str], agents: str, join: str) -> str:
    """``expr`` over DCGM series, relabeled to the pod using the GPU and kept only for the pods in
    ``agents`` (the selection's GrowPage pods): the exporter's own namespace/pod are not the GPU's user,
    so the selection's --namespace/--pod matchers cannot go on the DCGM selector itself."""
    for target, source_label in mapping.items():
        expr = f'label_replace({expr}, "{target}", "$1", "{source_label}", "(.+)")'
    return f"(({expr}) and on ({join}) max by ({join}) ({agents}))"


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
                        ("page_allocations", c.ALLOCATIONS.name), ("oom_events", c.OOM_EVENTS.name),
                        ("tracked_steps", c.VLLM_STEPS.name), ("observed_steps", c.VLLM_OBSERVED_STEPS.name),
                        ("own_seconds", c.VLLM_OWN_SECONDS.name), ("hooked_seconds", c.VLLM_STEP_SECONDS.name)):
        templates[(field,)] = (increase(name), ())
    for spec in c.FORECAST_METRICS:  # monitor's forecast of enforce: the rollout check weighs it
        if spec.type is c.MetricType.COUNTER:
            templates[(FORECAST_FIELD, spec.name)] = (increase(spec.name), ())
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
    framebuffer = _dcgm_joined(f"{used} / ({used} + {unused})", dcgm_labels, agents, q.join)
    models = _dcgm_joined(f"last_over_time({used}{r})", dcgm_labels, f"last_over_time({agents}{r})", q.join)
    return {("gpu_framebuffer_used_max",): (f"max {{by}} (max_over_time({framebuffer}{sub}))", ()),
            ("gpu_models",): (f"count {{by}} ({models})", (catalog.DCGM_MODEL_NAME_LABEL,))}


def _vllm_templates(q: _Queries) -> _Templates:
    """vLLM's own series of the selection's pods (another scrape job: joined on the pod, never on $job)."""
    c, r = catalog, q.range
    vllm_pods = f"max by ({q.join}) (last_over_time({q.select(c.BUILD_INFO.name)}{r}))"

    def vllm(expr: str) -> str:
        return f"({expr} and on ({q.join}) {vllm_pods})"

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
    """The scrape itself: targets up and down, and how old the newest sample is.

    A GrowPage target counts as down, as for GrowPageAgentDown, only while vLLM's target of the same
    pod answers: a pod still loading its model answers neither.
    """
    up, vllm_up = q.select("up", f'job="{q.growpage_job}"'), q.select("up", f'job="{q.vllm_job}"')
    return {
        ("targets_total",): (f"count {{by}} ({up})", ()),
        ("targets_down",): (f"count {{by}} (({up} == 0) and on ({q.join}) ({vllm_up} == 1))", ()),
        ("vllm_targets_up",): (f"count {{by}} ({vllm_up} == 1)", ()),
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


FORECAST_FIELD = "forecast"  # the first part of each forecast counter's key: (FORECAST_FIELD, its series name)


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
        tracked_steps=one(("tracked_steps",)),
        observed_steps=one(("observed_steps",)),
        own_seconds=one(("own_seconds",)),
        hooked_seconds=one(("hooked_seconds",)),
        forecast_counters={key[1]: value for key in found if key[0] == FORECAST_FIELD
                           if (value := one(key)) is not None} or None,
        vllm_kv_cache_usage_max=one(("vllm_kv_cache_usage_max",)),
        vllm_queue_growth=one(("vllm_queue_growth",)),
        router_load_min_by_pod=by_label(("router_load_min_by_pod",), "pod"),
        gpu_framebuffer_used_max=one(("gpu_framebuffer_used_max",)),
        gpu_models=tuple(sorted(m for m in (by_label(("gpu_models",), catalog.DCGM_MODEL_NAME_LABEL) or {}) if m)),
        sample_age_s=one(("sample_age_s",)),
        # A scope with GrowPage series but no matching `up` has no target information (None), not 0.
        targets_total=int(targets_total) if targets_total is not None else None,
        targets_down=int(targets_down or 0) if targets_total is not None else None,
        vllm_targets_up=int(one(("vllm_targets_up",)) or 0) if one(("vllm_targets_up",)) is not None else None,
    )


def _json_or_none(text: str) -> dict | None:
    try:
        document = json.loads(text)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None
