"""``gpctl bench vllm --part headline`` without engines: its variants, equal memory and verdict."""

from __future__ import annotations

import dataclasses

import pytest

from growpage.bench.headline import CAPS, headline_rows, matched_budget, variant_configs, verdict
from growpage.bench.vllm_settings import PARTS, VllmBenchSettings
from growpage.config import GrowPageConfig
from growpage.errors import ConfigError
from growpage.vllm_plugin.settings import DEFAULT_FLOOR_TOKENS, resolved_settings


def test_growpage_runs_the_shipped_defaults_unless_a_setting_says_otherwise():
    settings = VllmBenchSettings()
    assert settings.growpage_config() == {"mode": "enforce"}  # nothing hard-coded over the defaults
    resolved = resolved_settings(settings.growpage_config(), settings.block_size)["growpage"]
    assert resolved["recent_window_tokens"] == GrowPageConfig().recent_window_tokens  # 64, as gpctl serve runs
    assert resolved["base_pages"] * settings.block_size == DEFAULT_FLOOR_TOKENS == settings.floor_pages * 32
    assert resolved["attention_coverage"] > 0  # the plugin's default inside vLLM
    assert VllmBenchSettings(base_pages=6).floor_pages == 6


def test_the_caps_budget_at_equal_memory_is_growpages_mean_rounded_up_never_below_its_floor():
    assert matched_budget(5.2, 4) == 6
    assert matched_budget(6.0, 4) == 6
    assert matched_budget(2.5, 4) == 4  # protected tokens must fit in a cap as in GrowPage


def test_variants_are_vllm_alone_untuned_and_tuned_growpage_each_cap_at_equal_memory_and_the_limit():
    settings = VllmBenchSettings()
    configs = variant_configs(settings, budget=6)
    assert list(configs)[:5] == ["vllm", "vllm@seqs4", "vllm@seqs6", "monitor", "growpage"]
    assert configs["monitor"]["growpage"] == {"mode": "monitor"}  # its cost and its forecast of growpage
    assert configs["vllm@seqs4"] == {"growpage": None, "max_num_seqs": 4}
    # every admission beside the shipped default (auto)
    assert configs["growpage@vllm"]["growpage"] == {"mode": "enforce", "admission": "vllm"}
    assert configs["growpage@projected"]["growpage"] == {"mode": "enforce", "admission": "projected"}
    assert configs["growpage@after_preemption"]["growpage"] == {"mode": "enforce", "admission": "after_preemption"}
    for cap in CAPS:
        assert configs[f"{cap}@eq"]["growpage"] == {"mode": "enforce", "method": cap, "base_pages": 6}
    assert configs["limit"] == {"growpage": None, "limit": True}
    assert configs["growpage@room"] == {"growpage": {"mode": "enforce"}, "limit": True}  # nothing to win there
    assert not any(name.endswith("@floor") for name in configs)  # earlier sweeps ran the caps at the floor
    with_floor = variant_configs(dataclasses.replace(settings, headline_caps_at_floor=True), budget=6)
    assert with_floor["h2o@floor"]["growpage"]["base_pages"] == settings.floor_pages
    # a matched budget equal to the floor runs each cap once
    assert not any(name.endswith("@floor") for name in variant_configs(
        dataclasses.replace(settings, headline_caps_at_floor=True), settings.floor_pages))
    assert "headline" in PARTS
    covered = variant_configs(dataclasses.replace(settings, headline_coverage=(0.8, 0.5)), budget=6)
    assert covered["growpage@coverage0.8"]["growpage"] == {"mode": "enforce", "attention_coverage": 0.8}
    assert "growpage@coverage0.5" in covered and not any("coverage" in name for name in configs)
    shorter = variant_configs(dataclasses.replace(settings, headline_skip=("monitor", "growpage@room")), budget=6)
    assert "monitor" not in shorter and "growpage@room" not in shorter and "growpage" in shorter
    with pytest.raises(ConfigError, match="headline_skip names no variant: montor; choose among vllm,"):
        variant_configs(dataclasses.replace(settings, headline_skip=("montor",)), budget=6)
    with pytest.raises(ConfigError, match="cannot leave out limit: the verdict reads vllm, growpage, limit"):
        variant_configs(dataclasses.replace(settings, headline_skip=("limit",)), budget=6)


