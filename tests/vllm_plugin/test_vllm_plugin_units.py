"""The plugin's pieces without an engine: version gate, settings, cache layout, observer, route."""

from __future__ import annotations

import importlib.util
import json
import types

import pytest
import torch
from cache_layouts import lossy_write, transposed_cache, transposed_write

from growpage.config import Mode, load_config
from growpage.errors import ConfigError
from growpage.vllm_plugin.observer import VllmObserver, layer_index
from growpage.vllm_plugin.settings import PluginSettings, split_settings
from growpage.vllm_plugin.versions import SUPPORTED_VLLM_SPEC, check_vllm_version, is_supported


def test_version_gate_names_the_supported_range_and_the_way_out():
    assert is_supported("0.32.0") and is_supported("0.32.3+cpu")
    assert not is_supported("0.31.9") and not is_supported("0.33.0rc1")
    with pytest.raises(RuntimeError) as raised:
        check_vllm_version("0.33.1")
    assert SUPPORTED_VLLM_SPEC in str(raised.value) and "GROWPAGE_MODE=off" in str(raised.value)


def test_settings_split_plugin_keys_and_follow_vllm_block_size():
    config, settings = split_settings({"mode": "enforce", "base_pages": 4, "recent_window_tokens": 16,
                                       "exporter_port": 0, "observed_heads": 2},
                                      env={"GROWPAGE_STS_WINDOW_STEPS": "16"}, block_size=32)
    assert config.mode is Mode.ENFORCE and config.base_pages == 4 and config.block_size == 32
    assert config.sts_window_steps == 16  # environment fallback
    assert settings == PluginSettings(exporter_port=0, observed_heads=2)


def test_settings_reject_unknown_keys_with_a_fix():
    with pytest.raises(ConfigError):
        split_settings({"mood": "monitor"}, env={})
    with pytest.raises(ConfigError, match="exporter_port"):
        split_settings({"exporter_port": 70000}, env={})
    with pytest.raises(ConfigError, match="method must be one of growpage, growpage_when_it_pays, streaming_llm"):
        split_settings({"method": "uniform_int8"}, env={})
    assert split_settings({}, env={"GROWPAGE_VLLM_METHOD": "snapkv"})[1].method == "snapkv"
    with pytest.raises(ConfigError, match=r"observation_window_tokens must be an int in \[1, 128\], got 0; try 32"):
        split_settings({"observation_window_tokens": 0}, env={})
    assert split_settings({}, env={"GROWPAGE_VLLM_OBSERVATION_WINDOW_TOKENS": "16"})[1].observation_window_tokens == 16


def test_keep_sets_and_redundancy_settings_are_checked_with_a_fix():
    with pytest.raises(ConfigError, match="keep_sets must be one of request, kv_head, got 'head'"):
        split_settings({"keep_sets": "head"}, env={})
    for bad in (1.0, -0.1, "0.9", True):
        with pytest.raises(ConfigError, match=r"redundancy_weight must be a number in \[0, 1\).*try 0 \(off\) or 0.9"):
            split_settings({"redundancy_weight": bad}, env={})
    env = {"GROWPAGE_VLLM_KEEP_SETS": "kv_head", "GROWPAGE_VLLM_REDUNDANCY_WEIGHT": "0.9"}
    settings = split_settings({}, env=env)[1]
    assert (settings.keep_sets, settings.redundancy_weight) == ("kv_head", 0.9)
    with pytest.raises(ConfigError, match="GROWPAGE_VLLM_REDUNDANCY_WEIGHT must be a number"):
        split_settings({}, env={"GROWPAGE_VLLM_REDUNDANCY_WEIGHT": "lots"})
    for bad in (1.5, -0.1, "half", True):
        with pytest.raises(ConfigError, match=r"shared_keep_fraction must be a number in \[0, 1\].*try 0.5"):
            split_settings({"keep_sets": "kv_head", "shared_keep_fraction": bad}, env={})
    with pytest.raises(ConfigError, match="applies only to per-head keep sets; set keep_sets to kv_head"):
        split_settings({"shared_keep_fraction": 0.5}, env={})  # it would change nothing: say so
    shared = split_settings({"keep_sets": "kv_head"}, env={"GROWPAGE_VLLM_SHARED_KEEP_FRACTION": "0.5"})[1]
    assert shared.shared_keep_fraction == 0.5


