"""Fixtures for telemetry tests: a real core, an agent on a fresh registry, in-memory tracing."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import CollectorRegistry
from telemetry_workload import MODEL, in_memory_tracing

from growpage.engine.kv.manager import GrowPageManager
from growpage.telemetry import TelemetryAgent
from support.factories import make_manager


@pytest.fixture
def manager() -> GrowPageManager:
    # float16 pages so INT8 quantization frees pages; a 32-page pool so denials happen too.
    return make_manager(num_pages=32, kv_dtype="float16")


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def agent(manager, registry):
    agent = TelemetryAgent(manager, model=MODEL, engine="reference", engine_version="test",
                           registry=registry)
    yield agent
    agent.close()


@pytest.fixture
def traced(manager, registry):
    """An agent tracing every request into memory: ``(agent, span_exporter)``."""
    provider, exporter = in_memory_tracing()
    agent = TelemetryAgent(manager, model=MODEL, engine="reference", engine_version="test",
                           registry=registry, tracer_provider=provider)
    yield agent, exporter
    agent.close()
    provider.shutdown()


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The test core's tensors are tiny: one intra-op thread is fastest, and on a busy 2-core
    machine a second one spin-waits for a core and slows steps down tenfold."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
