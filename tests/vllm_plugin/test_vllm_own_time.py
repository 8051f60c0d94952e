"""What GrowPage costs vLLM: its own seconds against the vLLM calls it hooks, outermost calls only,
reported by the worker, summed by the scheduler's agent and exported by side."""

from __future__ import annotations

import threading
import types

import pytest
from test_vllm_plugin_units import _observer
from test_vllm_scheduler_agent import _scheduler

from growpage import catalog
from growpage.core.stats import StatsRecorder
from growpage.vllm_plugin.metrics import ObservationCollector
from growpage.vllm_plugin.own_time import SCHEDULER_SIDE, WORKER_SIDE, OwnTime
from growpage.vllm_plugin.scheduler_agent import ObservedWork
from growpage.vllm_plugin.scheduler_hooks import build_agent
from growpage.vllm_plugin.wire import WorkerReport


class _Clock:
    """Seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_nested_measurement_counts_once_and_own_time_sits_inside_the_step():
    clock = _Clock()
    meter = OwnTime(clock)
    with meter.step():
        clock.now += 1.0  # vLLM's own work
        with meter.own():
            clock.now += 0.25
            with meter.own():  # a guarded call inside another: already inside its time
                clock.now += 0.25
        clock.now += 2.0
    assert (meter.own_seconds, meter.step_seconds) == (0.5, 3.5)
    assert meter.since_report() == (0.5, 3.5)
    with meter.own():  # outside any hooked call (a grant timed inside vLLM's schedule, say)
        clock.now += 0.1
    assert meter.since_report() == pytest.approx((0.1, 0.0))  # only what came since the last report
    assert meter.since_report() == (0.0, 0.0)


def test_a_fault_inside_a_measurement_is_still_timed_and_the_depth_unwinds():
    clock = _Clock()
    meter = OwnTime(clock)
    with pytest.raises(RuntimeError), meter.own():
        clock.now += 0.5
        raise RuntimeError("vLLM's own method raised")
    with meter.own():  # the depth is back at zero: the next outermost call counts
        clock.now += 0.5
    assert meter.own_seconds == 1.0


def test_another_thread_measures_its_own_calls_whatever_the_engine_thread_is_inside():
    clock = _Clock()
    meter = OwnTime(clock)
    with meter.own():
        clock.now += 1.0
        other = threading.Thread(target=lambda: meter.own().__enter__())  # entered, never left: depth 1 there
        other.start()
        other.join()
    assert meter.own_seconds == 1.0  # the engine thread's outermost call was not mistaken for a nested one


def test_the_agent_sums_the_workers_reports_and_times_its_own_guarded_work():
    agent = build_agent(_scheduler({"mode": "monitor"}), start_telemetry=False)
    clock = _Clock()
    agent.observed.scheduler_time = OwnTime(clock)

    def decide() -> None:
        clock.now += 0.002
        agent.guarded("nested", lambda: None)  # nested: not counted again

    with agent.observed.scheduler_time.step():
        clock.now += 0.010
        agent.guarded("boundary decisions", decide)
    for own, step in ((0.5, 10.0), (0.25, 5.0)):
        agent.take_report(WorkerReport(readings={}, ready_to_compact=True, observer_state="active",
                                       own_seconds=own, step_seconds=step))
    assert agent.observed.own_seconds() == pytest.approx({SCHEDULER_SIDE: 0.002, WORKER_SIDE: 0.75})
    assert agent.observed.step_seconds() == pytest.approx({SCHEDULER_SIDE: 0.012, WORKER_SIDE: 15.0})


def test_both_series_are_exported_by_side_with_the_catalogs_names():
    work = ObservedWork(worker_own_seconds=0.75, worker_step_seconds=15.0)
    clock = _Clock()
    work.scheduler_time = OwnTime(clock)
    with work.scheduler_time.step():
        clock.now += 0.5
        with work.scheduler_time.own():
            clock.now += 0.125
    agent = types.SimpleNamespace(observed=work, stats=StatsRecorder())
    families = {family.name: family for family in ObservationCollector(agent, "m").collect()}
    exported = {name: {sample.labels["side"]: sample.value for sample in families[name].samples}
                for name in ("growpage_vllm_own_seconds", "growpage_vllm_step_seconds")}
    assert exported == {"growpage_vllm_own_seconds": {"scheduler": 0.125, "worker": 0.75},
                        "growpage_vllm_step_seconds": {"scheduler": 0.625, "worker": 15.0}}
    assert catalog.VLLM_OWN_SECONDS in catalog.VLLM_HOME_METRICS and catalog.VLLM_STEP_SECONDS.labels == ("side",)
    assert set(catalog.VLLM_OWN_SECONDS.label_values["side"]) == {SCHEDULER_SIDE, WORKER_SIDE}


def test_the_worker_times_its_guarded_work_inside_the_step_and_reports_it_once():
    observer = _observer()
    clock = _Clock()
    observer.own_time = OwnTime(clock)

    def observe() -> None:
        clock.now += 0.25

    def broken() -> None:
        clock.now += 0.125
        raise RuntimeError("a fault inside GrowPage")

    with observer.own_time.step():  # what the worker hooks wrap around vLLM's execute_model
        observer.guarded("step start", observe)
        clock.now += 1.0  # vLLM's forward
        observer.guarded("step end", broken)  # caught and counted; its time is GrowPage's all the same
    report = observer.take_report()
    assert (report.own_seconds, report.step_seconds) == (0.375, 1.375) and report.errors == 1
    again = observer.take_report()
    assert (again.own_seconds, again.step_seconds) == (0.0, 0.0)
