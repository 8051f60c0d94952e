"""``GrowPage / Overview``: the three SLOs first, then capacity, latency, decisions and rollout."""

from __future__ import annotations

from growpage import catalog
from growpage.monitoring import recording_rules as rec
from growpage.monitoring.dashboards.common import (
    RATE,
    RATIO_UNIT,
    SECONDS_UNIT,
    TIMES_UNIT,
    Cell,
    dashboard,
    heatmap,
    metric,
    rule,
    stat,
    steps,
    table,
    target,
    targets,
    timeseries,
)
from growpage.monitoring.promql import le_value

UID = "growpage-overview"
TITLE = "GrowPage / Overview"
RANGE = "$__range"

_LATENCY = catalog.ALLOCATION_LATENCY.name


def _threshold_ms(t: catalog.MixinThresholds) -> str:
    return f"{t.allocation_latency_s * 1000:g} ms"


def _share_fast(window: str, t: catalog.MixinThresholds) -> str:
    fast_bucket = metric(f"{_LATENCY}_bucket", f'le="{le_value(t.allocation_latency_s)}"')
    return (f"sum(increase({fast_bucket}[{window}]))\n/\n"
            f"sum(increase({metric(f'{_LATENCY}_count')}[{window}]))")


def _quantile(quantile: float, by: str = "le") -> str:
    return f"histogram_quantile({quantile}, sum by ({by}) (rate({metric(f'{_LATENCY}_bucket')}[{RATE}])))"


def _compress_ratio(window: str) -> str:
    return (f"sum(increase({metric(catalog.COMPRESS_INPUT_BYTES.name)}[{window}]))\n/\n"
            f"sum(increase({metric(catalog.COMPRESS_OUTPUT_BYTES.name)}[{window}]))")


def _budget_left(slo: str, budget: float) -> str:
    """1 - (error ratio over the budget window) / budget, from the SLO's recorded base-window rates.

    The window is :data:`catalog.SLO_BUDGET_PANEL_WINDOW`, inside kube-prometheus-stack's default
    10-day retention; a 30-day window would read only what the retention still holds.
    """
    window = catalog.SLO_BUDGET_PANEL_WINDOW
    good, total = (f"sum(sum_over_time({rule(rec.slo_events_name(slo, kind), service=True)}[{window}]))"
                   for kind in ("good", "total"))
    return f"1 - (\n  (1 - {good}\n  / {total})\n) / {budget:g}"


def _users_row(t: catalog.MixinThresholds) -> list[Cell]:
    """What vLLM's users feel, as the pages read it: the budget each vLLM SLO has left."""
    objectives = [(slo.name, slo.objective, slo.description) for slo in t.vllm_latency_slos]
    availability = t.vllm_availability_slo
    objectives.append((availability.name, availability.objective, availability.description))
    return [Cell(stat(f"{name} budget left ({catalog.SLO_BUDGET_PANEL_WINDOW})",
                      f"{description} Share of the error budget not spent over the last "
                      f"{catalog.SLO_BUDGET_PANEL_WINDOW}, every vLLM pod counted; below 0 the SLO is missed.",
                      _budget_left(name, round(1 - objective, 10)), RATIO_UNIT, steps("red", (0.0, "green")), 1),
                 8, 4) for name, objective, description in objectives]


