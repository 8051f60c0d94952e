"""Shared pieces of the GrowPage dashboards: data source, variables, panel factories, layout.

grafanalib builds the JSON; what it lacks for Grafana 10/11 (the modern heatmap, threshold steps
whose base value is JSON null) is filled in here.
"""

from __future__ import annotations

import dataclasses
import json

import attr
from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from growpage import catalog
from growpage.monitoring.promql import selector

DATASOURCE_VARIABLE = "datasource"
DATASOURCE = {"type": "prometheus", "uid": f"${{{DATASOURCE_VARIABLE}}}"}
# Every GrowPage series carries these; the variables default to All (regex .*, which also matches
# a series without the label: a single-cluster Prometheus has no `cluster`).
FILTER = (f'cluster=~"$cluster", job=~"$job", namespace=~"$namespace", pod=~"$pod", '
          f'{catalog.MODEL_LABEL}=~"${catalog.MODEL_LABEL}"')
POD_FILTER = 'cluster=~"$cluster", namespace=~"$namespace", pod=~"$pod"'
# vLLM's own series: another job (its /metrics), same pods, same model_name label. Recording rules
# keep only their level's labels (no job), so they are filtered the same way.
VLLM_FILTER = f'{POD_FILTER}, {catalog.MODEL_LABEL}=~"${catalog.MODEL_LABEL}"'
RULE_FILTER = VLLM_FILTER
SERVICE_RULE_FILTER = f'cluster=~"$cluster", namespace=~"$namespace", {catalog.MODEL_LABEL}=~"${catalog.MODEL_LABEL}"'
RATE = "$__rate_interval"
SCHEMA_VERSION = 39  # Grafana 10.4 / 11: no legacy migrations run on import
GRID_COLUMNS = 24
RATIO_UNIT, SECONDS_UNIT, TIMES_UNIT = "percentunit", "s", "suffix:x"


def metric(name: str, extra: str = "", filter_: str = FILTER) -> str:
    """``name{cluster=~"$cluster", job=~"$job", namespace=~"$namespace", ..., <extra>}``."""
    return selector(name, ", ".join(part for part in (filter_, extra) if part))


def rule(name: str, service: bool = False) -> str:
    """A recording rule's series, filtered by the variables its level keeps (pod, or the service)."""
    return selector(name, SERVICE_RULE_FILTER if service else RULE_FILTER)


def steps(base_color: str, *levels: tuple[float, str]) -> list[dict]:
    """Threshold steps: ``base_color`` below the first level, then each (value, color)."""
    return [{"color": base_color, "value": None}, *({"color": c, "value": v} for v, c in levels)]


class ExemplarTarget(g.Target):
    """A query whose exemplars Grafana draws (grafanalib's Target has no such field).

    GrowPage attaches the request's ``trace_id`` and ``span_id`` to grant-latency samples as
    OpenMetrics exemplars; with Prometheus' exemplar storage on and the datasource's
    ``exemplarTraceIdDestinations`` pointing at the tracing backend
    (``deploy/components/monitoring/grafana-datasource.yaml``), a point on the panel opens the trace
    of the request behind it, GrowPage's spans under vLLM's.
    """

    def to_json_data(self) -> dict:
        return {**super().to_json_data(), "exemplar": True}


def target(expr: str, legend: str = "", ref_id: str = "A", instant: bool = False,
           table: bool = False, exemplar: bool = False) -> g.Target:
    kind = ExemplarTarget if exemplar else g.Target
    return kind(expr=expr, legendFormat=legend, refId=ref_id, instant=instant, intervalFactor=1,
                format="table" if table else "time_series", datasource=DATASOURCE)


def targets(*pairs: tuple[str, str]) -> list[g.Target]:
    """(expr, legend) pairs with refIds A, B, C..."""
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def runbook_links(*alert_names: str) -> str:
    """Markdown links to runbooks (panel descriptions render Markdown)."""
    return " ".join(f"Runbook: [{name}]({catalog.RUNBOOK_BASE_URL}/{name}.md)." for name in alert_names)


def timeseries(title: str, description: str, panel_targets: list[g.Target], unit: str,
               thresholds: list[dict] | None = None, stacked: bool = False, bars: bool = False) -> g.TimeSeries:
    return g.TimeSeries(
        title=title, description=description, dataSource=DATASOURCE, targets=panel_targets, unit=unit,
        thresholds=thresholds or steps("green"), thresholdsStyleMode="dashed" if thresholds else "off",
        stacking={"mode": "normal", "group": "A"} if stacked else {}, drawStyle="bars" if bars else "line",
        fillOpacity=60 if bars else 10, legendDisplayMode="table", legendCalcs=["lastNotNull", "max"],
        tooltipMode="multi")


def stat(title: str, description: str, expr: str, unit: str, thresholds: list[dict],
         decimals: int | None = None) -> g.Stat:
    return g.Stat(title=title, description=description, dataSource=DATASOURCE,
                  targets=[target(expr, instant=True)], format=unit, thresholds=thresholds,
                  reduceCalc="lastNotNull", graphMode="none", colorMode="background",
                  decimals=decimals, noValue="no data")


def table(title: str, description: str, expr: str, transformations: list[dict]) -> g.Table:
    return g.Table(title=title, description=description, dataSource=DATASOURCE,
                   targets=[target(expr, instant=True, table=True)], transformations=transformations)


