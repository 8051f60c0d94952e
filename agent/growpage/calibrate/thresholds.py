"""Pure threshold choice: quantiles of the monitored distributions -> GrowPage settings.

Every quantile comes from histogram buckets with ``histogram_quantile`` semantics (linear inside
the bucket, capped at the top finite bound): :meth:`growpage.diagnose.observations.HistogramCounts.quantile`,
the one bucket interpolation GrowPage has, imported rather than written twice.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from growpage import catalog
from growpage.calibrate.evidence import ModelEvidence
from growpage.config import GrowPageConfig
from growpage.config import min_base_pages as config_min_base_pages
from growpage.diagnose.observations import HistogramCounts
from growpage.errors import GrowPageError
from growpage.rollout import Rollout, recommend

DEFAULT_MIN_SAMPLES = 50
# Written thresholds keep 4 decimals: finer than any bucket, short enough to read in a review.
THRESHOLD_DECIMALS = 4
_DEFAULTS = GrowPageConfig()


@dataclasses.dataclass(frozen=True)
class Quantiles:
    """The quantile each setting is read at (fractions in (0, 1)).

    Attributes:
        lts_grow: of LTS entropy at finish; requests above it grow at their boundary (0.75: about
            the top quarter grows instead of evicting).
        rollout_entropy: of LTS entropy at finish; namespaces whose LTS p50 exceeds it are
            rollout candidates.
        density: of STS density at boundary decisions; above it the working set counts as dense.
        request_tokens: of request sizes at finish; ``base_pages`` grants this many tokens.
    """

    lts_grow: float = 0.75
    rollout_entropy: float = 0.9
    density: float = 0.75
    request_tokens: float = 0.5

    def __post_init__(self) -> None:
        for option, value in self.options().items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
                raise GrowPageError(f"{option} must be a fraction between 0 and 1 (exclusive), got {value!r}; "
                                    "e.g. 0.75")

    def options(self) -> dict[str, float]:
        """CLI option -> value."""
        return {"--lts-quantile": self.lts_grow, "--rollout-quantile": self.rollout_entropy,
                "--density-quantile": self.density, "--tokens-quantile": self.request_tokens}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One calibrated setting and the evidence behind it.

    Attributes:
        name: the GrowPageConfig field.
        value: what the config file says (rounded, clamped).
        metric: the histogram it was read from.
        quantile: the quantile read.
        observed: the quantile itself, before rounding, division and clamping.
        samples: observations the histogram held in the window.
        notes: why ``value`` differs from ``observed`` beyond rounding, or how far to trust it.
    """

    name: str
    value: float | int
    metric: str
    quantile: float
    observed: float
    samples: float
    notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The settings for one model, and which namespaces look like rollout candidates."""

    model: str
    block_size: int
    block_size_from: str  # "growpage_build_info" or "--block-size"
    settings: tuple[Setting, ...]
    # Namespaces whose LTS p50 exceeds the calibrated rollout_entropy_threshold: namespace -> p50.
    rollout_candidates: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # Enforce or not, from monitor's forecast of enforce (growpage.rollout); None: not asked.
    rollout: Rollout | None = None

    def config_values(self) -> dict[str, float | int]:
        """The config file's fields: ``block_size`` (``base_pages`` counts its pages) and the settings."""
        return {"block_size": self.block_size, **{setting.name: setting.value for setting in self.settings}}


def min_base_pages(block_size: int) -> int:
    """The smallest ``base_pages`` GrowPageConfig accepts at ``block_size`` with its other defaults.

    Sinks and the recent window must fit in the pages an eviction may keep (see GrowPageConfig).
    """
    return config_min_base_pages(block_size, _DEFAULTS.sink_tokens, _DEFAULTS.recent_window_tokens,
                                 _DEFAULTS.evict_min_pages)


def check_samples(evidence: ModelEvidence, min_samples: int, where: str, wider: str = "") -> None:
    """Raise GrowPageError, one line saying how to fix it, when a distribution is missing or thin."""
    for spec, histogram in evidence.histograms():
        if histogram is None:
            raise GrowPageError(
                f"{spec.name} is missing from {where}{_for_model(evidence.model)}: run GrowPage in monitor "
                "mode (mode: monitor) with traffic so it exports the distribution, then calibrate again")
        if histogram.count < min_samples:
            mode = f" (growpage_build_info says mode={evidence.mode})" if evidence.mode else ""
            raise GrowPageError(
                f"only {histogram.count:g} {spec.name} samples{_for_model(evidence.model)} in {where}, "
                f"need --min-samples {min_samples}{mode}: let more requests run with GrowPage in monitor "
                f"mode, {f'read {wider}, ' if wider else ''}or lower --min-samples")


def _for_model(model: str) -> str:
    return f" for model_name={model!r}" if model else ""