def test_per_head_keep_sets_sample_a_query_head_in_every_kv_heads_group():
    from growpage.vllm_plugin.observer import sampled_heads

    assert sampled_heads(9, 3, 4, every_kv_head=True) == [0, 2, 4, 6]  # the packaged model: already covered
    assert sampled_heads(32, 8, 4, every_kv_head=False) == [0, 8, 16, 24]  # KV heads 0, 2, 4, 6 only
    covering = sampled_heads(32, 8, 4, every_kv_head=True)
    assert {head // 4 for head in covering} == set(range(8)) and set(covering) >= {0, 8, 16, 24}


def test_layer_names_parse_and_the_observer_watches_the_controllers_layers():
    assert layer_index("model.layers.14.self_attn.attn") == 14
    from growpage.core.controller import GrowthController

    observer = _observer()
    assert observer.observed_layers == GrowthController(observer.config, num_layers=1).observed_layers


def _observer(**settings) -> VllmObserver:
    # every step observed unless a test says otherwise (monitor's default samples one in four)
    config, plugin = split_settings({"mode": "monitor", "base_pages": 2, "recent_window_tokens": 8,
                                     "observed_layers": 1, "observe_every_steps": 1, **settings}, env={},
                                    block_size=32)
    return VllmObserver(config, plugin, num_layers=1, max_requests=4)


def _observe_one_step(observer: VllmObserver, seq_len: int = 40, heads: int = 2,
                      head_dim: int = 8) -> torch.Tensor:
    """Admit ``r1`` (namespace ``a``) and observe the step that ends its prompt in one layer;
    returns the step's ``[heads, seq_len]`` attention, computed directly from the keys."""
    torch.manual_seed(0)
    keys = torch.randn(seq_len, 1, head_dim)
    cache = transposed_cache(keys, 32, 4)
    new = types.SimpleNamespace(req_id="r1", prompt_token_ids=list(range(seq_len - 1)), num_computed_tokens=0,
                                sampling_params=types.SimpleNamespace(extra_args={"growpage_namespace": "a"}))
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(req_ids=["r1"]))
    observer.begin_step(runner, types.SimpleNamespace(finished_req_ids=set(), scheduled_new_reqs=[new]))
    observer.note_kv_write(cache, keys[-1:], torch.tensor([seq_len - 1]), transposed_write, num_kv_heads=1,
                           block_size=32, head_dim=head_dim)
    assert observer.ready_to_compact and observer.state == "active"
    query = torch.randn(1, heads, head_dim)
    metadata = types.SimpleNamespace(query_start_loc=torch.tensor([0, 1]), seq_lens=torch.tensor([seq_len]),
                                     block_table=torch.tensor([[0, 1, 2, 3]]))
    impl = types.SimpleNamespace(num_heads=heads, num_kv_heads=1, scale=head_dim ** -0.5)
    assert observer.wants_layer("model.layers.0.self_attn.attn")
    observer.observe_layer(impl, query, cache, metadata)
    return torch.softmax(query[0] @ keys[:, 0].T * impl.scale, dim=-1)


def test_observer_reads_the_paged_cache_and_matches_direct_attention():
    observer = _observer()
    probs = _observe_one_step(observer)
    expected_entropy = -(probs * probs.log()).sum(-1).mean()
    observer.flush_observations()
    assert torch.allclose(observer.step.layers[0].entropy, expected_entropy[None], atol=1e-5)
    observer.end_step()
    assert observer.requests["r1"].namespace == "a" and observer.summaries.read([0])[0].steps_observed == 1
    report = observer.take_report()  # what the scheduler learns: this request's readings, one observed step
    assert set(report.readings) == {"r1"} and report.steps == report.steps_observed == 1
    assert report.observer_state == "active" and report.ready_to_compact and report.errors == 0
    # a monitored request's need is no floor here: it goes to monitor's forecast of enforce
    assert set(report.attention_tokens) == {"r1"} and observer.compactor is None
    assert observer.take_report().readings == {}  # each reading travels once


