"""The scheduler-side agent against stand-ins of vLLM's scheduler, and the runner seams with vLLM's own
classes: metrics from start-up in every mode, grants timed where vLLM allocates, monitored boundaries,
preemptions, the worker's report (with async scheduling too), and Model Runner V2's batch."""

from __future__ import annotations

import dataclasses
import logging
import types

import httpx
import pytest
from scheduler_sim import Block, BlockPool

from growpage import catalog
from growpage.core.compression_gate import StepGate
from growpage.vllm_plugin import scheduler_hooks
from growpage.vllm_plugin.scheduler_agent import SchedulerAgent, live_and_logical_tokens
from growpage.vllm_plugin.scheduler_hooks import build_agent
from growpage.vllm_plugin.wire import DROPPED_ATTRIBUTE, PAYLOAD_ATTRIBUTE, REPORT_ATTRIBUTE, WorkerReport
from support.promstack import wait_until

BLOCK = 4
POOL = 20


def _request(request_id: str, prompt: int, computed: int, extra: dict | None = None):
    return types.SimpleNamespace(request_id=request_id, num_prompt_tokens=prompt, num_computed_tokens=computed,
                                 num_tokens=computed + 1, num_cached_tokens=0, spec_token_ids=[],
                                 sampling_params=types.SimpleNamespace(extra_args=extra or {}))


def _scheduler(growpage: dict, *, async_scheduling: bool = False, pipeline: int = 1, groups: int = 1,
               cudagraph: str | None = None, runner_v2: bool = False):
    compilation = None
    if cudagraph is not None:
        from vllm.config.compilation import CUDAGraphMode

        compilation = types.SimpleNamespace(cudagraph_mode=CUDAGraphMode[cudagraph])
    vllm_config = types.SimpleNamespace(
        additional_config={"growpage": growpage}, cache_config=types.SimpleNamespace(block_size=BLOCK),
        compilation_config=compilation, use_v2_model_runner=runner_v2,
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=pipeline),
        model_config=types.SimpleNamespace(served_model_name="m", model="m"),
        device_config=types.SimpleNamespace(device_type="cpu"))
    single = types.SimpleNamespace(req_to_blocks={}, num_cached_block={})
    manager = types.SimpleNamespace(block_pool=BlockPool(POOL), coordinator=types.SimpleNamespace(
        single_type_managers=[single] * groups))
    spec = types.SimpleNamespace(page_size_bytes=BLOCK * 256, block_size=BLOCK)  # 256 bytes/token/layer
    kv_cache_config = types.SimpleNamespace(kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=spec,
                                                                                   layer_names=["l0", "l1"])])
    return types.SimpleNamespace(vllm_config=vllm_config, kv_cache_manager=manager, kv_cache_config=kv_cache_config,
                                 scheduler_config=types.SimpleNamespace(async_scheduling=async_scheduling),
                                 running=[], waiting=[])


def _run(agent: SchedulerAgent, scheduler, request, new_blocks: int, latency_s: float = 0.002) -> None:
    """One scheduler step in which ``request`` runs and vLLM hands it ``new_blocks`` blocks."""
    agent.before_schedule(scheduler)
    blocks = scheduler.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks
    blocks.setdefault(request.request_id, []).extend(scheduler.kv_cache_manager.block_pool.take(new_blocks))
    if request not in scheduler.running:
        scheduler.running.append(request)
    agent.on_allocated(request.request_id, new_blocks, latency_s)
    agent.after_schedule(scheduler, types.SimpleNamespace())


@pytest.mark.parametrize(("settings", "blocker"), [
    ({}, None), ({"async_scheduling": True}, "async_scheduling"), ({"pipeline": 2}, "pipeline_parallel"),
    ({"groups": 2}, "hybrid_kv_cache"), ({"cudagraph": "FULL_AND_PIECEWISE"}, "full_cudagraph"),
    ({"cudagraph": "PIECEWISE"}, None), ({"runner_v2": True}, "model_runner_v2")])
def test_enforcement_starts_only_where_it_is_safe_and_says_why_not(settings, blocker):
    pytest.importorskip("vllm.config.compilation")
    agent = build_agent(_scheduler({"mode": "enforce", "base_pages": 3, "recent_window_tokens": 2}, **settings),
                        start_telemetry=False)
    assert (agent.enforcer is None) is (blocker is not None)
    states = agent.stats.component_states
    assert states["enforcer"] == (blocker or "waiting_for_worker") and states["scheduler"] == "active"
    # vLLM's default graph mode leaves the observer working on the steps that run eagerly
    assert states["observer"] == "active"
    monitor = build_agent(_scheduler({"mode": "monitor"}, **settings), start_telemetry=False)
    assert monitor.enforcer is None and "enforcer" not in monitor.stats.component_states