@attr.s
class Heatmap(g.Panel):
    """Grafana's (non-legacy) heatmap over pre-bucketed Prometheus histograms."""

    unit = attr.ib(default="", validator=attr.validators.instance_of(str))

    def to_json_data(self) -> dict:
        return self.panel_json({
            "type": "heatmap",
            "fieldConfig": {"defaults": {"unit": self.unit}, "overrides": []},
            "options": {
                "calculate": False,  # the series are histogram buckets already
                "cellGap": 1,
                "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential",
                          "exponent": 0.5, "steps": 64, "fill": "dark-orange"},
                "yAxis": {"axisPlacement": "left", "unit": self.unit},
                "rowsFrame": {"layout": "auto"},
                "tooltip": {"show": True, "yHistogram": False},
                "legend": {"show": True},
                "filterValues": {"le": 1e-9},
            },
        })


def heatmap(title: str, description: str, histogram: str, unit: str) -> Heatmap:
    expr = f"sum by (le) (increase({metric(f'{histogram}_bucket')}[{RATE}]))"
    heatmap_target = attr.evolve(target(expr, "{{le}}"), format="heatmap")
    # grafanalib ships no type information: mypy's attrs plugin knows Heatmap's own field, not g.Panel's.
    return Heatmap(title=title, description=description, dataSource=DATASOURCE,  # type: ignore[call-arg]
                   targets=[heatmap_target], unit=unit, maxDataPoints=200)


# The datasource deploy/components/monitoring provisions (never as the default: it must not take
# over kube-prometheus-stack's). Grafana falls back to the default datasource where it is absent.
PROVISIONED_DATASOURCE = {"text": "GrowPage Prometheus", "value": "growpage-prometheus"}


def _datasource_variable() -> g.Template:
    variable = g.Template(name=DATASOURCE_VARIABLE, label="Data source", query="prometheus", type="datasource")
    variable._current = {"selected": True, **PROVISIONED_DATASOURCE}  # no setter
    return variable


def variables() -> g.Templating:
    """datasource, cluster, job, namespace, pod, model_name; each label variable narrows the next."""
    def label_variable(name: str, label: str, query: str) -> g.Template:
        variable = g.Template(name=name, label=label, query=query, dataSource=DATASOURCE, multi=True,
                              includeAll=True, allValue=".*", refresh=g.REFRESH_ON_TIME_RANGE_CHANGE,
                              sort=g.SORT_ALPHA_ASC)
        variable._current = {"selected": True, "text": ["All"], "value": ["$__all"]}  # no setter
        return variable

    info, model = catalog.BUILD_INFO.name, catalog.MODEL_LABEL
    return g.Templating(list=[
        _datasource_variable(),
        label_variable("cluster", "Cluster", f"label_values({info}, cluster)"),
        label_variable("job", "Job", f'label_values({info}{{cluster=~"$cluster"}}, job)'),
        label_variable("namespace", "Namespace",
                       f'label_values({info}{{cluster=~"$cluster", job=~"$job"}}, namespace)'),
        label_variable("pod", "Pod", f'label_values({info}{{cluster=~"$cluster", job=~"$job", '
                                     f'namespace=~"$namespace"}}, pod)'),
        label_variable(model, "Model", f'label_values({info}{{{POD_FILTER}, job=~"$job"}}, {model})'),
    ])


@dataclasses.dataclass(frozen=True)
class Cell:
    """A panel and its size in grid units (24 columns wide; one height unit is 30 px)."""

    panel: g.Panel
    width: int
    height: int = 8


def layout(sections: list[tuple[str, list[Cell]]]) -> list[g.Panel]:
    """Row headers and panels, left to right, wrapping at 24 columns; ids in reading order."""
    panels, y, next_id = [], 0, 1
    for title, cells in sections:
        panels.append(g.RowPanel(title=title, id=next_id, gridPos=g.GridPos(h=1, w=GRID_COLUMNS, x=0, y=y)))
        next_id, y, x, row_height = next_id + 1, y + 1, 0, 0
        for cell in cells:
            if x + cell.width > GRID_COLUMNS:
                x, y, row_height = 0, y + row_height, 0
            position = g.GridPos(h=cell.height, w=cell.width, x=x, y=y)
            panels.append(attr.evolve(cell.panel, id=next_id, gridPos=position))
            next_id, x, row_height = next_id + 1, x + cell.width, max(row_height, cell.height)
        y += row_height
    return panels


def dashboard(title: str, uid: str, description: str, sections: list[tuple[str, list[Cell]]]) -> dict:
    """The dashboard as Grafana's JSON model (a dict ready for json.dumps)."""
    board = g.Dashboard(
        title=title, uid=uid, description=description, tags=["growpage"], timezone="browser",
        time=g.Time("now-6h", "now"), refresh="30s", schemaVersion=SCHEMA_VERSION,
        graphTooltip=g.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR, templating=variables(),
        links=[{"title": "GrowPage dashboards", "type": "dashboards", "tags": ["growpage"],
                "asDropdown": False, "includeVars": True, "keepTime": True}],
        panels=layout(sections),
    )
    return json.loads(json.dumps(board.to_json_data(), cls=DashboardEncoder))


def to_json_text(document: dict) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"
