"""Threshold choice from histogram buckets, without I/O: interpolation inside a bucket (as
``histogram_quantile``), rounding and clamping to what GrowPageConfig accepts, the refusals, and the
file's header and values."""

from __future__ import annotations

import datetime
import math

import pytest
import yaml

from growpage import catalog
from growpage.calibrate import Calibration, Evidence, ModelEvidence, Quantiles, calibrate, render_yaml, write_config
from growpage.calibrate.output import count_text
from growpage.calibrate.thresholds import min_base_pages
from growpage.config import GrowPageConfig, load_config
from growpage.diagnose.observations import HistogramCounts, Window
from growpage.errors import ConfigError, GrowPageError

INF = math.inf


def cumulative(bounds: tuple[float, ...], counts: tuple[float, ...]) -> HistogramCounts:
    """Buckets from per-bucket counts (the last one is the +Inf bucket's own)."""
    assert len(counts) == len(bounds) + 1
    running, buckets = 0.0, []
    for bound, count in zip((*bounds, INF), counts, strict=True):
        running += count
        buckets.append((bound, running))
    return HistogramCounts(buckets=tuple(buckets))


# 100 requests: LTS 20 in (1, 2], 60 in (2, 3], 20 in (3, 4]; density 100 decisions; sizes in tokens.
LTS = HistogramCounts(buckets=((1.0, 0.0), (2.0, 20.0), (3.0, 80.0), (4.0, 100.0), (INF, 100.0)))
DENSITY = HistogramCounts(buckets=((0.5, 50.0), (0.75, 50.0), (1.0, 100.0), (INF, 100.0)))
TOKENS = HistogramCounts(buckets=((256.0, 40.0), (512.0, 90.0), (1024.0, 100.0), (INF, 100.0)))


def model(**changes) -> ModelEvidence:
    values = dict(model="m", lts_entropy=LTS, sts_density=DENSITY, request_tokens=TOKENS, block_sizes=(16,),
                  mode="monitor")
    values.update(changes)
    return ModelEvidence(**values)


def settings(calibration: Calibration) -> dict:
    return {setting.name: setting for setting in calibration.settings}


def test_quantiles_interpolate_linearly_inside_the_bucket():
    chosen = settings(calibrate(model(), Quantiles()))
    # q0.75 of LTS: rank 75 lies in (2, 3] holding ranks 20..80 -> 2 + (75 - 20) / 60
    assert chosen["lts_grow_threshold"].observed == pytest.approx(2 + 55 / 60)
    assert chosen["lts_grow_threshold"].value == round(2 + 55 / 60, 4) == 2.9167
    # q0.9: rank 90 in (3, 4] holding ranks 80..100 -> 3.5
    assert chosen["rollout_entropy_threshold"].value == 3.5
    # q0.75 of density: rank 75 in (0.75, 1.0] (the (0.5, 0.75] bucket is empty) -> 0.875
    assert chosen["density_threshold"].value == 0.875
    # q0.5 of tokens: rank 50 in (256, 512] holding 40..90 -> 307.2 tokens -> ceil(19.2) = 20 pages
    assert chosen["base_pages"].observed == pytest.approx(307.2)
    assert chosen["base_pages"].value == 20
    assert all(setting.samples == 100 and not setting.notes for setting in chosen.values())


def test_the_lowest_bucket_starts_at_zero_and_a_quantile_on_a_bound_is_that_bound():
    lts = HistogramCounts(buckets=((0.5, 100.0), (1.0, 100.0), (INF, 100.0)))
    assert settings(calibrate(model(lts_entropy=lts), Quantiles()))["lts_grow_threshold"].value == 0.375
    tokens = HistogramCounts(buckets=((320.0, 50.0), (640.0, 100.0), (INF, 100.0)))  # the median is 320 exactly
    assert settings(calibrate(model(request_tokens=tokens), Quantiles()))["base_pages"].value == 20  # not 21


def test_a_rank_in_the_inf_bucket_is_capped_at_the_top_bound_and_says_so():
    lts = cumulative(catalog.LTS_ENTROPY.buckets, (0,) * 11 + (60, 40))  # 40 % above 8 nats
    chosen = settings(calibrate(model(lts_entropy=lts), Quantiles()))["rollout_entropy_threshold"]
    assert chosen.value == 8.0
    assert chosen.notes == ("the q0.9 rank lies above the top bucket (8): the value is a lower bound",)


def test_values_are_clamped_to_what_growpage_config_accepts():
    density = HistogramCounts(buckets=((1.0, 0.0), (2.0, 100.0), (INF, 100.0)))  # a foreign agent's buckets
    short = HistogramCounts(buckets=((16.0, 80.0), (32.0, 100.0), (INF, 100.0)))  # requests of ~10 tokens
    chosen = settings(calibrate(model(sts_density=density, request_tokens=short), Quantiles()))
    assert chosen["density_threshold"].value == 1.0
    assert "clamped to 1" in chosen["density_threshold"].notes[0]
    # sinks + recent window (4 + 64 tokens) must fit in base_pages - 1 pages of 16 tokens
    assert min_base_pages(16) == 6
    assert chosen["base_pages"].value == 6 and "raised from 1 to 6" in chosen["base_pages"].notes[0]
    GrowPageConfig(block_size=16, base_pages=6)
    with pytest.raises(ConfigError):
        GrowPageConfig(block_size=16, base_pages=5)