@pytest.mark.parametrize("mode", ["off", "monitor", "enforce"])
def test_metrics_are_served_from_start_up_before_any_request_in_every_mode(mode):
    pytest.importorskip("vllm")
    agent = build_agent(_scheduler({"mode": mode, "base_pages": 3, "recent_window_tokens": 2,
                                    "exporter_port": 0, "exporter_host": "127.0.0.1"}))
    try:
        response = httpx.get(f"http://127.0.0.1:{agent.exporter.port}{catalog.METRICS_PATH}", timeout=10)
    finally:
        agent.telemetry.close()
    assert response.status_code == 200
    text = response.text
    assert f'mode="{mode}"' in text and 'home="vllm"' in text and 'base_pages="3"' in text
    active = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("growpage_agent_active{")}
    scheduler_series = [(k, v) for k, v in active.items() if 'component="scheduler"' in k]
    assert len(scheduler_series) == 1
    key, value = scheduler_series[0]
    assert ('reason="mode_off"' in key and value == 0) if mode == "off" else ('reason="active"' in key and value == 1)
    assert f'growpage_pool_pages{{model_name="m",state="free"}} {float(POOL)}' in text  # the whole pool, free


@pytest.mark.parametrize("mode, reason", [("enforce", "invalid_config"), ("off", "mode_off")])
def test_settings_it_cannot_honour_leave_the_agent_inactive_saying_why_and_vllm_running(mode, reason):
    """A recent window no floor can keep: enforce reports ``invalid_config`` and logs one line with the
    fix; mode off never uses the window, so it is not checked there."""
    pytest.importorskip("vllm")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("vllm.growpage")  # vLLM's "vllm" logger may not propagate to pytest's
    logger.addHandler(handler)
    try:
        scheduler = _scheduler({"mode": mode, "base_pages": 2, "recent_window_tokens": 4096,
                                "exporter_port": 0, "exporter_host": "127.0.0.1"})
        agent = build_agent(scheduler)
    finally:
        logger.removeHandler(handler)
    try:
        response = httpx.get(f"http://127.0.0.1:{agent.exporter.port}{catalog.METRICS_PATH}", timeout=10)
    finally:
        agent.telemetry.close()
    assert agent.enforcer is None and agent.config.mode.value == "off"
    _run(agent, scheduler, _request("r", prompt=7, computed=0), new_blocks=2)
    assert agent.controller.requests == {} and agent.stats.pages_allocated_total == 2  # vLLM pages on its own
    active = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in response.text.splitlines()
              if line.startswith("growpage_agent_active{")}
    components = ("scheduler", "observer", "enforcer") if mode == "enforce" else ("scheduler", "observer")
    assert active == {f'growpage_agent_active{{component="{c}",model_name="m",reason="{reason}"}}': 0.0
                      for c in components}
    errors = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    if mode == "enforce":
        assert len(errors) == 1, errors
        fewest = 1 + -(-(4 + 4096) // BLOCK)  # an evicted page, then sinks and recent window in blocks
        assert "invalid_config" in errors[0] and f"raise base_pages to at least {fewest} " in errors[0], errors
    else:
        assert errors == []


def test_monitor_admits_times_grants_and_decides_past_the_grant():
    scheduler = _scheduler({"mode": "monitor", "base_pages": 2, "recent_window_tokens": 2, "sink_tokens": 1})
    agent = build_agent(scheduler, start_telemetry=False)
    request = _request("r", prompt=7, computed=0)
    _run(agent, scheduler, request, new_blocks=2, latency_s=0.004)  # the prompt's 2 blocks
    assert "r" in agent.controller.requests and agent.stats.pages_allocated_total == 2
    request.num_computed_tokens = 8
    _run(agent, scheduler, request, new_blocks=1, latency_s=0.006)  # a third block: past the grant
    agent.take_report(WorkerReport(readings={"r": (0.25, 2.9)}, ready_to_compact=True, observer_state="active",
                                   steps=2, steps_observed=1))
    request.num_computed_tokens = 12
    _run(agent, scheduler, request, new_blocks=1, latency_s=0.008)
    snapshot = agent.make_stats()
    assert snapshot.pages_allocated_total == 4
    assert list(snapshot.allocation_latencies_s) == [0.004, 0.006, 0.008]  # each call's own duration
    events = snapshot.decision_events
    assert len(events) == 2 and not any(e.enforced for e in events)
    assert events[-1].lts_entropy == pytest.approx(2.9)  # the worker's reading reached the decision
    assert agent.observed.steps == 2 and agent.observed.steps_observed == 1
    gauges = snapshot.gauges
    assert gauges.pages_used == 4 and gauges.pages_free == POOL - 4 and gauges.live_tokens == 12
    # vLLM preempts it: counted, released, admitted again when it runs again
    agent.on_preempt(request)
    assert agent.stats.oom_events_total == 1 and "r" not in agent.controller.requests
    _run(agent, scheduler, request, new_blocks=4)
    agent.on_free(request)  # it finishes, observed before its preemption only: not observed since
    assert (agent.observed.requests, agent.observed.requests_observed) == (1, 0)
    other = _request("o", prompt=3, computed=0)
    _run(agent, scheduler, other, new_blocks=1)
    agent.take_report(WorkerReport(readings={"o": (0.5, 1.5)}, ready_to_compact=True, observer_state="active"))
    agent.on_free(other)
    assert (agent.observed.requests, agent.observed.requests_observed) == (2, 1)  # the share of requests observed
    agent.on_free(_request("never-ran", prompt=3, computed=0))  # an abort before it ran: nothing to release


def test_monitor_tells_its_workers_to_observe_only_prompt_ends_while_enforces_gate_would_idle():
    """The forecast runs enforce's compression gate on its shadows; while it is idle (nothing
    measured pays yet) enforce's workers would observe only prompt ends, and monitor's are told
    the same in the step's payload, with no plans."""
    scheduler = _scheduler({"mode": "monitor", "base_pages": 2, "recent_window_tokens": 2, "sink_tokens": 1})
    agent = build_agent(scheduler, start_telemetry=False)
    assert agent.forecast is not None and agent.enforcer is None
    request = _request("r", prompt=7, computed=0)
    agent.before_schedule(scheduler)
    scheduler.running.append(request)
    blocks = scheduler.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks
    blocks["r"] = scheduler.kv_cache_manager.block_pool.take(2)
    output = types.SimpleNamespace()
    agent.after_schedule(scheduler, output)
    payload = getattr(output, PAYLOAD_ATTRIBUTE)
    assert payload.prompts_only and payload.plans == {} and payload.dropped == {}
    # no gate (compression never idle) and no room rule: every due step is observed, as enforce's would be
    agent.forecast.gate = StepGate(None)
    agent.settings = dataclasses.replace(agent.settings, grow_with_room_for_all=False)
    agent.after_schedule(scheduler, output := types.SimpleNamespace())
    assert not getattr(output, PAYLOAD_ATTRIBUTE).prompts_only
    off = _scheduler({"mode": "off"})
    build_agent(off, start_telemetry=False).after_schedule(off, output := types.SimpleNamespace())
    assert not hasattr(output, PAYLOAD_ATTRIBUTE)  # nothing monitored: no payload


def test_mode_off_counts_vllms_grants_but_admits_nobody():
    scheduler = _scheduler({"mode": "off"})
    agent = build_agent(scheduler, start_telemetry=False)
    _run(agent, scheduler, _request("r", prompt=7, computed=0), new_blocks=2)
    assert agent.controller.requests == {} and agent.stats.pages_allocated_total == 2


def test_blocks_shared_through_the_prefix_cache_are_counted_once():
    shared = [Block(1, ref_cnt=2), Block(2, ref_cnt=2)]
    first = _request("a", prompt=10, computed=10)
    second = _request("b", prompt=10, computed=11)
    setattr(second, DROPPED_ATTRIBUTE, 0)
    req_to_blocks = {"a": shared + [Block(3)], "b": shared + [Block(4)]}
    live, logical = live_and_logical_tokens([first, second], req_to_blocks, BLOCK)
    assert live == 8 + 2 + 3  # 2 full shared blocks once, then each own tail
    assert logical == live  # nothing compacted: sharing is vLLM's saving, not compression


def test_a_compacted_request_holds_its_physical_tokens():
    request = _request("a", prompt=2, computed=20)
    setattr(request, DROPPED_ATTRIBUTE, 12)
    live, logical = live_and_logical_tokens([request], {"a": [Block(1), Block(2), Block(3)]}, BLOCK)
    assert (live, logical) == (8, 20)


def test_prefix_sharing_reads_no_compression_and_only_growpages_compactions_do():
    """Two requests sharing a 64-token cached prefix, nothing compacted: ratio 1.0 (it read 2.0 when
    sharing counted as compression); then the enforcer compacts a third request: ratio above 1."""
    # the contract compacting at its cap (the compression gate would leave it idle: nothing pays here)
    scheduler = _scheduler({"mode": "enforce", "base_pages": 3, "sink_tokens": 1, "recent_window_tokens": 2,
                            "growth_coefficient": 0, "lts_grow_threshold": 100, "attention_coverage": 0,
                            "compression_gate": False})
    agent = build_agent(scheduler, start_telemetry=False)
    pool = scheduler.kv_cache_manager.block_pool
    blocks = scheduler.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks
    prefix = pool.take(64 // BLOCK)
    for block in prefix:
        block.ref_cnt = 2  # vLLM's prefix cache: both requests hold the same blocks
    first, second = _request("a", prompt=64, computed=64), _request("b", prompt=64, computed=64)
    blocks.update(a=list(prefix), b=list(prefix))
    scheduler.running = [first, second]
    agent.after_schedule(scheduler, types.SimpleNamespace())  # the step that admits them
    gauges = agent.make_stats().gauges
    assert gauges.live_tokens == 64 and gauges.stored_bytes == gauges.logical_bytes == 64 * 2 * 256
    assert gauges.compression_ratio == 1.0

    third = _request("c", prompt=2, computed=12)  # decoding at its 3-block cap, its blocks its own
    blocks["c"] = pool.take(3)
    scheduler.running.append(third)
    agent.take_report(WorkerReport(readings={}, ready_to_compact=True, observer_state="active"))
    agent.before_schedule(scheduler)  # the enforcer compacts it: 4 tokens dropped, its tail block freed
    assert getattr(third, DROPPED_ATTRIBUTE) == 4 and len(blocks["c"]) == 2
    gauges = agent.make_stats().gauges
    assert gauges.live_tokens == 64 + 8 and gauges.logical_bytes == (64 + 12) * 2 * 256
    assert gauges.compression_ratio == pytest.approx((64 + 12) / (64 + 8))


def test_the_report_rides_on_the_output_the_async_wrapper_resolves_to():
    pytest.importorskip("vllm")
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, AsyncModelRunnerOutput, ModelRunnerOutput

    from growpage.vllm_plugin.worker_hooks import attach_report

    report = WorkerReport(readings={"r": (0.5, 1.0)}, ready_to_compact=True, observer_state="active")
    plain = ModelRunnerOutput(req_ids=["r"], req_id_to_index={"r": 0})
    attach_report(plain, report)
    assert getattr(plain, REPORT_ATTRIBUTE) is report

    resolved = ModelRunnerOutput(req_ids=["r"], req_id_to_index={"r": 0})

    class _Pending(AsyncModelRunnerOutput):  # what async scheduling returns: resolved later, in the worker
        def get_output(self) -> ModelRunnerOutput:
            return resolved

    pending = _Pending()
    attach_report(pending, report)
    assert not hasattr(resolved, REPORT_ATTRIBUTE)  # nothing resolved yet
    assert getattr(pending.get_output(), REPORT_ATTRIBUTE) is report
    attach_report(EMPTY_MODEL_RUNNER_OUTPUT, report)  # vLLM's shared empty output is never written
    assert not hasattr(EMPTY_MODEL_RUNNER_OUTPUT, REPORT_ATTRIBUTE)


def test_model_runner_v2_batch_is_read_from_its_own_input_batch():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    input_batch_module = pytest.importorskip("vllm.v1.worker.gpu.input_batch")
    from growpage.vllm_plugin.observer import batch_view, remember_v2_batch

    fields = {f.name: None for f in dataclasses.fields(input_batch_module.InputBatch)}
    fields.update(req_ids=["a", "b", "pad"], num_reqs=2, num_scheduled_tokens=np.array([5, 1, 0]),
                  query_start_loc_np=np.array([0, 5, 6, 6]), num_computed_tokens_np=np.array([0, 40, 0]))
    batch = input_batch_module.InputBatch(**fields)
    runner = types.SimpleNamespace()  # a V2 runner keeps no persistent input_batch
    remember_v2_batch(runner, batch)
    table = torch.arange(8).view(2, 4)
    req_ids, starts, seq_lens, block_table = batch_view(runner, types.SimpleNamespace(block_table=table))
    assert (req_ids, starts, seq_lens) == (["a", "b"], [0, 5, 6], [5, 41]) and block_table is table
    with pytest.raises(RuntimeError, match="FLASH_ATTN"):  # FlashInfer's metadata has no block table
        batch_view(runner, types.SimpleNamespace())


def _decoding_agent(mode: str, **growpage):
    """An agent whose one running request is past its prompt and holds 10 blocks of 4 tokens."""
    scheduler = _scheduler({"mode": mode, "base_pages": 3, "recent_window_tokens": 2, "sink_tokens": 1,
                            **growpage})
    agent = build_agent(scheduler, start_telemetry="exporter_port" in growpage)
    request = _request("r", prompt=7, computed=0)
    _run(agent, scheduler, request, new_blocks=10)
    request.num_computed_tokens = 40
    agent.take_report(WorkerReport(readings={}, ready_to_compact=True, observer_state="active"))
    agent.refresh_headroom(scheduler)
    return agent, scheduler


def test_headroom_counts_what_enforce_could_reclaim_down_to_the_floor():
    agent, _ = _decoding_agent("enforce")
    room = agent.headroom
    # floor: base_pages 3 (1 sink + 2 recent tokens fit in one page, plus the next token's)
    assert (room.running, room.free_pages, room.reclaimable_pages) == (1, POOL - 10, 7)
    assert room.headroom_pages == POOL - 3


@pytest.mark.parametrize("mode", ["off", "monitor"])
def test_headroom_in_off_and_monitor_is_the_free_pages_only(mode):
    agent, _ = _decoding_agent(mode)
    assert agent.headroom.reclaimable_pages == 0 and agent.headroom.headroom_pages == POOL - 10


def test_headroom_of_an_enforcer_whose_worker_cannot_move_tokens_is_the_free_pages_only():
    agent, scheduler = _decoding_agent("enforce")
    agent.take_report(WorkerReport(readings={}, ready_to_compact=False, observer_state="active"))
    agent.refresh_headroom(scheduler)
    assert agent.headroom.reclaimable_pages == 0


def test_idle_engine_reads_load_zero_with_the_whole_pool_as_headroom():
    agent, scheduler = _decoding_agent("enforce")
    scheduler.running.clear()
    scheduler.kv_cache_manager.block_pool.free = list(range(1, POOL + 1))
    agent.after_output(scheduler)
    assert agent.headroom.load == 0 and agent.headroom.headroom_pages == POOL


def test_get_load_answers_the_exported_load_and_503_when_the_exporter_is_gone():
    pytest.importorskip("vllm")
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from growpage.vllm_plugin.endpoint import GrowPageEndpoint

    agent, _ = _decoding_agent("enforce", exporter_port=0, exporter_host="127.0.0.1")
    endpoint, app = GrowPageEndpoint(), Starlette()
    endpoint.attach_router(app)
    endpoint.upstream_url = f"http://127.0.0.1:{agent.exporter.port}{catalog.METRICS_PATH}"
    try:
        with TestClient(app) as client:
            answer = client.get(catalog.LOAD_PATH)
            metrics = httpx.get(endpoint.upstream_url, timeout=10).text
            agent.telemetry.close()
            gone = client.get(catalog.LOAD_PATH)
    finally:
        agent.telemetry.close()
    # 1 request, 10 pages each, headroom 17 pages: room for 1 more -> 1 of 2 taken
    assert answer.status_code == 200 and answer.json() == {"load": agent.headroom.load} == {"load": 50}
    assert 'growpage_kv_headroom_pages{model_name="m"} 17.0' in metrics
    assert 'growpage_kv_reclaimable_pages{model_name="m"} 7.0' in metrics
    assert gone.status_code == 503 and "not answering" in gone.json()["error"]


def test_an_exporter_port_held_by_another_process_is_bound_once_it_frees(monkeypatch):
    """vLLM serves while the port is taken (the fault is counted once); the agent binds it when it frees."""
    pytest.importorskip("vllm")
    import socket

    from growpage.vllm_plugin import exporter_retry

    monkeypatch.setattr(exporter_retry, "RETRY_INTERVAL_S", 0.05)
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    agent = build_agent(_scheduler({"mode": "monitor", "exporter_port": port, "exporter_host": "127.0.0.1"}))
    try:
        assert agent.exporter is None
        assert agent.stats.agent_errors_total["plugin"] == 1
        holder.close()
        wait_until(lambda: agent.exporter is not None, 10, interval_s=0.05, what="the exporter to bind its freed port")
        response = httpx.get(f"http://127.0.0.1:{port}{catalog.METRICS_PATH}", timeout=10)
        assert response.status_code == 200 and 'mode="monitor"' in response.text
        assert agent.stats.agent_errors_total["plugin"] == 1  # counted once, not per retry
    finally:
        holder.close()
        agent.close()


def _crowded(scheduler, running: int = 2, waiting: int = 4):
    """``running`` requests of 7 prompt tokens that may decode 33 more (10 pages of 4 at their ends),
    ``waiting`` more behind them, under vLLM 0.32's admission limit."""
    def request(request_id: str):
        made = _request(request_id, prompt=7, computed=7)
        made.num_output_tokens, made.max_tokens, made.status = 0, 33, None
        return made

    scheduler.running = [request(f"r{i}") for i in range(running)]
    scheduler.waiting = [request(f"w{i}") for i in range(waiting)]
    scheduler.max_num_active_reqs = 8
    return scheduler


@pytest.mark.parametrize(("growpage", "cpu", "limit"), [
    ({"mode": "enforce", "admission": "projected"}, "amx", 2), ({"mode": "enforce", "admission": "vllm"}, "avx2", 8),
    # the default, auto, before its step costs are measured: the host's prior. A CPU not priced (AVX2)
    # looks ahead; on AMX a prefilled token is priced at 0.9 % of a step, so these short prompts with
    # 33 tokens to decode are not worth holding
    ({"mode": "enforce"}, "avx2", 2), ({"mode": "enforce"}, "amx", 8),
    ({"mode": "enforce", "admission": "after_preemption"}, "avx2", 8),  # nothing preempted yet
    ({"mode": "monitor", "admission": "projected"}, "avx2", 8), ({"mode": "off", "admission": "projected"}, "avx2", 8)])
def test_only_enforce_holds_admission_and_only_where_it_is_asked_to(growpage, cpu, limit, monkeypatch):
    monkeypatch.setattr(scheduler_hooks, "host_cpu_kind", lambda: cpu)
    scheduler = _crowded(_scheduler({**growpage, "base_pages": 3, "recent_window_tokens": 2, "sink_tokens": 1}))
    agent = build_agent(scheduler, start_telemetry=False)
    agent.before_schedule(scheduler)  # two requests at 10 pages each fill the pool of 20
    assert scheduler.max_num_active_reqs == limit
    assert (agent.admission is not None) == (growpage["mode"] == "enforce" and growpage.get("admission") != "vllm")


def test_a_fault_in_admission_is_counted_and_leaves_vllms_admission_and_the_step():
    scheduler = _crowded(_scheduler({"mode": "enforce", "admission": "projected", "base_pages": 3,
                                     "recent_window_tokens": 2, "sink_tokens": 1}))
    agent = build_agent(scheduler, start_telemetry=False)
    del scheduler.waiting[0].max_tokens, scheduler.waiting[0].num_output_tokens
    agent.before_schedule(scheduler)
    assert scheduler.max_num_active_reqs == 8 and agent.stats.agent_errors_total["plugin"] == 1


def test_faults_of_a_rank_whose_report_never_returns_are_counted_by_the_scheduler():
    """Tensor parallelism 3: rank 2 publishes its faults on the engine's board; the scheduler's agent
    counts them in growpage_agent_errors_total{component="plugin"} on the next step's output."""
    from growpage.vllm_plugin.rank_faults import RankFaultPublisher, board_for

    scheduler = _scheduler({"mode": "monitor"})
    scheduler.vllm_config.parallel_config.tensor_parallel_size = 3
    scheduler.vllm_config.instance_id = f"test-{id(scheduler)}"
    agent = build_agent(scheduler, start_telemetry=False)
    assert agent.rank_faults is not None
    board = board_for(scheduler.vllm_config)
    assert board is not None and board.path == agent.rank_faults.board.path
    publisher = RankFaultPublisher(board, rank=2)
    publisher()
    publisher()
    agent.on_output(types.SimpleNamespace())  # rank 0's output, without a report
    assert agent.stats.agent_errors_total["plugin"] == 2
    agent.close()
    assert not board.path.exists()  # the engine's board goes with it
    board.close()
