"""Start-up checks: a serving configuration that could only fail later stops the server with one line."""

from __future__ import annotations

import pytest

from growpage.config import GrowPageConfig
from growpage.engine.startup import check_serving
from growpage.errors import ConfigError

SMOLLM2 = dict(num_layers=30, num_kv_heads=3, head_dim=64, model_context=8192)


def check(growpage=None, **kwargs):
    return check_serving(growpage or GrowPageConfig(), **{**SMOLLM2, "kv_cache_mib": 256, **kwargs})


def test_the_default_server_fits():
    plan = check()
    assert plan.num_pages >= 8192 // 16 and plan.max_model_len == 8192


@pytest.mark.parametrize("growpage, kwargs, fragment", [
    (GrowPageConfig(base_pages=100000, recent_window_tokens=16), {}, "lower --base-pages"),
    (GrowPageConfig(mode="off"), {"kv_cache_mib": 2}, "cannot hold one request of the full context"),
    (GrowPageConfig(block_size=100_000_000), {}, "longer than the context"),
    (GrowPageConfig(), {"kv_cache_mib": 100_000_000, "available_mib": 64_000}, "only 64000 MiB are available"),
    (GrowPageConfig(), {"max_model_len": 100_000}, "max_model_len=100000 must be in [1, 8192]"),
])
def test_configurations_that_cannot_serve_fail_with_one_line(growpage, kwargs, fragment):
    with pytest.raises(ConfigError) as caught:
        check(growpage, **kwargs)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_a_shorter_context_lets_a_small_pool_serve():
    plan = check(GrowPageConfig(mode="off", base_pages=4, recent_window_tokens=16), kv_cache_mib=2, max_model_len=64)
    assert plan.num_pages * 16 >= 64
