"""The agent's threading model: the engine thread polls, scrape threads only read."""

import threading

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from telemetry_workload import MODEL, Workload

from growpage import catalog
from growpage.telemetry import TelemetryAgent
from support.factories import FakeClock


def sample(text: str, name: str, parse=text_string_to_metric_families) -> float:
    for family in parse(text):
        for s in family.samples:
            if s.name == name:
                return s.value
    raise KeyError(name)


def test_concurrent_scrapes_during_a_live_workload_are_consistent(manager, registry):
    agent = TelemetryAgent(manager, model=MODEL, registry=registry, poll_interval_s=0.0)
    stop = threading.Event()
    failures, seen = [], []

    def scraper(accept):
        parse = parse_openmetrics if accept else text_string_to_metric_families
        last = -1.0
        try:
            while not stop.is_set():
                text = agent.render(accept).body.decode()
                allocations = sample(text, catalog.ALLOCATIONS.name, parse)
                assert allocations >= last, "a counter went backwards"
                last = allocations
                seen.append(allocations)
                stop.wait(0.01)  # scrapers hammer, but leave the engine thread some GIL
        except Exception as exc:  # reported below, in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=scraper, args=(accept,))
               for accept in (None, "application/openmetrics-text; version=1.0.0", None)]
    for thread in threads:
        thread.start()
    try:
        Workload(manager).run(10, on_step=agent.on_step)  # the engine thread: polls every step
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    assert not failures, failures
    assert len(seen) > 10 and max(seen) > min(seen)
    assert agent.agent_errors()["collector"] == 0
    agent.close()


def test_on_step_polls_at_most_once_per_interval(manager, registry, monkeypatch):
    clock = FakeClock()
    agent = TelemetryAgent(manager, model=MODEL, registry=registry, poll_interval_s=1.0, clock=clock)
    calls = []
    drain = manager.make_stats
    monkeypatch.setattr(manager, "make_stats", lambda: calls.append(1) or drain())
    for _ in range(100):
        agent.on_step()
    assert calls == []
    clock.now += 1.0
    for _ in range(100):
        agent.on_step()
    assert len(calls) == 1
    agent.close()


def test_an_idle_engine_is_refreshed_under_its_lock_at_scrape_time(manager, registry):
    clock = FakeClock()
    engine_lock = threading.Lock()
    agent = TelemetryAgent(manager, model=MODEL, registry=registry, poll_interval_s=1.0, clock=clock,
                           engine_lock=engine_lock)
    running = catalog.REQUESTS_RUNNING.name
    with engine_lock:  # the engine admits a request, then goes idle without polling
        manager.admit("r", 3)
    assert sample(agent.render().body.decode(), running) == 0.0  # fresh enough: served as polled
    clock.now += 1.0
    assert sample(agent.render().body.decode(), running) == 1.0  # stale: polled under the lock
    clock.now += 1.0
    with engine_lock:  # the engine is busy: the scrape does not wait for it
        manager.release("r")
        assert sample(agent.render().body.decode(), running) == 1.0
    clock.now += 1.0
    assert sample(agent.render().body.decode(), running) == 0.0
    agent.close()


def test_without_an_engine_lock_scrapes_never_touch_the_manager(manager, registry, monkeypatch):
    clock = FakeClock()
    agent = TelemetryAgent(manager, model=MODEL, registry=registry, poll_interval_s=1.0, clock=clock)
    monkeypatch.setattr(manager, "make_stats", lambda: (_ for _ in ()).throw(AssertionError("scrape polled")))
    clock.now += 10.0
    agent.render()
    assert agent.agent_errors()["collector"] == 0
    agent.close()


def test_close_unregisters_the_collector_and_the_tracer(manager, registry, traced):
    agent, _ = traced
    agent.close()
    assert agent.render().body == b""
    assert manager.stats.listeners == []
    agent.close()  # idempotent