def test_stated_quantiles_move_the_thresholds():
    chosen = settings(calibrate(model(), Quantiles(lts_grow=0.5, rollout_entropy=0.8, density=0.5,
                                                   request_tokens=0.9)))
    assert chosen["lts_grow_threshold"].value == 2.5  # rank 50 in (2, 3]
    assert chosen["rollout_entropy_threshold"].value == 3.0
    assert chosen["density_threshold"].value == 0.5
    assert chosen["base_pages"].value == 32  # rank 90: 512 tokens exactly


@pytest.mark.parametrize("value", [0.0, 1.0, 1.5, -0.1])
def test_a_quantile_outside_zero_one_is_refused(value):
    with pytest.raises(GrowPageError, match=r"--lts-quantile must be a fraction between 0 and 1"):
        Quantiles(lts_grow=value)


def test_rollout_candidates_are_namespaces_whose_p50_exceeds_the_threshold():
    high = HistogramCounts(buckets=((3.0, 0.0), (4.0, 10.0), (INF, 10.0)))  # p50 3.5: equal, not above
    higher = HistogramCounts(buckets=((3.0, 0.0), (4.0, 2.0), (5.0, 10.0), (INF, 10.0)))  # p50 4.375
    low = HistogramCounts(buckets=((2.0, 10.0), (INF, 10.0)))
    chosen = calibrate(model(lts_by_namespace={"reasoning": higher, "chat": low, "batch": high}), Quantiles())
    assert dict(chosen.rollout_candidates) == {"reasoning": pytest.approx(4.375)}


def test_block_size_comes_from_build_info_unless_given():
    assert calibrate(model(), Quantiles()).block_size_from == catalog.BUILD_INFO.name
    overridden = calibrate(model(), Quantiles(), block_size=32)
    assert overridden.block_size == 32 and overridden.block_size_from == "--block-size"
    assert settings(overridden)["base_pages"].value == 10  # ceil(307.2 / 32)
    with pytest.raises(GrowPageError, match="no growpage_build_info with a block_size label.*pass --block-size"):
        calibrate(model(block_sizes=()), Quantiles())
    with pytest.raises(GrowPageError, match=r"several block sizes \(16, 32\).*pass --block-size"):
        calibrate(model(block_sizes=(16, 32)), Quantiles())


def test_missing_and_thin_distributions_are_refused_with_the_fix():
    with pytest.raises(GrowPageError, match="growpage_sts_density_ratio is missing from the agent.*monitor mode"):
        calibrate(model(sts_density=None), Quantiles(), where="the agent")
    thin = HistogramCounts(buckets=((2.0, 12.0), (INF, 12.0)))
    with pytest.raises(GrowPageError, match=r"only 12 growpage_lts_entropy samples for model_name='m' in the agent, "
                                            r"need --min-samples 50 \(growpage_build_info says mode=monitor\)"):
        calibrate(model(lts_entropy=thin), Quantiles(), where="the agent")
    assert calibrate(model(lts_entropy=thin), Quantiles(), min_samples=12).settings


def test_one_model_per_file():
    evidence = Evidence(source={"where": "Prometheus"}, window=Window(0, 60, "range"),
                        models={"a": model(model="a"), "b": model(model="b")})
    with pytest.raises(GrowPageError, match=r"distributions of 2 models \('a', 'b'\).*--model-name"):
        evidence.for_model(None)
    assert evidence.for_model("b").model == "b"
    with pytest.raises(GrowPageError, match=r"no GrowPage distributions for model_name='c' \(it has 'a', 'b'\)"):
        evidence.for_model("c")


def test_the_file_states_its_evidence_and_loads(tmp_path):
    calibration = calibrate(model(), Quantiles())
    evidence = Evidence(source={"kind": "prometheus", "target": "http://prom:9090", "selector": '{namespace="chat"}'},
                        window=Window(1_714_556_400.0 - 1800, 1_714_556_400.0, "range"), models={"m": model()})
    text = render_yaml(calibration, evidence, "gpctl calibrate --prometheus http://prom:9090 --since 1800s",
                       created=datetime.datetime(2024, 5, 1, 10, tzinfo=datetime.UTC))
    assert text.splitlines()[:6] == [
        "# GrowPage settings calibrated by gpctl calibrate (growpage " + text.split("(growpage ")[1].split(")")[0]
        + "), 2024-05-01T10:00:00Z",
        "# Command: gpctl calibrate --prometheus http://prom:9090 --since 1800s",
        '# Source: prometheus http://prom:9090 {namespace="chat"}',
        "# Window: 30m until 2024-05-01T09:40:00Z",
        "# Model: m; block_size 16 from growpage_build_info",
        "# Samples: growpage_lts_entropy 100, growpage_sts_density_ratio 100, growpage_request_tokens 100",
    ]
    assert ("#   base_pages: 20  <- ceil(q0.5 of growpage_request_tokens = 307.2 tokens / block_size 16), "
            "100 samples") in text
    assert yaml.safe_load(text) == {"growpage": {"block_size": 16, "lts_grow_threshold": 2.9167,
                                                 "rollout_entropy_threshold": 3.5, "density_threshold": 0.875,
                                                 "base_pages": 20}}
    path = tmp_path / "out.yaml"
    write_config(path, text)
    config = load_config(path, env={})
    assert (config.lts_grow_threshold, config.rollout_entropy_threshold, config.density_threshold,
            config.base_pages, config.block_size) == (2.9167, 3.5, 0.875, 20, 16)
    assert [p.name for p in tmp_path.iterdir()] == ["out.yaml"]  # no temporary file left behind


def test_sample_counts_read_as_counts():
    assert [count_text(c) for c in (1_234_567.0, 100.0, 1079.278, 0.0)] == ["1234567", "100", "1079.3", "0"]
