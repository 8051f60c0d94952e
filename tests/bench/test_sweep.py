"""``growpage.bench.sweep`` without engines: the variants it runs, the verdict it reads, what it prints
and plots (a real sweep takes an hour: ``gpctl bench vllm --part sweep``)."""

from __future__ import annotations

import dataclasses

import pytest

from growpage.bench.sweep import FIXED_CAPS, sweep_configs, sweep_rows, verdict
from growpage.bench.vllm_settings import PARTS, SweepVariant, VllmBenchSettings
from growpage.vllm_plugin.settings import VLLM_METHODS


def point(method: str, pages: int | None, speed: float, nll: float, spread: float = 0.0) -> dict:
    return {"method": method, "base_pages": pages, "nll_increase": nll, "preemptions": [1, 2],
            "tokens_per_s": {"median": speed, "range": [speed - spread, speed + spread], "values": [speed]}}


def sweep_points(growpage: dict[int, tuple[float, float]], caps: dict[str, dict[int, tuple[float, float]]],
                 vllm_speed: float = 100.0) -> dict[str, dict]:
    points = {"vllm": point("vllm", None, vllm_speed, 0.0)}
    points |= {f"growpage@{pages}": point("growpage", pages, *at) for pages, at in growpage.items()}
    for method, budgets in caps.items():
        points |= {f"{method}@{pages}": point(method, pages, *at) for pages, at in budgets.items()}
    return points | {"limit": point("limit", None, 200.0, 0.0)}


def test_every_fixed_cap_is_swept_at_every_floor_between_vllm_alone_and_the_limit():
    settings = dataclasses.replace(VllmBenchSettings(), sweep_pages=(2, 5))
    configs = sweep_configs(settings)
    assert list(configs)[0] == "vllm" and list(configs)[-1] == "limit"
    assert configs["vllm"] is None and configs["limit"] is None
    assert set(FIXED_CAPS) | {"growpage"} <= set(VLLM_METHODS)  # the plugin can run each of them
    for method in ("growpage", *FIXED_CAPS):
        for pages in (2, 5):
            config = configs[f"{method}@{pages}"]
            assert config["method"] == method and config["base_pages"] == pages and config["mode"] == "enforce"
    assert "sweep" in PARTS and VllmBenchSettings.quick().sweep_pages == (2,)
    assert not any("+cov" in name for name in configs)  # no coverage points unless asked


def test_coverage_points_run_growpage_at_the_lowest_floor_with_each_attention_coverage():
    settings = dataclasses.replace(VllmBenchSettings(), sweep_pages=(4, 2), sweep_coverage=(0.9, 0.95))
    configs = sweep_configs(settings)
    assert list(configs)[-1] == "limit"
    for coverage in (0.9, 0.95):
        config = configs[f"growpage@2+cov{coverage:g}"]
        assert config["method"] == "growpage" and config["base_pages"] == 2
        assert config["attention_coverage"] == coverage
    assert configs["growpage@2"]["attention_coverage"] == 0.0  # the floor alone, whatever the default
    assert "attention_coverage" not in configs["h2o@2"]


def test_a_settings_variant_follows_its_methods_points_at_every_floor_and_coverage():
    settings = dataclasses.replace(VllmBenchSettings(), sweep_pages=(2, 4), sweep_coverage=(0.95,),
                                   sweep_methods=("growpage", "h2o", "streaming_llm"),
                                   sweep_variants=(SweepVariant.parse("heads@growpage,h2o:keep_sets=kv_head"),
                                                   SweepVariant.parse("rkv@growpage:redundancy_weight=0.9")))
    configs = sweep_configs(settings)
    assert [name for name in configs if name.startswith("growpage@2")] == [
        "growpage@2", "growpage@2/heads", "growpage@2/rkv", "growpage@2+cov0.95", "growpage@2+cov0.95/heads",
        "growpage@2+cov0.95/rkv"]
    assert configs["h2o@4/heads"] == {**configs["h2o@4"], "keep_sets": "kv_head"}
    assert configs["growpage@2+cov0.95/rkv"]["attention_coverage"] == 0.95
    assert configs["growpage@2+cov0.95/rkv"]["redundancy_weight"] == 0.9
    assert not any(name.startswith(("snapkv", "streaming_llm@2/", "h2o@2/rkv")) for name in configs)