def _slo_row(t: catalog.MixinThresholds) -> list[Cell]:
    utilization, ratio, objective = t.utilization_objective, t.compress_ratio_objective, t.allocation_latency_objective
    budget, threshold_ms = round(1 - objective, 10), _threshold_ms(t)
    p99_limit_s = t.checklist.allocation_latency_p99_critical_s
    # Sum of live tokens over sum of granted slots: an idle pod weighs nothing, a busy one its size.
    busy = f"sum({metric(catalog.LIVE_TOKENS.name)})\n/\nsum({metric(catalog.GRANTED_TOKEN_SLOTS.name)})"
    budget_left = _budget_left(catalog.SLO_ALLOCATION_LATENCY.name, budget)
    return [
        Cell(stat(f"KV page utilization (SLO >= {utilization:.0%})",
                  t.slo_utilization.description + " Live tokens / granted slots, summed over the pods.",
                  busy, RATIO_UNIT, steps("red", (utilization, "green"))), 5, 5),
        Cell(stat(f"Compress ratio (SLO >= {ratio:.1f}x)",
                  t.slo_compress_ratio.description + " Bytes in / bytes out over the selected range.",
                  _compress_ratio(RANGE), TIMES_UNIT, steps("red", (ratio, "green")), 2), 5, 5),
        Cell(stat(f"Grants under {threshold_ms} (SLO >= {objective:.0%})",
                  t.slo_allocation_latency.description + " Over the selected range.",
                  _share_fast(RANGE, t), RATIO_UNIT, steps("red", (objective, "green")), 2), 5, 5),
        Cell(stat(f"Latency error budget left ({catalog.SLO_BUDGET_PANEL_WINDOW})",
                  f"Share of the error budget ({budget:.0%} of grants may take {threshold_ms} or more) not "
                  f"spent over the last {catalog.SLO_BUDGET_PANEL_WINDOW}, from the recorded per-service "
                  "rates (replaced pods included); below 0 the SLO is missed.",
                  budget_left, RATIO_UNIT, steps("red", (0.0, "green")), 1), 5, 5),
        Cell(stat("Allocation latency p99", f"SLO: p99 under {threshold_ms}; the checklist tickets above "
                  f"{p99_limit_s * 1000:g} ms.", _quantile(0.99), SECONDS_UNIT,
                  steps("green", (t.allocation_latency_s, "yellow"), (p99_limit_s, "red"))),
             4, 5),
    ]


def _capacity_row(t: catalog.MixinThresholds) -> list[Cell]:
    slo, low = t.utilization_objective, t.checklist.utilization_sustained_low
    return [
        Cell(timeseries("KV page utilization", catalog.UTILIZATION.help,
                        targets((metric(catalog.UTILIZATION.name), "{{namespace}}/{{pod}}")), RATIO_UNIT,
                        steps("red", (low, "yellow"), (slo, "green"))), 12),
        Cell(timeseries("Page table fragmentation", catalog.FRAGMENTATION.help,
                        targets((metric(catalog.FRAGMENTATION.name), "{{namespace}}/{{pod}}")), RATIO_UNIT,
                        steps("green", (t.checklist.fragmentation_high, "red"))), 12),
        Cell(timeseries("Pool pages by state", catalog.POOL_PAGES.help,
                        targets((f"sum by (state) ({metric(catalog.POOL_PAGES.name)})", "{{state}}")),
                        "short", stacked=True), 8),
        Cell(timeseries("KV demand (pages)", catalog.DEMAND_PAGES.help + " The p95 is over every running "
                        "request of the selection (a cluster-autoscaling signal).",
                        targets((f"sum by (namespace) ({metric(catalog.DEMAND_PAGES.name)})", "{{namespace}} total"),
                                (f'histogram_quantile(0.95, sum by (le) (label_replace(sum by (pages_le) '
                                 f'({metric(catalog.DEMAND_REQUESTS.name)}), "le", "$1", "pages_le", "(.*)")))',
                                 "p95 per request")), "short"), 8),
        Cell(timeseries("Pages granted per second",
                        catalog.ALLOCATIONS.help + " Under overload it falls (grants wait for free pages), so the HPA "
                        f"scales on vLLM's queue ({catalog.VLLM_REQUESTS_WAITING}) instead.",
                        targets((rule(rec.ALLOCATIONS_RATE), "{{namespace}}/{{pod}}")),
                        "short"), 8),
    ]


def _latency_row(t: catalog.MixinThresholds) -> list[Cell]:
    lines = steps("green", (t.allocation_latency_s, "yellow"), (t.checklist.allocation_latency_p99_critical_s, "red"))
    return [
        Cell(timeseries("Page allocation latency p50 / p99", catalog.ALLOCATION_LATENCY.help,
                        [target(_quantile(0.5), "p50", "A", exemplar=True), target(_quantile(0.99), "p99", "B")],
                        SECONDS_UNIT, lines), 12),
        Cell(heatmap("Page allocation latency distribution", "Grants per latency bucket.", _LATENCY,
                     SECONDS_UNIT), 12),
    ]


