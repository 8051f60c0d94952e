"""``growpage.bench.vllm`` without running engines (a real run takes minutes: ``gpctl bench vllm``)."""

from __future__ import annotations

import dataclasses
import json

from growpage.bench.vllm import VARIANTS, VllmBenchSettings, _growpage_config


def test_variants_are_vllm_alone_monitor_and_enforce_with_the_same_workload():
    settings = dataclasses.asdict(VllmBenchSettings(base_pages=3, growpage={"observed_heads": 2}))
    assert VARIANTS == ("vllm", "monitor", "enforce")
    assert _growpage_config("vllm", settings)["mode"] == "off"
    for variant in ("monitor", "enforce"):
        config = _growpage_config(variant, settings)
        assert config["mode"] == variant and config["base_pages"] == 3 and config["observed_heads"] == 2
    json.dumps(settings)  # the child receives it as JSON


def test_quick_settings_put_the_kv_space_under_pressure():
    quick = VllmBenchSettings.quick()
    full_blocks = -(-(16 + quick.pressure_tokens) // quick.block_size)
    assert quick.pressure_requests * full_blocks > quick.kv_blocks  # vLLM alone must queue or preempt