def test_a_coverage_point_counts_on_growpages_curve():
    points = sweep_points({2: (160.0, 0.35)}, {"h2o": {4: (120.0, 0.09)}})
    assert verdict(points)["caps_not_covered"] == ["h2o@4"]
    points["growpage@2+cov0.95"] = point("growpage", 2, 125.0, 0.08) | {"attention_coverage": 0.95,
                                                                         "axis": "coverage"}
    result = verdict(points)
    assert result["curve_on_or_above_every_cap"]
    assert result["speed_target_point"]["attention_coverage"] == 0.0  # 1.6x: the floor point, not the coverage one


def test_growpage_covers_a_cap_only_when_as_fast_at_no_more_nll():
    covered = sweep_points({2: (160.0, 0.20), 4: (150.0, 0.08)}, {"h2o": {2: (155.0, 0.21), 4: (150.0, 0.09)}})
    result = verdict(covered)
    assert result["curve_on_or_above_every_cap"] and result["caps_not_covered"] == []
    # The same speeds, but the cap keeps more fidelity at 4 blocks: that point is not covered.
    better_cap = sweep_points({2: (160.0, 0.20), 4: (150.0, 0.08)}, {"h2o": {4: (150.0, 0.07)}})
    assert verdict(better_cap)["caps_not_covered"] == ["h2o@4"]


def test_the_speed_target_needs_one_and_a_half_times_vllm_alone_at_the_best_caps_fidelity():
    met = sweep_points({2: (160.0, 0.10), 4: (120.0, 0.05)}, {"snapkv": {2: (165.0, 0.12)}})
    result = verdict(met)
    assert result["speed_target_met"] and result["fastest_growpage_vs_vllm"] == 1.6
    assert result["speed_target_point"] == {"base_pages": 2, "attention_coverage": 0.0, "tokens_per_s": 160.0,
                                            "nll_increase": 0.10}
    assert result["best_cap_nll_at_that_speed"] == 0.12
    cap_more_faithful = sweep_points({2: (160.0, 0.10)}, {"snapkv": {2: (165.0, 0.09)}})
    assert not verdict(cap_more_faithful)["speed_target_met"]
    too_slow = sweep_points({2: (140.0, 0.10)}, {})
    assert not verdict(too_slow)["speed_target_met"] and verdict(too_slow)["speed_target_point"] is None


def test_rows_give_speed_against_vllm_alone_and_fidelity_per_variant():
    rows = sweep_rows([{"seed": 1, "points": sweep_points({2: (150.0, 0.1234)}, {"h2o": {2: (120.0, 0.2)}})}])
    by_variant = {row[1]: row for row in rows}
    assert by_variant["growpage@2"] == ("1", "growpage@2", "150.0 [150.0-150.0]", "1.50x", "+0.1234", "1/2")
    assert by_variant["limit"][4] == "0 (ref)" and by_variant["vllm"][3] == "1.00x"


def test_the_plot_draws_one_panel_per_seed(tmp_path):
    pytest.importorskip("matplotlib")
    from growpage.bench.plots import sweep_tradeoff

    points = sweep_points({2: (150.0, 0.1, 5.0), 4: (130.0, 0.05, 5.0)}, {cap: {2: (120.0, 0.2)} for cap in FIXED_CAPS})
    points["growpage@2+cov0.9"] = point("growpage", 2, 120.0, 0.04) | {"attention_coverage": 0.9, "axis": "coverage"}
    path = sweep_tradeoff({"sweeps": [{"seed": 0, "points": points}, {"seed": 1, "points": points}]},
                          tmp_path / "sweep.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