@pytest.mark.parametrize(("method", "sent"), [("growpage", True), ("h2o", False)])
def test_the_tokens_a_prompts_attention_needs_reach_the_scheduler_with_its_first_reading(method, sent):
    observer = _observer(mode="enforce", attention_coverage=0.9, method=method)
    mass = _observe_one_step(observer).mean(0)
    observer.end_step()
    sinks, recent = observer.config.sink_tokens, observer.config.recent_window_tokens  # always kept
    ranked = mass[sinks:-recent].sort(descending=True).values.cumsum(0)
    needed = sinks + recent + int((ranked < 0.9 * ranked[-1]).sum()) + 1
    assert observer.take_report().attention_tokens == ({"r1": needed} if sent else {})  # a cap stays a cap


def test_a_fault_in_growpage_is_counted_and_swallowed():
    observer = _observer(fault_injection="observe")
    assert observer.guarded("attention observation", observer.observe_layer, None, None, None, None) is None
    assert observer.errors_total == 1
    assert observer.take_report().errors == 1 and observer.take_report().errors == 0  # counted once, at the scheduler


def test_a_request_resumed_after_a_preemption_is_observed_again_from_a_fresh_row():
    """Model Runner V1 resends a resumed request as a cached one (``resumed_req_ids``), not a new one."""
    observer = _observer()
    _observe_one_step(observer)
    observer.end_step()
    step = types.SimpleNamespace
    observer.begin_step(None, step(finished_req_ids=set(), preempted_req_ids={"r1"}, scheduled_new_reqs=[]))
    observer.end_step()
    assert observer.requests.tracked == {}  # its KV is gone: nothing to observe until it runs again
    observer.begin_step(None, step(finished_req_ids=set(), scheduled_new_reqs=[],
                                   scheduled_cached_reqs=step(resumed_req_ids={"r1"})))
    resumed = observer.requests["r1"]
    assert resumed.namespace == "a" and resumed.prompt_tokens == 39  # what it was admitted with
    assert observer.summaries.read([resumed.row])[0].steps_observed == 0  # its recomputed KV starts over
    observer.end_step()
    observer.begin_step(None, step(finished_req_ids={"r1"}, scheduled_new_reqs=[]))
    table = observer.requests
    assert table.tracked == {} and table.preempted == {} and len(table.free_rows) == 4  # no row leaks


def test_off_requests_are_not_tracked():
    observer = _observer()
    new = types.SimpleNamespace(req_id="r", prompt_token_ids=[1, 2], num_computed_tokens=0,
                                sampling_params=types.SimpleNamespace(extra_args={"growpage_mode": "off"}))
    observer.begin_step(None, types.SimpleNamespace(finished_req_ids=set(), scheduled_new_reqs=[new]))
    assert observer.requests.tracked == {}


def test_route_is_inserted_ahead_of_vllms_metrics_mount_and_relays_the_exporter():
    pytest.importorskip("prometheus_client")
    starlette = pytest.importorskip("starlette")  # noqa: F841
    from prometheus_client import CollectorRegistry, Counter
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount
    from starlette.testclient import TestClient

    from growpage.telemetry import start_exporter
    from growpage.vllm_plugin.endpoint import GrowPageEndpoint

    registry = CollectorRegistry()
    Counter("growpage_demo", "demo", registry=registry).inc()
    exporter = start_exporter(registry, 0, "127.0.0.1")
    try:
        app = Starlette(routes=[Mount("/metrics", PlainTextResponse("vllm:own_series 1\n"))])
        plugin = GrowPageEndpoint()
        plugin.attach_router(app)
        import asyncio

        args = types.SimpleNamespace(additional_config={"growpage": {"exporter_port": exporter.port}})
        asyncio.run(plugin.init_state(None, None, args))
        body = TestClient(app).get("/metrics/growpage").text
        assert "growpage_demo_total 1.0" in body and "vllm:" not in body
    finally:
        exporter.close()


