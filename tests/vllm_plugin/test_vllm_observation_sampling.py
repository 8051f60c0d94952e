"""What the observer samples (steps, requests), and the observed step under vLLM's CUDA graphs."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
from cache_layouts import transposed_cache, transposed_write

from growpage.config import Mode
from growpage.errors import ConfigError
from growpage.vllm_plugin import graph_steps
from growpage.vllm_plugin.observer import VllmObserver, rotating_sample
from growpage.vllm_plugin.settings import (
    OBSERVE_EVERY_STEPS,
    PluginSettings,
    split_settings,
)
from growpage.vllm_plugin.wire import PAYLOAD_ATTRIBUTE, step_payload

LAYER = "model.layers.0.self_attn.attn"


def _observer(mode: str = "monitor", **plugin) -> VllmObserver:
    config, settings = split_settings({"mode": mode, "base_pages": 2, "recent_window_tokens": 8,
                                       "observed_layers": 1, **plugin}, env={}, block_size=32)
    return VllmObserver(config, settings, num_layers=1, max_requests=8)


def test_monitor_and_enforce_observe_one_step_in_four_whatever_the_admission_unless_told():
    assert _observer("monitor").sampling.stride == OBSERVE_EVERY_STEPS == 4
    assert _observer("enforce").sampling.stride == 4  # the default, auto
    # fresh readings made every step's observation no more faithful under any admission, only dearer
    for admission in ("auto", "projected", "vllm", "after_preemption"):
        assert _observer("enforce", admission=admission).sampling.stride == 4
    assert _observer("off").sampling.stride == 1  # nothing is observed: no stride to keep
    assert _observer("enforce", admission="vllm", observe_every_steps=1).sampling.stride == 1
    assert _observer("monitor", observe_every_steps=1).sampling.stride == 1  # the user's choice wins
    _, settings = split_settings({}, env={"GROWPAGE_VLLM_OBSERVE_EVERY_STEPS": "2"})
    assert settings.observation_stride(Mode.MONITOR) == 2
    with pytest.raises(ConfigError, match="must be an integer"):
        split_settings({}, env={"GROWPAGE_VLLM_OBSERVE_EVERY_STEPS": "often"})
    with pytest.raises(ConfigError, match="observe_max_requests must be an int >= 1"):
        PluginSettings(observe_max_requests=0)


def test_the_skipped_steps_queries_are_kept_only_when_told():
    assert _observer("enforce").skipped.max_steps == 0  # off by default: the fidelity profile's
    assert _observer("monitor").skipped.max_steps == 0
    assert _observer("enforce", observe_skipped_steps=True).skipped.max_steps == 3  # a stride of 4: three skipped
    assert _observer("monitor", observe_skipped_steps=True).skipped.max_steps == 3
    # every step observed: none skipped
    assert _observer("enforce", observe_every_steps=1, observe_skipped_steps=True).skipped.max_steps == 0
    _, settings = split_settings({}, env={"GROWPAGE_VLLM_OBSERVE_SKIPPED_STEPS": "yes",
                                          "GROWPAGE_VLLM_READINGS_EVERY_STEPS": "8"})
    assert settings.observe_skipped_steps and settings.readings_every_observed(4) == 2
    with pytest.raises(ConfigError, match="OBSERVE_SKIPPED_STEPS must be true or false"):
        split_settings({}, env={"GROWPAGE_VLLM_OBSERVE_SKIPPED_STEPS": "sometimes"})
    with pytest.raises(ConfigError, match="observe_skipped_steps must be true or false"):
        PluginSettings(observe_skipped_steps="on")
    with pytest.raises(ConfigError, match="readings_every_steps must be an int >= 1"):
        PluginSettings(readings_every_steps=0)


def test_rotating_sample_covers_every_request_in_turn():
    assert rotating_sample(3, 8, 0) == [0, 1, 2]  # fewer than the limit: all of them
    turns = [rotating_sample(10, 4, turn) for turn in range(5)]
    assert all(len(turn) == 4 and turn == sorted(set(turn)) for turn in turns)
    assert set().union(*turns[:3]) == set(range(10))  # ceil(10 / 4) turns see everyone
    assert turns[0] == [0, 1, 2, 3] and turns[2] == [0, 1, 8, 9]  # wraps around
    # requests whose prompt ends this step come first (their scores start there), the rest rotate
    assert rotating_sample(10, 4, 0, first=[7, 9]) == [0, 1, 7, 9]
    assert rotating_sample(10, 4, 1, first=[7, 9]) == [2, 3, 7, 9]
    assert rotating_sample(10, 2, 0, first=[1, 5, 7]) == [1, 5]  # never more than the limit


def _requests(count: int, prompt: int) -> list[types.SimpleNamespace]:
    return [types.SimpleNamespace(req_id=f"r{n}", prompt_token_ids=list(range(prompt)), num_computed_tokens=0,
                                  sampling_params=types.SimpleNamespace(extra_args={})) for n in range(count)]


def _observed_rows(observer: VllmObserver, steps: int, num_requests: int = 3) -> list[list[int]]:
    """Run ``steps`` decode steps of ``num_requests`` requests (one query each, 40 keys, sharing
    blocks: only which rows are observed matters here); the summary rows observed at each step."""
    torch.manual_seed(0)
    head_dim, seq_len = 8, 40
    keys = torch.randn(seq_len, 1, head_dim)
    cache = transposed_cache(keys, 32, 4)
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(req_ids=[f"r{n}" for n in range(num_requests)]))
    metadata = types.SimpleNamespace(query_start_loc=torch.arange(num_requests + 1),
                                     seq_lens=torch.full((num_requests,), seq_len),
                                     block_table=torch.tensor([[0, 1, 2, 3]] * num_requests))
    impl = types.SimpleNamespace(num_heads=2, num_kv_heads=1, scale=head_dim ** -0.5)
    new = _requests(num_requests, seq_len - 1)
    seen = []
    for _ in range(steps):
        observer.begin_step(runner, types.SimpleNamespace(finished_req_ids=set(), scheduled_new_reqs=new))
        new = []
        observer.note_kv_write(cache, keys[-1:], torch.tensor([seq_len - 1]), transposed_write, num_kv_heads=1,
                               block_size=32, head_dim=head_dim)
        if observer.wants_layer(LAYER):
            observer.observe_layer(impl, torch.randn(num_requests, 2, head_dim), cache, metadata)
        plan = observer.step.plan
        seen.append(sorted(t.row for t in plan.observed) if plan is not None and observer.step.observed else [])
        observer.end_step()
    return seen


def test_a_step_observes_at_most_observe_max_requests_and_every_request_in_turn():
    observer = _observer(observe_every_steps=1, observe_max_requests=2)
    seen = _observed_rows(observer, steps=3)
    assert all(len(rows) == 2 for rows in seen)
    assert set().union(*map(set, seen[:2])) == {0, 1, 2}  # two observed steps see all three
    report = observer.take_report()
    assert report.steps == report.steps_observed == 3 and set(report.readings) == {"r0", "r1", "r2"}
    steps = [observer.summaries.read([row])[0].steps_observed for row in range(3)]
    assert sorted(steps) == [2, 2, 2]  # 3 steps x 2 requests, spread evenly


def test_monitor_default_observes_one_step_in_four_and_reports_every_step():
    observer = _observer()
    seen = _observed_rows(observer, steps=8, num_requests=1)
    assert [bool(rows) for rows in seen] == [False, False, False, True] * 2
    report = observer.take_report()
    assert (report.steps, report.steps_observed) == (8, 2) and "r0" in report.readings


def _dispatcher(mode_name: str = "FULL_AND_PIECEWISE"):
    """vLLM's own V1 dispatcher with the keys it builds for ``mode_name`` at capture sizes 1-8."""
    from vllm.config import CompilationConfig, CUDAGraphMode
    from vllm.config.compilation import CompilationMode
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    mode = CUDAGraphMode[mode_name]
    compilation = CompilationConfig(mode=CompilationMode.VLLM_COMPILE, cudagraph_mode=mode,
                                    cudagraph_capture_sizes=[1, 2, 4, 8], max_cudagraph_capture_size=8)
    compilation.set_splitting_ops_for_v1(all2all_backend="naive")
    vllm_config = types.SimpleNamespace(compilation_config=compilation, num_speculative_tokens=0, lora_config=None,
                                        scheduler_config=types.SimpleNamespace(max_num_seqs=8))
    dispatcher = CudagraphDispatcher(vllm_config)
    dispatcher.initialize_cudagraph_keys(mode, 1)
    return dispatcher


