"""Config: the published defaults, every source, and errors that name the field and the fix."""

import json

import pytest

from growpage.config import GrowPageConfig, Mode, load_config, min_base_pages
from growpage.errors import ConfigError


def test_defaults_are_the_seeds_numbers():
    config = GrowPageConfig()
    assert (config.block_size, config.base_pages) == (16, 128)
    assert (config.sts_window_steps, config.sts_num_bins) == (32, 8)
    assert (config.lts_window_steps, config.lts_update_interval_steps) == (512, 64)
    assert (config.growth_coefficient, config.density_threshold) == (0.2, 0.7)
    assert (config.lts_grow_threshold, config.rollout_entropy_threshold) == (2.1, 2.5)
    assert config.max_growth_rate == 0.3
    assert config.mode is Mode.MONITOR  # rollout phase 1 is the safe default
    assert config.summary_bytes_per_request < 2048


def test_sources_layer_file_then_env_then_overrides(tmp_path):
    path = tmp_path / "growpage.yaml"
    path.write_text("growpage:\n  base_pages: 64\n  mode: enforce\n  block_size: 32\n")
    config = load_config(path, env={"GROWPAGE_BASE_PAGES": "48", "GROWPAGE_ENFORCE_NAMESPACES": "math, proofs"},
                         overrides={"block_size": 8})
    assert config.base_pages == 48
    assert config.mode is Mode.ENFORCE
    assert config.block_size == 8
    assert config.enforce_namespaces == ("math", "proofs")


@pytest.mark.parametrize("suffix, text", [
    (".json", json.dumps({"base_pages": 32})),
    (".toml", "base_pages = 32\n"),
    (".yml", "base_pages: 32\n"),
])
def test_file_formats(tmp_path, suffix, text):
    path = tmp_path / f"config{suffix}"
    path.write_text(text)
    assert load_config(path, env={}).base_pages == 32


def test_config_file_from_environment(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("quantization_bits: 4\n")
    assert load_config(env={"GROWPAGE_CONFIG": str(path)}).quantization_bits == 4


@pytest.mark.parametrize("env, fragment", [
    ({"GROWPAGE_BASE_PAGE": "64"}, "did you mean 'base_pages'"),
    ({"GROWPAGE_BASE_PAGES": "many"}, "base_pages='many'"),
    ({"GROWPAGE_MODE": "turbo"}, "mode must be one of off | monitor | enforce"),
    ({"GROWPAGE_QUANTIZATION_BITS": "6"}, "quantization_bits must be one of 8 | 4"),
    ({"GROWPAGE_DENSITY_THRESHOLD": "1.5"}, "density_threshold must be in [0.0, 1.0]"),
    ({"GROWPAGE_ATTENTION_COVERAGE": "1.2"}, "attention_coverage must be in [0.0, 1.0]"),
    ({"GROWPAGE_MAX_GROWTH_RATE": "0"}, "max_growth_rate must be > 0"),
    ({"GROWPAGE_BLOCK_SIZE": "0"}, "block_size must be >= 1"),
    ({"GROWPAGE_KV_DTYPE": "fp8"}, "kv_dtype must be one of"),
])
def test_bad_values_name_the_field(env, fragment):
    with pytest.raises(ConfigError) as caught:
        load_config(env=env)
    assert fragment in str(caught.value)
    assert "\n" not in str(caught.value)


def test_protected_tokens_must_leave_room_to_evict():
    with pytest.raises(ConfigError, match="raise base_pages to at least 6 at block_size 16, or lower recent_window"):
        GrowPageConfig(base_pages=2, block_size=16, recent_window_tokens=64)


@pytest.mark.parametrize("block_size", [1, 16, 32, 64, 128, 256])
@pytest.mark.parametrize("sink_tokens, recent_window_tokens, evict_min_pages", [(4, 64, 1), (0, 0, 2), (4, 300, 2)])
def test_min_base_pages_is_the_fewest_pages_the_config_accepts(block_size, sink_tokens, recent_window_tokens,
                                                               evict_min_pages):
    fewest = min_base_pages(block_size, sink_tokens, recent_window_tokens, evict_min_pages)
    settings = {"block_size": block_size, "sink_tokens": sink_tokens, "recent_window_tokens": recent_window_tokens,
                "evict_min_pages": evict_min_pages}
    GrowPageConfig(base_pages=fewest, **settings)
    with pytest.raises(ConfigError, match=f"raise base_pages to at least {fewest} "):
        GrowPageConfig(base_pages=fewest - 1, **settings)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml", env={})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="is not valid json"):
        load_config(bad, env={})
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(listy, env={})


def test_lts_decay_matches_its_window():
    # 64-step updates with a 512-step time constant: decay 1 - 64/512.
    assert GrowPageConfig().lts_ema_decay == pytest.approx(0.875)


@pytest.mark.parametrize("deployment, namespaces, namespace, requested, expected", [
    ("enforce", (), "any", None, Mode.ENFORCE),
    ("enforce", ("math",), "math", None, Mode.ENFORCE),
    ("enforce", ("math",), "chat", None, Mode.MONITOR),  # phase 2: others are monitored
    ("enforce", (), None, "monitor", Mode.MONITOR),  # a request may ask for less
    ("monitor", (), None, "enforce", Mode.MONITOR),  # never more than the deployment runs
    ("off", (), None, "enforce", Mode.OFF),
])
def test_rollout_mode_per_request(deployment, namespaces, namespace, requested, expected):
    config = GrowPageConfig(mode=deployment, enforce_namespaces=namespaces)
    assert config.mode_for(namespace, requested) is expected


@pytest.mark.parametrize("name, value", [
    ("GROWPAGE_GROWTH_COEFFICIENT", "inf"),
    ("GROWPAGE_MAX_GROWTH_RATE", "Infinity"),
    ("GROWPAGE_LTS_GROW_THRESHOLD", "nan"),
])
def test_non_finite_numbers_are_refused(name, value):
    with pytest.raises(ConfigError, match="must be a finite number") as caught:
        load_config(env={name: value})
    assert "\n" not in str(caught.value)


def test_documented_variables_that_are_not_config_fields_leave_config_alone():
    env = {"GROWPAGE_TRACING": "1", "GROWPAGE_CACHE_DIR": "/tmp/models", "GROWPAGE_API_KEY": "k" * 16,
           "GROWPAGE_VLLM_PYTHON": "/usr/bin/python3", "GROWPAGE_VLLM_EXPORTER_PORT": "9464",
           "GROWPAGE_CONFIG": "", "GROWPAGE_BASE_PAGES": "64"}
    assert load_config(env=env).base_pages == 64


def test_undecodable_and_directory_config_paths_say_what_is_wrong(tmp_path):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("mode: monitor  # café\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="is not UTF-8.*save it as UTF-8"):
        load_config(latin, env={})
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path, env={})