def test_namespace_comes_from_the_gateway_header_then_xargs_then_the_user_field():
    import json

    from growpage.vllm_plugin.namespaces import namespace_body

    def xargs(body: bytes | None) -> dict | None:
        return None if body is None else json.loads(body)["vllm_xargs"]

    plain = json.dumps({"prompt": "hi", "user": "team-a"}).encode()
    assert xargs(namespace_body(plain, None)) == {"growpage_namespace": "team-a"}
    assert xargs(namespace_body(plain, "gold")) == {"growpage_namespace": "gold"}
    explicit = json.dumps({"prompt": "hi", "user": "u", "vllm_xargs": {"growpage_namespace": "x", "k": 1}}).encode()
    assert namespace_body(explicit, None) is None  # the client's own choice stands
    assert xargs(namespace_body(explicit, "gold")) == {"growpage_namespace": "gold", "k": 1}
    assert namespace_body(json.dumps({"prompt": "hi"}).encode(), None) is None
    assert namespace_body(b"not json", "gold") is None


def test_namespace_middleware_rewrites_generation_requests_only():
    starlette = pytest.importorskip("starlette")  # noqa: F841
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from growpage.vllm_plugin.namespaces import NamespaceMiddleware

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse(await request.json())

    app = Starlette(routes=[Route("/v1/completions", echo, methods=["POST"]),
                            Route("/other", echo, methods=["POST"])])
    app.add_middleware(NamespaceMiddleware)
    client = TestClient(app)
    body = {"prompt": "hi", "user": "team-a"}
    assert client.post("/v1/completions", json=body).json()["vllm_xargs"] == {"growpage_namespace": "team-a"}
    got = client.post("/v1/completions", json=body, headers={"x-growpage-namespace": "gold"}).json()
    assert got["vllm_xargs"] == {"growpage_namespace": "gold"}
    assert client.post("/other", json=body, headers={"x-growpage-namespace": "gold"}).json() == body


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this interpreter")
def test_gpctl_serve_engine_vllm_says_in_one_line_where_vllm_is_missing():
    typer_testing = pytest.importorskip("typer.testing")
    app = pytest.importorskip("gpctl.main", reason="gpctl's dependencies are not installed here").app
    runner = typer_testing.CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})
    result = runner.invoke(app, ["serve", "--engine", "vllm"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "vLLM is not installed" in lines[0] and "make setup" in lines[0]


def test_a_cache_layout_that_does_not_round_trip_turns_observation_off_and_says_why():
    keys = torch.randn(4, 1, 8)
    cache = transposed_cache(keys, 32, 2)
    observer = _observer()
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(req_ids=[]))
    observer.begin_step(runner, types.SimpleNamespace(finished_req_ids=set(), scheduled_new_reqs=[]))
    observer.note_kv_write(cache, keys[-1:], torch.tensor([3]), lossy_write, num_kv_heads=1, block_size=32,
                           head_dim=8)
    assert not observer.ready_to_compact
    report = observer.take_report()
    assert report.observer_state == "unsupported_cache_layout" and report.errors == 1


def test_an_enforced_deployment_ignores_client_mode_and_namespace_by_default():
    import collections

    from growpage.vllm_plugin.namespaces import ClientPolicy, namespace_body
    from growpage.vllm_plugin.settings import honours

    def xargs(body: bytes | None) -> dict:
        return json.loads(body)["vllm_xargs"]

    assert not honours("auto", Mode.ENFORCE) and honours("auto", Mode.MONITOR) and honours("honour", Mode.ENFORCE)
    strict = ClientPolicy(honour_mode=False, honour_namespace=False)
    counts: collections.Counter = collections.Counter()
    opt_out = json.dumps({"prompt": "hi", "user": "free-tier",
                          "vllm_xargs": {"growpage_mode": "off", "growpage_namespace": "unenforced"}}).encode()
    # no gateway header: the client's mode and namespace are removed, nothing takes their place
    assert xargs(namespace_body(opt_out, None, strict, counts)) == {}
    # the gateway's header is the only namespace source
    assert xargs(namespace_body(opt_out, "gold", strict, counts)) == {"growpage_namespace": "gold"}
    assert counts["mode_ignored"] == 2 and counts["namespace_ignored"] == 1
    # a deployment that honours clients keeps today's behaviour, and counts it
    lenient_counts: collections.Counter = collections.Counter()
    assert namespace_body(opt_out, None, ClientPolicy(), lenient_counts) is None
    assert lenient_counts["mode_honoured"] == 1 and lenient_counts["namespace_honoured"] == 1


def test_client_choice_settings_are_validated():
    with pytest.raises(ConfigError, match="client_mode"):
        split_settings({"client_mode": "sometimes"}, env={})


def test_cuda_serving_keeps_vllms_defaults_for_monitor_and_sets_what_enforce_needs():
    from growpage.tooling.serve import serve_command

    monitor, monitor_env = serve_command("m", cpu=False, python="python", growpage={"mode": "monitor"})
    assert "--compilation-config" not in monitor and "--no-async-scheduling" not in monitor
    assert "VLLM_USE_V2_MODEL_RUNNER" not in monitor_env or monitor_env["VLLM_USE_V2_MODEL_RUNNER"] != "0"
    argv, env = serve_command("m", cpu=False, python="python", growpage={"mode": "enforce"})
    flag = argv.index("--compilation-config")
    assert json.loads(argv[flag + 1]) == {"cudagraph_mode": "PIECEWISE"} and "--enforce-eager" not in argv
    assert "--no-async-scheduling" in argv and env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    chosen, _ = serve_command("m", cpu=False, python="python", growpage={"mode": "enforce"},
                              extra_args=["--enforce-eager", "--async-scheduling"])
    assert "--compilation-config" not in chosen and "--no-async-scheduling" not in chosen  # the operator chose
    cpu, _ = serve_command("m", cpu=True, python="python", growpage={"mode": "enforce"})
    assert "--enforce-eager" in cpu and "--compilation-config" not in cpu


def test_the_floor_inside_vllm_is_counted_in_tokens_unless_base_pages_is_given():
    from growpage.vllm_plugin.settings import DEFAULT_FLOOR_TOKENS

    for block_size in (16, 32):
        config, _ = split_settings({"mode": "enforce"}, env={}, block_size=block_size)
        assert config.base_pages * block_size == DEFAULT_FLOOR_TOKENS
    assert split_settings({"base_pages": 4}, env={}, block_size=32)[0].base_pages == 4
    assert split_settings({}, env={"GROWPAGE_BASE_PAGES": "6"}, block_size=32)[0].base_pages == 6


def test_inside_vllm_a_floor_follows_attention_by_default_and_whatever_the_user_set_wins(tmp_path):
    from growpage.vllm_plugin.settings import DEFAULT_ATTENTION_COVERAGE

    default = split_settings({"mode": "enforce"}, env={}, block_size=32)[0]
    assert default.attention_coverage == DEFAULT_ATTENTION_COVERAGE
    assert DEFAULT_ATTENTION_COVERAGE > 0.0 and load_config(env={}).attention_coverage == 0.0  # vLLM's default only
    assert split_settings({"attention_coverage": 0}, env={}, block_size=32)[0].attention_coverage == 0.0
    assert split_settings({}, env={"GROWPAGE_ATTENTION_COVERAGE": "0.5"}, block_size=32)[0].attention_coverage == 0.5
    # A config file is the user's too: it beats vLLM's defaults (the floor's as well), not the other way round.
    path = tmp_path / "growpage.yaml"
    path.write_text("base_pages: 6\nattention_coverage: 0.8\n")
    config, _ = split_settings({}, env={"GROWPAGE_CONFIG": str(path)}, block_size=32)
    assert (config.base_pages, config.attention_coverage) == (6, 0.8)


@pytest.mark.parametrize(("mode", "enforce_reason", "observer_reason"), [
    ("NONE", None, None), ("PIECEWISE", None, None), ("FULL", "full_cudagraph", "full_cudagraph"),
    # vLLM's default on CUDA: decode replays full graphs, mixed batches run attention eagerly, so the
    # observer works on the steps it can see (and says how many) while enforce stays off
    ("FULL_DECODE_ONLY", "full_cudagraph", None), ("FULL_AND_PIECEWISE", "full_cudagraph", None)])
def test_full_cuda_graphs_stop_enforce_and_blind_the_observer_only_when_no_step_runs_eagerly(
        mode, enforce_reason, observer_reason):
    pytest.importorskip("vllm.config.compilation")
    from vllm.config.compilation import CUDAGraphMode

    from growpage.vllm_plugin.support import REMEDIES, cudagraph_conflict, observer_blocker, start_up_states

    compilation = types.SimpleNamespace(cudagraph_mode=CUDAGraphMode[mode])
    assert cudagraph_conflict(compilation) == enforce_reason and observer_blocker(compilation) == observer_reason
    assert cudagraph_conflict(None) is None and observer_blocker(None) is None
    assert start_up_states(False, compilation)["observer"] == (observer_reason or "active")
    assert start_up_states(True, compilation) == {"scheduler": "mode_off", "observer": "mode_off"}
    if enforce_reason:
        assert "PIECEWISE" in REMEDIES[enforce_reason]


def test_an_observer_disabled_at_start_up_exports_why_and_observes_nothing():
    observer = _observer()
    observer.disable("full_cudagraph", "test")
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(req_ids=[]))
    observer.begin_step(runner, types.SimpleNamespace(finished_req_ids=set(), scheduled_new_reqs=[]))
    assert not observer.wants_layer("model.layers.0.self_attn.attn") and not observer.ready_to_compact
    assert observer.take_report().observer_state == "full_cudagraph"