def _next_step(observer: VllmObserver) -> None:
    """End the step in progress (if any) and begin the next one; one request ``r0`` is tracked."""
    if observer.step.running:
        observer.end_step()
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(req_ids=["r0"]))
    new = [] if observer.requests else _requests(1, 8)
    observer.begin_step(runner, types.SimpleNamespace(finished_req_ids=set(), scheduled_new_reqs=new))


def test_the_due_step_dispatches_a_piecewise_graph_where_vllm_would_replay_a_full_one():
    pytest.importorskip("vllm")
    from vllm.config import CUDAGraphMode

    dispatcher = _dispatcher()
    original = type(dispatcher).dispatch
    observer = _observer()  # monitor: one step in four is due
    dispatch = graph_steps._wrap_v1_dispatch(original, lambda: observer)
    modes = []
    for _ in range(8):
        _next_step(observer)
        modes.append(dispatch(dispatcher, 4, uniform_decode=True)[0])
    full, piecewise = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE
    assert modes == [full, full, full, piecewise] * 2  # only the observed step leaves its full graph
    observer.end_step()
    assert dispatch(dispatcher, 4, uniform_decode=True)[0] == full  # outside a step (capture, warm-up): vLLM's
    # a mode agreed across data-parallel ranks stands
    assert graph_steps.without_full(None, {full}, full) is None
    assert graph_steps.without_full({piecewise}, None, full) == {piecewise, full}