def calibrate(evidence: ModelEvidence, quantiles: Quantiles, block_size: int | None = None,
              min_samples: int = DEFAULT_MIN_SAMPLES, where: str = "the source", wider: str = "") -> Calibration:
    """Settings for one model from its distributions.

    Args:
        evidence: the model's histograms over the window, and the block sizes its build info names.
        quantiles: which quantile each setting is read at.
        block_size: overrides the build info's ``block_size`` (``--block-size``).
        min_samples: fewest observations a distribution needs.
        where: the source, for messages.
        wider: how to read a longer window from this source, for the too-few-samples message.

    Raises:
        GrowPageError: a distribution is missing or has fewer than ``min_samples`` observations, or
            the block size is unknown or ambiguous.
    """
    check_samples(evidence, min_samples, where, wider)
    size, size_from = _block_size(evidence, block_size, where)
    lts, density, tokens = evidence.lts_entropy, evidence.sts_density, evidence.request_tokens
    assert lts is not None and density is not None and tokens is not None  # check_samples raised otherwise
    grow = _threshold("lts_grow_threshold", catalog.LTS_ENTROPY.name, lts, quantiles.lts_grow, high=None)
    rollout = _threshold("rollout_entropy_threshold", catalog.LTS_ENTROPY.name, lts, quantiles.rollout_entropy,
                         high=None)
    dense = _threshold("density_threshold", catalog.STS_DENSITY.name, density, quantiles.density, high=1.0)
    settings = (grow, rollout, dense, _base_pages(tokens, quantiles.request_tokens, size))
    candidates = {namespace: p50 for namespace, histogram in sorted(evidence.lts_by_namespace.items())
                  if (p50 := histogram.quantile(0.5)) is not None and p50 > rollout.value}
    return Calibration(model=evidence.model, block_size=size, block_size_from=size_from, settings=settings,
                       rollout_candidates=candidates, rollout=recommend(evidence.forecast, evidence.mode))


def _block_size(evidence: ModelEvidence, override: int | None, where: str) -> tuple[int, str]:
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, int) or override < 1:
            raise GrowPageError(f"--block-size must be a whole number of tokens >= 1, got {override!r}; e.g. 16")
        return override, "--block-size"
    sizes = evidence.block_sizes
    if not sizes:
        raise GrowPageError(f"{where} has no {catalog.BUILD_INFO.name} with a block_size label"
                            f"{_for_model(evidence.model)}: pass --block-size (the deployment's block_size)")
    if len(sizes) > 1:
        raise GrowPageError(f"{catalog.BUILD_INFO.name} names several block sizes ({', '.join(map(str, sizes))})"
                            f"{_for_model(evidence.model)} in {where}: pass --block-size for the one to calibrate, "
                            "or narrow the source (--namespace, a shorter --since)")
    return sizes[0], catalog.BUILD_INFO.name


def _quantile(histogram: HistogramCounts, q: float) -> tuple[float, tuple[str, ...]]:
    value = histogram.quantile(q)
    assert value is not None  # check_samples ensured observations
    finite = [(bound, count) for bound, count in histogram.buckets if math.isfinite(bound)]
    if finite and q * histogram.count > finite[-1][1]:
        # histogram_quantile caps a rank in the +Inf bucket at the top finite bound.
        return value, (f"the q{q:g} rank lies above the top bucket ({finite[-1][0]:g}): the value is a lower bound",)
    return value, ()


def _threshold(name: str, metric: str, histogram: HistogramCounts, q: float, high: float | None) -> Setting:
    observed, notes = _quantile(histogram, q)
    value = round(max(0.0, observed), THRESHOLD_DECIMALS)
    if high is not None and value > high:
        value, notes = high, (*notes, f"clamped to {high:g}, the most GrowPageConfig accepts")
    return Setting(name=name, value=value, metric=metric, quantile=q, observed=observed,
                   samples=histogram.count, notes=notes)


def _base_pages(tokens: HistogramCounts, q: float, block_size: int) -> Setting:
    observed, notes = _quantile(tokens, q)
    # The 1e-9 keeps a quantile that is a whole number of pages (up to float error) from gaining one.
    pages = max(1, math.ceil(observed / block_size - 1e-9))
    floor = min_base_pages(block_size)
    if pages < floor:
        notes = (*notes, f"raised from {pages} to {floor}: sink_tokens + recent_window_tokens "
                         f"({_DEFAULTS.sink_tokens} + {_DEFAULTS.recent_window_tokens}) must fit in "
                         "(base_pages - evict_min_pages) pages")
        pages = floor
    return Setting(name="base_pages", value=pages, metric=catalog.REQUEST_TOKENS.name, quantile=q,
                   observed=observed, samples=tokens.count, notes=notes)
