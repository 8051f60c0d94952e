"""What calibration reads: per model, the three distributions over one window, and the build info.

Built from expositions (live scrapes, saved snapshots) here, or from Prometheus bucket increases
in :mod:`growpage.calibrate.sources`. Histogram increases between expositions reuse diagnose's
reset-aware arithmetic (:func:`growpage.diagnose.scrapes.histogram_increase`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from growpage import catalog
from growpage.diagnose.exposition import Exposition
from growpage.diagnose.observations import HistogramCounts, Window
from growpage.diagnose.scrapes import counter_increase, histogram_increase
from growpage.errors import GrowPageError
from growpage.rollout import COST_COUNTERS, FORECAST_COUNTERS, ForecastEvidence, forecast_evidence

# The distributions calibration needs, in the order settings read them.
DISTRIBUTIONS = (catalog.LTS_ENTROPY, catalog.STS_DENSITY, catalog.REQUEST_TOKENS)
NAMESPACE_LABEL = "namespace"  # added by the scrape (Kubernetes service discovery), never by the agent


@dataclasses.dataclass(frozen=True)
class ModelEvidence:
    """One model's distributions over the window (``None``: the source has no such series).

    Attributes:
        model: the ``model_name`` label ("" for series without one).
        lts_by_namespace: LTS entropy per ``namespace`` label, where the scrape added one.
        block_sizes: distinct ``block_size`` labels of its ``growpage_build_info``.
        mode: the build info's ``mode`` when every series agrees, for messages.
        forecast: monitor's forecast of enforce over the window (None: no forecast series).
    """

    model: str
    lts_entropy: HistogramCounts | None = None
    sts_density: HistogramCounts | None = None
    request_tokens: HistogramCounts | None = None
    lts_by_namespace: Mapping[str, HistogramCounts] = dataclasses.field(default_factory=dict)
    block_sizes: tuple[int, ...] = ()
    mode: str | None = None
    forecast: ForecastEvidence | None = None

    def histograms(self) -> tuple[tuple[catalog.MetricSpec, HistogramCounts | None], ...]:
        """``(spec, histogram)`` in :data:`DISTRIBUTIONS` order."""
        return ((catalog.LTS_ENTROPY, self.lts_entropy), (catalog.STS_DENSITY, self.sts_density),
                (catalog.REQUEST_TOKENS, self.request_tokens))


@dataclasses.dataclass(frozen=True)
class Evidence:
    """Everything one source gave: where from, over which window, and per model."""

    source: Mapping[str, Any]  # kind, target, and source details (JSON values)
    window: Window
    models: Mapping[str, ModelEvidence]

    @property
    def wider(self) -> str:
        """How to read a longer window from this source ("" when it already reads everything)."""
        return str(self.source.get("wider", ""))

    @property
    def where(self) -> str:
        """The source in a few words, for messages: ``the agent at URL``, ``Prometheus at URL``..."""
        return str(self.source.get("where", self.source.get("target", "the source")))

    def for_model(self, model_name: str | None) -> ModelEvidence:
        """The one model to calibrate; raises GrowPageError when it is absent or ambiguous."""
        names = sorted(self.models)
        if model_name is not None:
            if model_name in self.models:
                return self.models[model_name]
            found = f"it has {', '.join(map(repr, names))}" if names else "it has none"
            raise GrowPageError(f"{self.where} has no GrowPage distributions for model_name={model_name!r} "
                                f"({found}): check --model-name")
        if not names:
            raise GrowPageError(
                f"{self.where} has no {', '.join(spec.name for spec in DISTRIBUTIONS)} series: is GrowPage "
                "running in monitor mode (mode: monitor) and is this its /metrics/growpage data?")
        if len(names) > 1:
            raise GrowPageError(f"{self.where} has distributions of {len(names)} models "
                                f"({', '.join(map(repr, names))}); "
                                "thresholds are per model: pick one with --model-name")
        return self.models[names[0]]


def _labels_model(labels: Mapping[str, str]) -> str:
    return labels.get(catalog.MODEL_LABEL, "")


def evidence_from_expositions(expositions: Sequence[Exposition], source: Mapping[str, Any],
                              sample_noun: str) -> Evidence:
    """Per-model histogram increases over ``expositions`` (one: totals since the agent started).

    Args:
        expositions: agent expositions, any order (sorted by time here).
        source: kind, target, where, for the report.
        sample_noun: ``scrapes`` or ``snapshots``, for the window's description.
    """
    agent = sorted(expositions, key=lambda exposition: exposition.time_s)
    kind = "lifetime" if len(agent) == 1 else sample_noun
    window = Window(agent[0].time_s, agent[-1].time_s, kind, num_samples=len(agent))
    histogram_names = {f"{spec.name}_bucket" for spec in DISTRIBUTIONS}
    models = sorted({_labels_model(sample.labels) for exposition in agent for sample in exposition.samples
                     if sample.name in histogram_names or sample.name == catalog.BUILD_INFO.name})
    found = {}
    for model in models:
        def of_model(labels: Mapping[str, str], model: str = model) -> bool:
            return _labels_model(labels) == model

        namespaces = sorted({sample.labels[NAMESPACE_LABEL] for exposition in agent for sample in exposition.samples
                             if sample.name == f"{catalog.LTS_ENTROPY.name}_bucket" and of_model(sample.labels)
                             and sample.labels.get(NAMESPACE_LABEL)})
        by_namespace = {}
        for namespace in namespaces:
            def of_namespace(labels: Mapping[str, str], namespace: str = namespace, model: str = model) -> bool:
                return _labels_model(labels) == model and labels.get(NAMESPACE_LABEL) == namespace

            histogram = histogram_increase(agent, catalog.LTS_ENTROPY.name, of_namespace)
            if histogram is not None:
                by_namespace[namespace] = histogram
        infos = _newest_build_infos(agent, model)
        found[model] = ModelEvidence(
            model=model,
            lts_entropy=histogram_increase(agent, catalog.LTS_ENTROPY.name, of_model),
            sts_density=histogram_increase(agent, catalog.STS_DENSITY.name, of_model),
            request_tokens=histogram_increase(agent, catalog.REQUEST_TOKENS.name, of_model),
            lts_by_namespace=by_namespace, block_sizes=block_sizes(infos), mode=agreed(infos, "mode"),
            forecast=forecast_evidence({spec.name: counter_increase(agent, spec.name, of_model)
                                        for spec in (*FORECAST_COUNTERS, *COST_COUNTERS)}))
    return Evidence(source=dict(source), window=window, models=found)


def _newest_build_infos(agent: Sequence[Exposition], model: str) -> list[Mapping[str, str]]:
    # The newest exposition that has one: a restart inside the window may have changed the settings.
    for exposition in reversed(agent):
        infos = [sample.labels for sample in exposition.samples
                 if sample.name == catalog.BUILD_INFO.name and _labels_model(sample.labels) == model]
        if infos:
            return infos
    return []


def block_sizes(infos: Sequence[Mapping[str, str]]) -> tuple[int, ...]:
    """Distinct whole ``block_size`` labels of build-info label sets, sorted."""
    sizes = set()
    for labels in infos:
        try:
            sizes.add(int(float(labels.get("block_size", ""))))
        except ValueError:
            continue  # absent or not a number: as if the label were missing
    return tuple(sorted(size for size in sizes if size >= 1))


def agreed(infos: Sequence[Mapping[str, str]], label: str) -> str | None:
    """The value of ``label`` when every label set that has it agrees, else ``None``."""
    values = {labels.get(label) for labels in infos} - {None, ""}
    return values.pop() if len(values) == 1 else None