def _point(speed: float, nll: float = 0.0) -> dict:
    return {"tokens_per_s": {"median": speed, "range": [speed - 1, speed + 1], "values": [speed]},
            "nll_increase": nll, "preemptions": [0], "mean_blocks_per_running": {"median": 5.0},
            "goodput": {"answerable": 0}}


def test_the_verdict_measures_against_the_fastest_vllm_alone_not_the_untuned_one():
    variants = {"vllm": _point(100.0), "vllm@seqs4": _point(120.0), "vllm@seqs6": _point(110.0),
                "growpage": _point(140.0, nll=0.05), "h2o@eq": _point(150.0, nll=0.10),
                "streaming_llm@eq": _point(150.0, nll=0.06), "limit": _point(160.0),
                "growpage@room": _point(152.0, nll=0.01)}
    result = verdict(variants)
    assert result["tuned_vllm"] == "vllm@seqs4" and result["growpage_vs_tuned_vllm"] == pytest.approx(140 / 120, 1e-3)
    assert result["captured_gain_share"] == 0.5 and result["gain_target_met"]
    assert result["never_worse_met"]
    assert result["best_cap_at_equal_memory"] == "streaming_llm@eq"
    assert result["equal_memory_nll_met"] is False  # 0.05 is not 20 % below 0.06 (0.048)
    assert result["room_vs_limit"] == 0.95 and result["room_nll_increase"] == 0.01
    assert result["admission_vs_tuned_vllm"] == {}  # not run: nothing to say
    admitting = verdict({**variants, "growpage@projected": _point(126.0)})
    assert admitting["admission_vs_tuned_vllm"] == {"growpage@projected": 1.05}
    covered = verdict({**variants, "growpage": _point(124.0, nll=0.01), "growpage@coverage0.8": _point(142.0, 0.04),
                       "growpage@coverage0.5": _point(150.0, 0.09)})
    assert not covered["gain_target_met"]  # the shipped default captures 10 % of the gain
    assert covered["coverage_points"] == {  # a lower coverage buys half at +0.04; lower still costs too much NLL
        "0.8": {"vs_tuned_vllm": pytest.approx(142 / 120, 1e-3), "captured_gain_share": 0.55,
                "nll_increase": 0.04, "gain_target_met": True},
        "0.5": {"vs_tuned_vllm": 1.25, "captured_gain_share": 0.75, "nll_increase": 0.09, "gain_target_met": False}}
    slower = verdict({**variants, "growpage": _point(117.0, nll=0.01)})
    assert not slower["never_worse_met"] and not slower["gain_target_met"]  # 117 < 0.98 x 120
    assert slower["equal_memory_nll_met"]


def test_rows_name_every_variant_of_every_seed():
    variants = {"vllm": _point(100.0), "growpage": _point(110.0, 0.02), "limit": _point(150.0)}
    result = {"headlines": [{"seed": 2, "variants": variants, "verdict": verdict(variants)}]}
    rows = headline_rows(result)
    assert [row[1] for row in rows] == ["vllm", "growpage", "limit"]
    assert rows[1][3] == "1.10x" and rows[1][4] == "+0.020"


def test_the_quick_settings_still_resolve_and_tune_vllm_below_their_batch():
    quick = VllmBenchSettings.quick()
    assert all(seqs < quick.requests for seqs in quick.tuned_max_num_seqs)
    resolved_settings(quick.growpage_config(), quick.block_size)
    assert dataclasses.asdict(quick)["tuned_max_num_seqs"] == (2,)


def test_the_recorded_settings_are_what_the_engines_read_environment_included(monkeypatch):
    """A run with ``GROWPAGE_VLLM_*`` overrides records them: the engines a benchmark starts inherit
    its environment, so a JSON that left them out would say the defaults ran."""
    settings = VllmBenchSettings.quick()
    monkeypatch.setenv("GROWPAGE_VLLM_READINGS_EVERY_STEPS", "32")
    assert resolved_settings(settings.growpage_config(), settings.block_size)["plugin"]["readings_every_steps"] == 32
    assert resolved_settings(settings.growpage_config(), settings.block_size,
                             env={})["plugin"]["readings_every_steps"] == 8