def _decisions_row(t: catalog.MixinThresholds) -> list[Cell]:
    decisions = f"sum by (decision) (rate({metric(catalog.DECISIONS.name)}[{RATE}]))"
    bytes_rate = "sum(rate({}[{}]))"
    saved = (f"sum(increase({metric(catalog.COMPRESS_INPUT_BYTES.name)}[{RANGE}]))\n-\n"
             f"sum(increase({metric(catalog.COMPRESS_OUTPUT_BYTES.name)}[{RANGE}]))")
    return [
        Cell(timeseries("Decisions by kind", catalog.DECISIONS.help, targets((decisions, "{{decision}}")),
                        "ops", stacked=True, bars=True), 9),
        Cell(timeseries("Compression ratios", "Bytes in / bytes out of compressions (the SLO), and the "
                        "pool-wide logical / stored KV bytes.",
                        targets((_compress_ratio(RATE), "compressions (bytes in / out)"),
                                (f"sum({metric(catalog.LOGICAL_BYTES.name)}) / "
                                 f"sum({metric(catalog.STORED_BYTES.name)})",
                                 "pool (logical / stored)")),
                        TIMES_UNIT, steps("red", (t.compress_ratio_objective, "green"))), 6),
        Cell(timeseries("Compression throughput", "Bytes read and written by compressions per second.",
                        targets((bytes_rate.format(metric(catalog.COMPRESS_INPUT_BYTES.name), RATE), "in"),
                                (bytes_rate.format(metric(catalog.COMPRESS_OUTPUT_BYTES.name), RATE), "out")),
                        "Bps"), 5),
        Cell(stat("KV bytes saved by compression", "Bytes in minus bytes out of compressions over the "
                  "selected range: memory the pool got back.", saved, "bytes", steps("green")), 4),
    ]


def _rollout_row(t: catalog.MixinThresholds) -> list[Cell]:
    entropy = t.checklist.rollout_entropy
    modes = f"count by (namespace, mode) ({metric(catalog.BUILD_INFO.name)})"
    organize = [{"id": "organize", "options": {"excludeByName": {"Time": True},
                                               "renameByName": {"Value": "pods"}}}]
    return [
        Cell(heatmap("LTS entropy distribution", catalog.LTS_ENTROPY.help + " Phase 1 of the rollout: "
                     "watch it per namespace before enforcing.", catalog.LTS_ENTROPY.name, "none"), 10),
        Cell(timeseries(f"LTS entropy p50 by namespace (enforce above {entropy:g})",
                        f"Phase 2 candidates: namespaces whose median request entropy exceeds {entropy:g} nats "
                        f"(over {rec.LTS_ROLLOUT_WINDOW}). List them in enforce_namespaces.",
                        [target(f'{rec.LTS_ENTROPY_P50}{{namespace=~"$namespace"}}', "{{namespace}}")],
                        "none", steps("green", (entropy, "orange"))), 8),
        Cell(table("Rollout mode per namespace", "Pods per GrowPage mode (off / monitor / enforce), from "
                   f"{catalog.BUILD_INFO.name}.", modes, organize), 6),
    ]


