"""The engine core's exporter before the model loads: start-up series from vLLM's own ``Executor.__init__``,
the scheduler agent taking the same port over, one port per data-parallel rank, bind failures counted."""

from __future__ import annotations

import os
import socket

import httpx
import pytest
from test_vllm_scheduler_agent import _scheduler

from growpage import catalog
from growpage.vllm_plugin import startup
from growpage.vllm_plugin.scheduler_hooks import build_agent


def _scrape(port: int) -> str:
    response = httpx.get(f"http://127.0.0.1:{port}{catalog.METRICS_PATH}", timeout=10)
    assert response.status_code == 200
    return response.text


def _active(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(catalog.AGENT_ACTIVE.name + "{")}


@pytest.fixture
def no_early_exporter(monkeypatch):
    monkeypatch.setattr(startup, "_EARLY", {})


@pytest.mark.parametrize("mode, reasons", [
    ("enforce", {"enforcer": "starting", "observer": "starting", "scheduler": "starting"}),
    ("off", {"observer": "mode_off", "scheduler": "mode_off"})])
def test_start_up_series_are_served_before_the_scheduler_then_the_agent_serves_on_the_same_port(
        no_early_exporter, mode, reasons):
    pytest.importorskip("vllm")
    settings = {"mode": mode, "base_pages": 3, "recent_window_tokens": 2, "exporter_port": 0,
                "exporter_host": "127.0.0.1"}
    scheduler = _scheduler(settings)
    early = startup.start_early(scheduler.vllm_config)
    assert early is not None and startup.start_early(scheduler.vllm_config) is early  # once per process
    try:
        before = _scrape(early.exporter.port)
        build = next(line for line in before.splitlines() if line.startswith(catalog.BUILD_INFO.name + "{"))
        assert f'mode="{mode}"' in build and 'block_size="4"' in build and 'base_pages="3"' in build
        assert _active(before) == {f'{catalog.AGENT_ACTIVE.name}{{component="{c}",model_name="m",reason="{r}"}}': 0.0
                                   for c, r in reasons.items()}
        assert "growpage_pool_pages" not in before  # nothing is known of the pool before the KV cache is
        agent = build_agent(scheduler)
    except BaseException:
        early.exporter.close()
        raise
    try:
        assert agent.exporter is early.exporter  # taken over: the port never closed
        after = _scrape(early.exporter.port)
        assert 'reason="starting"' not in after and f'{catalog.POOL_PAGES.name}{{model_name="m",state="free"}}' in after
        assert after.count(catalog.BUILD_INFO.name + "{") == 1
    finally:
        agent.close()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{early.exporter.port}{catalog.METRICS_PATH}", timeout=2)


def test_vllms_executor_starts_the_exporter_before_it_loads_the_model(no_early_exporter):
    pytest.importorskip("vllm")
    from vllm.v1.executor.abstract import Executor

    from growpage.vllm_plugin.scheduler_hooks import install_scheduler_hooks

    install_scheduler_hooks()
    seen: dict[str, str] = {}

    class _LoadsNothing(Executor):
        """vLLM's executor base class, whose ``_init_executor`` is where a real one loads the model."""

        def _init_executor(self) -> None:
            early = startup._EARLY.get(os.getpid())
            seen["during_load"] = _scrape(early.exporter.port) if early is not None else ""

        def collective_rpc(self, *args, **kwargs):
            raise NotImplementedError

        def check_health(self) -> None:
            pass

    vllm_config = _scheduler({"mode": "monitor", "exporter_port": 0, "exporter_host": "127.0.0.1"}).vllm_config
    for name in ("lora_config", "load_config", "scheduler_config", "speculative_config", "observability_config"):
        setattr(vllm_config, name, None)  # what Executor.__init__ reads before _init_executor
    try:
        _LoadsNothing(vllm_config)
    finally:
        early = startup._EARLY.get(os.getpid())
        if early is not None:
            early.exporter.close()
    assert 'component="scheduler",model_name="m",reason="starting"} 0.0' in seen["during_load"]


def test_each_data_parallel_rank_gets_its_own_port():
    class Parallel:
        def __init__(self, size: int, local_rank: int | None):
            self.data_parallel_size, self.data_parallel_rank_local = size, local_rank

    assert [startup.rank_exporter_port(9464, Parallel(4, rank)) for rank in range(4)] == [9464, 9465, 9466, 9467]
    # vLLM runs a dense model's ranks as independent engines, each engine core told size 1 but its own rank
    assert startup.rank_exporter_port(9464, Parallel(1, 1)) == 9465
    assert startup.rank_exporter_port(9464, Parallel(1, None)) == 9464
    assert startup.rank_exporter_port(9464, None) == 9464
    assert startup.rank_exporter_port(0, Parallel(2, 1)) == 0 and startup.rank_exporter_port(-1, Parallel(2, 1)) == -1


def test_a_port_already_bound_is_counted_and_vllm_carries_on(no_early_exporter):
    pytest.importorskip("vllm")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        scheduler = _scheduler({"mode": "monitor", "exporter_port": port, "exporter_host": "127.0.0.1"})
        assert startup.start_early(scheduler.vllm_config) is None  # not bound now: the agent tries again
        agent = build_agent(scheduler)
        try:
            assert agent.exporter is None
            assert agent.stats.agent_errors_total["plugin"] == 1
        finally:
            agent.close()


def test_an_agent_that_cannot_start_closes_the_start_up_exporter_instead_of_saying_starting_for_ever(
        no_early_exporter):
    pytest.importorskip("vllm")
    from growpage.vllm_plugin.scheduler_hooks import agent_of

    scheduler = _scheduler({"mode": "monitor", "exporter_port": 0, "exporter_host": "127.0.0.1"})
    early = startup.start_early(scheduler.vllm_config)
    assert early is not None and 'reason="starting"' in _scrape(early.exporter.port)
    del scheduler.kv_cache_config  # the agent cannot read the KV cache spec: it fails to start
    assert agent_of(scheduler) is None
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{early.exporter.port}{catalog.METRICS_PATH}", timeout=2)
