"""Fixtures for calibrate tests: the real core in monitor mode behind the real telemetry agent.

The core (``support.factories``: a tiny model geometry, random Q/K/V) and its workload are in
``calibrate_workload``; the telemetry agent exports them on its standalone ``/metrics/growpage``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pytest
import torch
from calibrate_workload import BLOCK_SIZE, MODEL, MonitoredCore, Recorded
from typer.testing import CliRunner

from growpage.telemetry import TelemetryAgent
from support.factories import Driver, make_manager


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "100", "NO_COLOR": "1"})


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny tensors: one intra-op thread is fastest on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def monitored() -> Iterator[MonitoredCore]:
    manager = make_manager(num_pages=256, mode="monitor", block_size=BLOCK_SIZE, base_pages=2, sink_tokens=4,
                           recent_window_tokens=12, clock=time.monotonic)
    recorded = Recorded()
    manager.stats.add_listener(recorded)
    agent = TelemetryAgent(manager, model=MODEL, engine="reference", engine_version="test", poll_interval_s=0.2)
    exporter = agent.serve(port=0, host="127.0.0.1")
    try:
        yield MonitoredCore(manager, agent, f"http://127.0.0.1:{exporter.port}", recorded, Driver(manager, seed=7),
                            random.Random(7))
    finally:
        agent.close()