def test_workers_of_an_unwrapped_backend_report_it(monkeypatch):
    from growpage.vllm_plugin import worker_hooks

    monkeypatch.setattr(worker_hooks, "_OBSERVERS", {})
    vllm_config = types.SimpleNamespace(
        additional_config={"growpage": {"mode": "monitor", "exporter_port": -1}},
        cache_config=types.SimpleNamespace(block_size=32),
        model_config=types.SimpleNamespace(get_num_layers=lambda parallel: 30, served_model_name="m", model="m"),
        parallel_config=None, scheduler_config=types.SimpleNamespace(max_num_seqs=4),
        compilation_config=None)
    flex = types.SimpleNamespace(backend=types.SimpleNamespace(get_name=lambda: "FLEX_ATTENTION"))
    runner = types.SimpleNamespace(vllm_config=vllm_config, attn_groups=[[flex]])
    observer = worker_hooks._adopt_unobserved_worker(runner)
    assert observer is not None and observer.take_report().observer_state == "unsupported_backend"
    assert worker_hooks.observer_built() and worker_hooks.current_observer() is observer


def test_a_worker_whose_settings_cannot_be_honoured_runs_unobserved_instead_of_failing(monkeypatch):
    from growpage.vllm_plugin import worker_hooks

    monkeypatch.setattr(worker_hooks, "_OBSERVERS", {})
    vllm_config = types.SimpleNamespace(
        additional_config={"growpage": {"mode": "enforce", "base_pages": 1, "exporter_port": -1}},
        cache_config=types.SimpleNamespace(block_size=128),
        model_config=types.SimpleNamespace(get_num_layers=lambda parallel: 30, served_model_name="m", model="m"),
        parallel_config=None, scheduler_config=types.SimpleNamespace(max_num_seqs=4), compilation_config=None)
    assert worker_hooks.observer_for(vllm_config) is None  # the backend's __init__ asks this: it must not raise
    assert worker_hooks.observer_built() and worker_hooks.current_observer() is None