def _forecast_row(t: catalog.MixinThresholds) -> list[Cell]:
    """Monitor's forecast of enforce (vLLM home): read before a namespace moves to enforce."""
    freed, avoidable, preempted, spare, by_admission, recompute, own = (metric(spec.name) for spec in (
        catalog.FORECAST_PAGES_FREED, catalog.FORECAST_PREEMPTIONS_AVOIDABLE, catalog.FORECAST_PREEMPTIONS,
        catalog.FORECAST_SPARE_PAGES, catalog.FORECAST_PREEMPTIONS_AVOIDABLE_BY_ADMISSION,
        catalog.FORECAST_RECOMPUTE_SECONDS_AVOIDABLE, catalog.VLLM_OWN_SECONDS))
    return [
        Cell(timeseries("Pages enforce would free (forecast)", catalog.FORECAST_PAGES_FREED.help + " Per "
                        "namespace, per second: zero means enforce would find nothing to compress.",
                        targets((f"sum by (namespace) (rate({freed}[{RATE}]))", "{{namespace}}")), "short"), 6),
        Cell(timeseries("Preemptions enforce would avoid (forecast)", catalog.FORECAST_PREEMPTIONS_AVOIDABLE.help
                        + " Beside every preemption of a monitored request (the gap is what enforce could not "
                        "avoid either) and those growth-aware admission would avoid (admission setting).",
                        targets((f"sum by (namespace) (rate({avoidable}[{RATE}]))", "{{namespace}} avoidable"),
                                (f"sum by (namespace) (rate({preempted}[{RATE}]))", "{{namespace}} all"),
                                (f"sum by (namespace) (rate({by_admission}[{RATE}]))",
                                 "{{namespace}} avoidable by admission")),
                        "short"), 6),
        Cell(timeseries("Recompute enforce would save against GrowPage's own time (forecast)",
                        catalog.FORECAST_RECOMPUTE_SECONDS_AVOIDABLE.help + " Beside GrowPage's own seconds per "
                        "second in the same namespace: where the recompute line stays below, enforce would cost "
                        "more time than it saves (gpctl calibrate says so).",
                        targets((f"sum by (namespace) (rate({recompute}[{RATE}]))", "{{namespace}} recompute saved"),
                                (f"sum by (namespace) (rate({own}[{RATE}]))", "{{namespace}} GrowPage's own")),
                        "s"), 6),
        Cell(timeseries("Spare pages under enforce (forecast)", catalog.FORECAST_SPARE_PAGES.help,
                        targets((f"sum by (namespace) ({spare})", "{{namespace}}")), "short"), 6),
    ]


def _admission_row(t: catalog.MixinThresholds) -> list[Cell]:
    """Growth-aware admission under enforce (vLLM home): why requests queue while pages are free."""
    holds, projected, pool, lookahead = (metric(spec.name) for spec in (
        catalog.ADMISSION_HOLDS, catalog.ADMISSION_PROJECTED_PAGES, catalog.POOL_PAGES, catalog.ADMISSION_LOOKAHEAD))
    return [
        Cell(timeseries("Steps admission held a request", catalog.ADMISSION_HOLDS.help + " Requests then wait in "
                        f"vLLM's queue ({catalog.VLLM_REQUESTS_WAITING}) with pages still free: they are the room "
                        "the running requests will grow into.",
                        targets((f"sum by (namespace, pod) (rate({holds}[{RATE}]))", "{{namespace}}/{{pod}}")),
                        "short"), 8),
        Cell(timeseries("Admission looks ahead", catalog.ADMISSION_LOOKAHEAD.help + " A pod at 0 admits as vLLM "
                        "does: preemptions there are the price auto chose for a wider batch.",
                        targets((f"max by (namespace, pod) ({lookahead})", "{{namespace}}/{{pod}}")),
                        "short"), 8),
        Cell(timeseries("Projected pages against the pool", catalog.ADMISSION_PROJECTED_PAGES.help
                        + " Beside the pool's size: admission keeps the first under the second.",
                        targets((f"sum by (namespace, pod) ({projected})", "{{namespace}}/{{pod}} projected"),
                                (f"sum by (namespace, pod) ({pool})", "{{namespace}}/{{pod}} pool")),
                        "short"), 8),
    ]


def overview_dashboard(t: catalog.MixinThresholds = catalog.MIXIN_THRESHOLDS) -> dict:
    """The dashboard with the thresholds ``t`` (its panels' threshold lines and titles)."""
    return dashboard(TITLE, UID, "GrowPage SLOs and KV cache behaviour per namespace, pod and model.", [
        ("What users feel: vLLM's SLOs", _users_row(t)),
        ("SLOs", _slo_row(t)),
        ("Capacity", _capacity_row(t)),
        ("Page allocation latency", _latency_row(t)),
        ("Decisions and compression", _decisions_row(t)),
        ("Rollout", _rollout_row(t)),
        ("Before enforce: monitor's forecast", _forecast_row(t)),
        ("Admission under enforce", _admission_row(t)),
    ])