def test_under_full_decode_only_the_due_step_runs_eagerly():
    pytest.importorskip("vllm")
    from vllm.config import CUDAGraphMode

    dispatcher = _dispatcher("FULL_DECODE_ONLY")  # no piecewise graphs to fall back on
    observer = _observer(observe_every_steps=1)
    dispatch = graph_steps._wrap_v1_dispatch(type(dispatcher).dispatch, lambda: observer)
    assert dispatch(dispatcher, 4, uniform_decode=True)[0] == CUDAGraphMode.FULL  # no step yet
    _next_step(observer)
    assert dispatch(dispatcher, 4, uniform_decode=True)[0] == CUDAGraphMode.NONE


def test_model_runner_v2_swaps_a_full_descriptor_for_eager_on_the_due_step():
    pytest.importorskip("vllm")
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

    full = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.FULL, num_tokens=8, num_reqs=8, uniform_token_count=1)

    def vllm_dispatch(manager, num_reqs, num_tokens, uniform_token_count, num_active_loras, max_query_len=None):
        return full

    observer = _observer(observe_every_steps=2)
    dispatch = graph_steps._wrap_v2_dispatch(vllm_dispatch, lambda: observer)
    _next_step(observer)
    assert dispatch(None, 5, 5, 1, 0) is full  # step 1 of 2: not due
    _next_step(observer)
    eager = dispatch(None, 5, 5, 1, 0)
    assert eager.cg_mode == CUDAGraphMode.NONE and (eager.num_tokens, eager.num_reqs) == (5, 5)
    assert dataclasses.replace(eager, cg_mode=CUDAGraphMode.FULL) != full  # the batch's own size, unpadded


def test_a_fault_while_asking_the_observer_leaves_vllms_choice():
    pytest.importorskip("vllm")
    from vllm.config import CUDAGraphMode

    def broken():
        raise RuntimeError("observer gone")

    dispatcher = _dispatcher()
    dispatch = graph_steps._wrap_v1_dispatch(type(dispatcher).dispatch, broken)
    assert dispatch(dispatcher, 4, uniform_decode=True)[0] == CUDAGraphMode.FULL


@pytest.mark.parametrize(("mode", "method", "forced"), [
    ("enforce", "growpage", True), ("monitor", "growpage", True),
    ("enforce", "streaming_llm", False)])  # a recency cap keeps no scores: nothing to anchor