def test_observing_one_step_in_two_reports_every_step_and_half_of_them_observed():
    observer = _observer(observe_every_steps=2)
    new = types.SimpleNamespace(req_id="r", prompt_token_ids=list(range(20)), num_computed_tokens=0,
                                sampling_params=types.SimpleNamespace(extra_args={}))
    lengths = torch.zeros(4, dtype=torch.int32)
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(
        req_ids=["r"], block_table=types.SimpleNamespace(block_tables=[types.SimpleNamespace(
            get_device_tensor=lambda n: torch.zeros(n, 4, dtype=torch.long))])),
        query_start_loc=types.SimpleNamespace(cpu=torch.tensor([0, 1])), optimistic_seq_lens_cpu=lengths)
    observed, asked = [], []
    scheduled = [new]
    for seq_len in range(30, 40):
        lengths[0] = seq_len
        observer.begin_step(runner, types.SimpleNamespace(finished_req_ids=set(), scheduled_new_reqs=scheduled))
        scheduled = []
        observed.append(observer.step.observed)
        asked.append(observer.wants_layer("model.layers.0.self_attn.attn"))
        observer.end_step()
    assert observed == [False, True] * 5  # one step in two
    assert asked == observed  # monitor asks nothing of the attention layers between (observe_skipped_steps)
    report = observer.take_report()
    assert report.steps == 10  # the scheduler sees every step; with no cache layout known yet none was scored
    with pytest.raises(ConfigError, match="observe_every_steps"):
        PluginSettings(observe_every_steps=0)


