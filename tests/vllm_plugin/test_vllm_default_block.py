"""vLLM at its own block size (128 on CPU: no ``block_size`` passed) with the plugin's default settings:
it starts and serves in ``off`` and in ``monitor``, identically, and the floor GrowPage reports is
valid there. Every other engine test runs at 32; the default floor once stopped vLLM at 128."""

from __future__ import annotations

import pytest

from support.vllm_guard import require_vllm_plugin

require_vllm_plugin()

import torch  # noqa: E402
from engine_cases import DEFAULT_BLOCK_TOKENS, PROMPTS, samples  # noqa: E402

from growpage import catalog  # noqa: E402
from growpage.vllm_plugin.settings import default_base_pages  # noqa: E402

pytestmark = pytest.mark.slow

CPU_DEFAULT_BLOCK_SIZE = 128  # vllm/platforms/cpu.py when --block-size is not given


def _build_info(metrics: str) -> str:
    return next(line for line in metrics.splitlines() if line.startswith(catalog.BUILD_INFO.name + "{"))


def test_vllm_serves_at_its_own_block_size_in_off_and_monitor_with_the_same_tokens(vllm_default_block_runs):
    off, monitor = vllm_default_block_runs["default_block_off"], vllm_default_block_runs["default_block_monitor"]
    if not torch.cuda.is_available():
        assert off["block_size"] == monitor["block_size"] == CPU_DEFAULT_BLOCK_SIZE
    off_ids, monitor_ids = off["batches"]["main"]["token_ids"], monitor["batches"]["main"]["token_ids"]
    assert [len(ids) for ids in off_ids] == [DEFAULT_BLOCK_TOKENS] * len(PROMPTS[:2])
    assert monitor_ids == off_ids  # monitor never changes what vLLM computes


@pytest.mark.parametrize("name, reason", [("default_block_off", "mode_off"), ("default_block_monitor", "active")])
def test_the_default_floor_is_reported_at_vllms_block_size_and_the_agent_says_what_runs(vllm_default_block_runs,
                                                                                       name, reason):
    run = vllm_default_block_runs[name]
    block_size = run["block_size"]
    for metrics in (run["metrics_before"], run["metrics"]):  # from start-up, and after serving
        build = _build_info(metrics)
        assert f'block_size="{block_size}"' in build and f'base_pages="{default_base_pages(block_size)}"' in build
        scheduler = {k: v for k, v in samples(metrics, catalog.AGENT_ACTIVE.name).items()
                     if 'component="scheduler"' in k}
        assert len(scheduler) == 1 and f'reason="{reason}"' in next(iter(scheduler)), scheduler
    errors = samples(run["metrics"], "growpage_agent_errors_total")
    assert sum(errors.values()) == 0, errors
    assert 'reason="invalid_config"' not in run["metrics"]


def test_the_engine_core_says_it_is_starting_while_vllm_loads_the_model(vllm_default_block_runs):
    """Scraped while ``LLM(...)`` was still loading the model: build info and every component
    ``starting``, then (after start-up) the agent's own series."""
    run = vllm_default_block_runs["default_block_monitor"]
    starting = run["metrics_starting"]
    assert f'block_size="{run["block_size"]}"' in _build_info(starting)
    reasons = {key: value for key, value in samples(starting, catalog.AGENT_ACTIVE.name).items()}
    assert reasons and all('reason="starting"' in key and value == 0.0 for key, value in reasons.items()), reasons
    assert catalog.POOL_PAGES.name not in starting
    assert 'reason="starting"' not in run["metrics_before"] and catalog.POOL_PAGES.name in run["metrics_before"]