def test_the_step_that_ends_a_prompt_is_observed_whatever_the_stride(mode, method, forced):
    """Prompt-anchored scores start at the prompt's last token: a compaction of a prompt whose end
    went unobserved would keep its newest tokens, not what the question looked at (measured: growth-
    aware admission observing one step in four answered 11 of 16 retrieval questions where every
    other variant answered 16)."""
    observer = _observer(mode, admission="projected", method=method)
    assert observer.sampling.stride == 4
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(req_ids=["r0"]))
    step = types.SimpleNamespace
    chunks = [(_requests(1, 40), step(req_ids=[], num_computed_tokens=[]), 24),  # the prompt's first chunk
              ([], step(req_ids=["r0"], num_computed_tokens=[24]), 16),  # its last 16 tokens
              ([], step(req_ids=["r0"], num_computed_tokens=[40]), 1)]  # a decode step
    observed = []
    for new, cached, tokens in chunks:
        observer.begin_step(runner, step(finished_req_ids=set(), scheduled_new_reqs=new, scheduled_cached_reqs=cached,
                                         num_scheduled_tokens={"r0": tokens}))
        observed.append(observer.step.observed)
        observer.end_step()
    assert observed == [False, forced, False]  # steps 1-3 of 4: only the prompt's end, and only when scored


@pytest.mark.parametrize("mode", ["enforce", "monitor"])
def test_with_room_for_every_request_only_a_prompts_end_is_observed(mode):
    """The scheduler says the pool holds every request at its full length: nothing will be
    compressed before another request arrives, so a due step goes unobserved, but a prompt's end,
    which later keep sets rank by, still is. Monitor's workers take the forecast's word as
    enforce's take the enforcer's."""
    observer = _observer(mode, observe_every_steps=1)
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(req_ids=["r0"]))
    step = types.SimpleNamespace
    steps = [(_requests(1, 40), step(req_ids=[], num_computed_tokens=[]), 24, True),  # the prompt's first chunk
             ([], step(req_ids=["r0"], num_computed_tokens=[24]), 16, True),  # its end
             ([], step(req_ids=["r0"], num_computed_tokens=[40]), 1, True),  # a decode step
             ([], step(req_ids=["r0"], num_computed_tokens=[41]), 1, False)]  # another request came: no room
    observed = []
    for new, cached, tokens, room in steps:
        output = step(finished_req_ids=set(), scheduled_new_reqs=new, scheduled_cached_reqs=cached,
                      num_scheduled_tokens={"r0": tokens})
        setattr(output, PAYLOAD_ATTRIBUTE, step_payload({}, {}, prompts_only=room))
        observer.begin_step(runner, output)
        observed.append(observer.step.observed)
        observer.end_step()
    assert observed == [False, True, False, True]


def _decode_with_skipped_steps(observer: VllmObserver, queries: list[torch.Tensor], keys: torch.Tensor,
                               prompt: int) -> list[torch.Tensor | None]:
    """One request ``r0``: the step that ends its ``prompt`` (its last query, ``queries[0]``), then a
    decode step per further query, each seeing one more key of ``keys``; each step's compaction
    scores (``[keys]``), None where the step scored nothing."""
    head_dim = keys.shape[-1]
    cache = transposed_cache(keys, 32, 2)
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(req_ids=["r0"]))
    impl = types.SimpleNamespace(num_heads=queries[0].shape[1], num_kv_heads=1, scale=head_dim ** -0.5)
    scores = []
    for step, query in enumerate(queries):
        new = _requests(1, prompt) if step == 0 else []
        cached = types.SimpleNamespace(req_ids=["r0"] if step else [], num_computed_tokens=[prompt + step - 1])
        observer.begin_step(runner, types.SimpleNamespace(finished_req_ids=set(), scheduled_new_reqs=new,
                                                          scheduled_cached_reqs=cached,
                                                          num_scheduled_tokens={"r0": prompt if step == 0 else 1}))
        observer.note_kv_write(cache, keys[:1], torch.tensor([0]), transposed_write, num_kv_heads=1, block_size=32,
                               head_dim=head_dim)
        metadata = types.SimpleNamespace(query_start_loc=torch.tensor([0, 1]), seq_lens=torch.tensor([prompt + step]),
                                         block_table=torch.tensor([[0, 1]]))
        if observer.wants_layer(LAYER):
            observer.observe_layer(impl, query, cache, metadata)
        observer.flush_observations()
        plan = observer.step.plan
        scores.append(plan.token_mass[0].clone() if plan is not None and plan.token_mass is not None else None)
        observer.end_step()
    return scores