def test_query_window_takes_a_prompts_last_queries_and_one_per_decode():
    from growpage.vllm_plugin.observer import query_window

    # request 0 ends a 10-token prompt chunk at batch tokens 0-9; request 1 decodes at token 10
    tokens, offsets = query_window([(0, 10), (10, 11)], window_tokens=4)
    assert offsets == [[3, 2, 1, 0], [0, 0, 0, 0]]
    assert tokens == [6, 7, 8, 9, 10, 10, 10, 10]
    assert query_window([(0, 1), (1, 2)], window_tokens=32) == ([0, 1], [[0], [0]])  # decodes: no window
    assert query_window([(0, 10)], window_tokens=1) == ([9], [[0]])
    assert query_window([(0, 2), (2, 9)], window_tokens=4)[1] == [[0, 0, 1, 0], [3, 2, 1, 0]]


def test_observer_scores_a_prompts_end_by_its_observation_window():
    torch.manual_seed(0)
    prompt, heads, head_dim, window = 10, 2, 8, 4
    keys = torch.randn(prompt, 1, head_dim)
    cache = transposed_cache(keys, 32, 2)
    observer = _observer(observation_window_tokens=window)
    new = types.SimpleNamespace(req_id="r1", prompt_token_ids=list(range(prompt)), num_computed_tokens=0,
                                sampling_params=types.SimpleNamespace(extra_args={}))
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(req_ids=["r1"]))
    observer.begin_step(runner, types.SimpleNamespace(finished_req_ids=set(), scheduled_new_reqs=[new]))
    observer.note_kv_write(cache, keys, torch.arange(prompt), transposed_write, num_kv_heads=1, block_size=32,
                           head_dim=head_dim)
    query = torch.randn(prompt, heads, head_dim)  # the whole prompt's queries in this step
    metadata = types.SimpleNamespace(query_start_loc=torch.tensor([0, prompt]), seq_lens=torch.tensor([prompt]),
                                     block_table=torch.tensor([[0, 1]]))
    impl = types.SimpleNamespace(num_heads=heads, num_kv_heads=1, scale=head_dim ** -0.5)
    observer.observe_layer(impl, query, cache, metadata)
    observer.flush_observations()
    logits = torch.einsum("whd,kd->hwk", query[-window:], keys[:, 0]) * impl.scale  # [heads, window, keys]
    causal = torch.arange(prompt)[None, :] > torch.arange(prompt - window, prompt)[:, None]
    probs = torch.softmax(logits.masked_fill(causal[None], float("-inf")), -1)
    expected = -(probs * probs.clamp_min(1e-30).log()).sum(-1).mean()
    assert torch.allclose(observer.step.layers[0].entropy, expected[None], atol=1e-5)
