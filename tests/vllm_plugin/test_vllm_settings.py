"""The plugin's settings at every block size vLLM uses, and settings GrowPage cannot honour resolved
without an exception (vLLM must keep serving)."""

from __future__ import annotations

import pytest

from growpage.config import Mode
from growpage.vllm_plugin.resolve import resolve_settings
from growpage.vllm_plugin.settings import (
    DEFAULT_EXPORTER_PORT,
    DEFAULT_FLOOR_TOKENS,
    default_base_pages,
    split_settings,
)

# vLLM's block sizes: 16 on most GPU backends, 32 and 64 chosen by users and some kernels, 128 the
# CPU build's default (platforms/cpu.py when --block-size is not given), 256 DeepSeek-V4's kernels.
VLLM_BLOCK_SIZES = (16, 32, 64, 128, 256)
# sinks + recent window, one impossible to keep in a 2-block floor of 128 tokens
IMPOSSIBLE = {"base_pages": 2, "recent_window_tokens": 4096}


@pytest.mark.parametrize("block_size", VLLM_BLOCK_SIZES)
@pytest.mark.parametrize("growpage", [{}, {"mode": "off"}, {"mode": "monitor"}, {"mode": "enforce"}])
def test_the_plugins_defaults_validate_at_every_block_size_vllm_uses(block_size, growpage):
    config, _ = split_settings(growpage, env={}, block_size=block_size)
    kept_pages = config.base_pages - config.evict_min_pages
    assert kept_pages >= 1 and kept_pages * block_size >= config.sink_tokens + config.recent_window_tokens
    assert config.base_pages * block_size >= DEFAULT_FLOOR_TOKENS and config.block_size == block_size
    resolved = resolve_settings(growpage, env={}, block_size=block_size)
    assert resolved.problem is None and resolved.config == config


def test_the_default_floor_is_the_token_floor_in_blocks_raised_to_what_an_eviction_keeps():
    assert {size: default_base_pages(size) for size in VLLM_BLOCK_SIZES} == {16: 8, 32: 4, 64: 3, 128: 2, 256: 2}
    for block_size in range(1, 1025):  # hybrid models align blocks to odd sizes: every size holds
        split_settings({"mode": "enforce"}, env={}, block_size=block_size)


def test_the_default_floor_follows_the_users_protected_tokens():
    config, _ = split_settings({"mode": "enforce", "recent_window_tokens": 200}, env={}, block_size=128)
    assert config.base_pages == 1 + 2  # an evicted page, then 204 protected tokens in 2 blocks
    config, _ = split_settings({}, env={"GROWPAGE_EVICT_MIN_PAGES": "3"}, block_size=64)
    assert config.base_pages == 3 + 2
    assert split_settings({"base_pages": 9}, env={}, block_size=128)[0].base_pages == 9  # the user's wins


def test_settings_enforce_cannot_honour_resolve_to_off_with_the_fix_instead_of_raising():
    resolved = resolve_settings({"mode": "enforce", "exporter_port": 9999, **IMPOSSIBLE}, env={}, block_size=128)
    assert resolved.config.mode is Mode.OFF and resolved.requested_mode == "enforce"
    assert resolved.problem is not None and "raise base_pages to at least 34 at block_size 128" in resolved.problem
    assert resolved.settings.exporter_port == 9999  # the pod still says why, where it is scraped
    assert resolved.config.block_size == 128


@pytest.mark.parametrize("growpage, env, fragment", [
    ({"mode": "monitor", "mood": "x"}, {}, "did you mean 'mode'"),
    ("monitor", {}, "must be a JSON object"),
    ({"observed_heads": 0}, {"GROWPAGE_MODE": "enforce"}, "observed_heads"),
    ({}, {"GROWPAGE_BASE_PAGES": "many"}, "base_pages='many'"),
    ({"mode": "enforce", "compression_gate": "sometimes"}, {}, "compression_gate must be true or false"),
])
def test_every_kind_of_bad_setting_is_reported_not_raised(growpage, env, fragment):
    resolved = resolve_settings(growpage, env=env, block_size=32)
    assert resolved.problem is not None and fragment in resolved.problem
    assert resolved.config.mode is Mode.OFF and resolved.settings.exporter_port == DEFAULT_EXPORTER_PORT


@pytest.mark.parametrize("growpage, env", [
    ({"mode": "off", **IMPOSSIBLE}, {}),
    ({**IMPOSSIBLE, "observed_heads": 0, "method": "nope"}, {"GROWPAGE_MODE": "off"}),
    ({"mode": "off", "no_such_setting": 1, "exporter_port": 0}, {}),
])
def test_mode_off_checks_only_the_exporter_settings_it_uses(growpage, env):
    resolved = resolve_settings(growpage, env=env, block_size=128)
    assert resolved.problem is None and resolved.config.mode is Mode.OFF
    assert resolved.settings.exporter_port == growpage.get("exporter_port", DEFAULT_EXPORTER_PORT)
    bad_port = resolve_settings({**growpage, "exporter_port": 70000}, env=env, block_size=128)
    assert bad_port.problem is not None and "exporter_port" in bad_port.problem  # off serves the exporter