def _attention(query: torch.Tensor, keys: torch.Tensor, seen: int) -> torch.Tensor:
    """``[len(keys)]`` one query's attention over the first ``seen`` keys, mean over its heads."""
    logits = query[0] @ keys[:seen, 0].T * keys.shape[-1] ** -0.5  # [heads, seen]
    return torch.nn.functional.pad(torch.softmax(logits, -1).mean(0), (0, len(keys) - seen))


@pytest.mark.parametrize("mode", ["monitor", "enforce"])
def test_the_observed_step_scores_the_skipped_steps_queries_each_over_the_keys_it_saw(mode):
    """One step in four is scored, but the keep sets (and the forecast's needs) rank by every step's
    attention: the skipped steps' newest queries join the observed step's window, each causal at
    its own position (a query taken two steps back does not see the two newest keys)."""
    torch.manual_seed(3)
    prompt, heads, head_dim = 12, 2, 8
    keys = torch.randn(prompt + 3, 1, head_dim)
    queries = [torch.randn(1, heads, head_dim) for _ in range(4)]  # the prompt's end, then three decodes
    observer = _observer(mode, admission="projected", observe_skipped_steps=True)
    assert observer.sampling.stride == 4 and observer.skipped.max_steps == 3
    scores = _decode_with_skipped_steps(observer, queries, keys, prompt)
    assert [s is not None for s in scores] == [True, False, False, True]  # the prompt's end, then one in four
    expected = torch.stack([_attention(queries[n], keys, prompt + n) for n in (1, 2, 3)]).mean(0)
    assert torch.allclose(scores[3][:len(keys)], expected, atol=1e-5)
    assert torch.all(scores[3][prompt + 1:] < expected[prompt + 1:] + 1e-6)  # the newest keys: the newest query alone

    blind = _observer(mode, admission="projected")  # the default
    unseen = _decode_with_skipped_steps(blind, queries, keys, prompt)
    assert torch.allclose(unseen[3][:len(keys)], _attention(queries[3], keys, prompt + 3), atol=1e-5)
    assert not blind.wants_layer(LAYER)  # between steps nothing is asked of the attention layers



@pytest.mark.parametrize(("stride", "readings_every_steps", "refreshed_at"), [
    (4, None, [4, 8, 16, 24, 32]),  # the default at a stride of 4: every other observed step, 8 engine
    (1, None, [1, 8, 16, 24, 32]),  # steps apart, as when every step is observed
    (4, 32, [4, 32]),  # the cadence before: once in 8 observed steps, a block behind a decoding request
    (3, 8, [3, 6, 12, 18, 24, 30]),  # never further apart than asked: every other observed step
])
def test_attention_needs_reach_the_scheduler_every_readings_every_steps_engine_steps(stride, readings_every_steps,
                                                                                     refreshed_at):
    """A floor follows its request's attention need, which grows as the request decodes: the need
    is read again every ``readings_every_steps`` engine steps at most whatever the stride, by default
    every 8 (the first observation's need is sent at once)."""
    cadence = {} if readings_every_steps is None else {"readings_every_steps": readings_every_steps}
    observer = _observer(observe_every_steps=stride, **cadence)
    torch.manual_seed(0)
    head_dim, seq_len = 8, 40
    keys = torch.randn(seq_len, 1, head_dim)
    cache = transposed_cache(keys, 32, 4)
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(req_ids=["r0"]))
    metadata = types.SimpleNamespace(query_start_loc=torch.arange(2), seq_lens=torch.tensor([seq_len]),
                                     block_table=torch.tensor([[0, 1, 2, 3]]))
    impl = types.SimpleNamespace(num_heads=2, num_kv_heads=1, scale=head_dim ** -0.5)
    new = _requests(1, seq_len - 1)
    refreshed = []
    for step in range(1, 33):
        observer.begin_step(runner, types.SimpleNamespace(finished_req_ids=set(), scheduled_new_reqs=new))
        new = []
        observer.note_kv_write(cache, keys[-1:], torch.tensor([seq_len - 1]), transposed_write, num_kv_heads=1,
                               block_size=32, head_dim=head_dim)
        if observer.wants_layer(LAYER):
            observer.observe_layer(impl, torch.randn(1, 2, head_dim), cache, metadata)
        observer.end_step()
        if observer.take_report().attention_tokens:
            refreshed.append(step)
    assert refreshed == refreshed_at
