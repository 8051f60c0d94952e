"""Enforce without an engine: accounting, keep sets, moving K/V, the scheduler-side enforcer."""

from __future__ import annotations

import types

import pytest
import torch
from cache_layouts import probed, row_major_write, transposed_write

from growpage.core.admission import StepCostFit
from growpage.core.controller import GrowthController
from growpage.core.methods import build_method
from growpage.core.policy import Action
from growpage.core.step_control import StepPool, enforceable_action, protected_tokens
from growpage.vllm_plugin import keys as kv_keys
from growpage.vllm_plugin.blocks import pages_to_finish, room_for_all
from growpage.vllm_plugin.compaction import (
    choose_keep,
    physical_slot_mapping,
    physical_slots,
    slot_positions,
)
from growpage.vllm_plugin.compactor import CompactionError, WorkerCompactor
from growpage.vllm_plugin.keys import move_tokens
from growpage.vllm_plugin.scheduler_requests import VLLM_ACTIONS, SchedulerEnforcer
from growpage.vllm_plugin.settings import split_settings
from growpage.vllm_plugin.wire import (
    DROPPED_ATTRIBUTE,
    PAYLOAD_ATTRIBUTE,
    PAYLOAD_VERSION,
    CompactionPlan,
    StepPayload,
)
from support.factories import Driver, make_manager

BLOCK = 4


def test_protected_tokens_cover_the_sinks_or_the_shared_prefix_and_the_recent_window():
    assert protected_tokens(16, shared_prefix_tokens=0, sink_tokens=2, recent_window_tokens=3) == 5
    assert protected_tokens(16, shared_prefix_tokens=8, sink_tokens=2, recent_window_tokens=3) == 11
    assert protected_tokens(4, shared_prefix_tokens=0, sink_tokens=2, recent_window_tokens=3) == 4


def test_slot_positions_follow_survivors_then_contiguous_tail():
    assert slot_positions(None, 5, 0).tolist() == [0, 1, 2, 3, 4]
    kept = torch.tensor([0, 1, 6, 7])  # 4 dropped (2..5)
    assert slot_positions(kept, 6, 4).tolist() == [0, 1, 6, 7, 8, 9]


def test_keep_set_prefers_attention_then_recency_and_never_drops_protected():
    positions = torch.arange(12)
    scores = torch.zeros(12)
    scores[5] = 1.0  # a heavy hitter
    keep = choose_keep(positions, scores, 8, 12, shared_prefix_tokens=0, sink_tokens=2, recent_window_tokens=4)
    assert keep.tolist() == [0, 1, 5, 7, 8, 9, 10, 11]  # ties among the rest: the older go first
    recency = choose_keep(positions, None, 8, 12, shared_prefix_tokens=0, sink_tokens=2, recent_window_tokens=4)
    assert recency.tolist() == [0, 1, 6, 7, 8, 9, 10, 11]
    shared = choose_keep(positions, scores, 8, 12, shared_prefix_tokens=4, sink_tokens=2, recent_window_tokens=4)
    assert shared.tolist() == [0, 1, 2, 3, 8, 9, 10, 11]  # the shared block stays, even over a heavy hitter
    assert choose_keep(positions, scores, 5, 12, shared_prefix_tokens=0, sink_tokens=2, recent_window_tokens=4) is None


def test_per_head_keep_sets_follow_each_heads_scores_and_protect_the_same_tokens():
    positions = torch.arange(12)
    scores = torch.zeros(2, 12)
    scores[0, 5], scores[1, 8] = 1.0, 1.0  # each KV head has its own heavy hitter
    keep = choose_keep(positions, scores, 7, 12, shared_prefix_tokens=0, sink_tokens=2, recent_window_tokens=4)
    assert keep.tolist() == [[0, 1, 5, 8, 9, 10, 11], [0, 1, 7, 8, 9, 10, 11]]
    # after a per-head compaction each head's slots hold its own positions; the tail is shared
    kept = torch.tensor([[0, 1, 5, 8], [0, 1, 7, 8]])
    assert slot_positions(kept, 6, 5).tolist() == [[0, 1, 5, 8, 9, 10], [0, 1, 7, 8, 9, 10]]
    again = choose_keep(slot_positions(kept, 6, 5), None, 5, 11, shared_prefix_tokens=0, sink_tokens=2,
                        recent_window_tokens=2)  # nothing scored: each head keeps its newest
    assert again.tolist() == [[0, 1, 3, 4, 5], [0, 1, 3, 4, 5]]
    assert choose_keep(positions, scores, 5, 12, shared_prefix_tokens=0, sink_tokens=2, recent_window_tokens=4) is None


def test_a_shared_share_of_per_head_keep_sets_keeps_what_the_request_ranks_highest_in_every_head():
    positions = torch.arange(12)
    scores = torch.zeros(2, 12)
    scores[0, 5] = 3.0  # the request's needle: only head 0's readers saw it
    scores[0, 6], scores[1, 7], scores[1, 8] = 1.0, 1.0, 0.5  # each head's own hitters
    alone = choose_keep(positions, scores, 8, 12, shared_prefix_tokens=0, sink_tokens=2, recent_window_tokens=4)
    assert 5 not in alone[1].tolist()  # head 1 ranks alone: its readers never looked at the needle
    mixed = choose_keep(positions, scores, 8, 12, shared_prefix_tokens=0, sink_tokens=2, recent_window_tokens=4,
                        shared_fraction=0.5)  # 2 unprotected survivors per head: 1 in common
    assert mixed.tolist() == [[0, 1, 5, 6, 8, 9, 10, 11], [0, 1, 5, 7, 8, 9, 10, 11]]
    same = choose_keep(positions, scores, 8, 12, shared_prefix_tokens=0, sink_tokens=2, recent_window_tokens=4,
                       shared_fraction=1.0)  # all in common: the request's ranking in every head
    request = choose_keep(positions, scores.mean(0), 8, 12, shared_prefix_tokens=0, sink_tokens=2,
                          recent_window_tokens=4)
    assert same.tolist() == [request.tolist()] * 2
    # after a per-head compaction a head that dropped a common token fills its place by its own ranking
    kept = torch.tensor([[0, 1, 5, 8], [0, 1, 7, 8]])
    later = slot_positions(kept, 8, 5)  # [[0, 1, 5, 8, 9..12], [0, 1, 7, 8, 9..12]]
    again = choose_keep(later, torch.tensor([[0., 0, 4, 0, 0, 0, 0, 0], [0., 0, 1, 2, 0, 0, 0, 0]]), 6, 13,
                        shared_prefix_tokens=0, sink_tokens=2, recent_window_tokens=2, shared_fraction=1.0)
    assert [later[h, again[h]].tolist() for h in range(2)] == [[0, 1, 5, 8, 11, 12], [0, 1, 7, 8, 11, 12]]


def test_physical_slots_use_the_block_row():
    row = torch.tensor([7, 3, 9])
    assert physical_slots(row, torch.tensor([0, 5, 9]), BLOCK).tolist() == [28, 13, 37]
    # a compacted request (dropped 6): logical 10, 11 live in physical 4, 5 (block 3, offsets 0, 1)
    assert physical_slot_mapping(torch.tensor([10, 11]), 6, row, BLOCK).tolist() == [12, 13]


@pytest.mark.parametrize("write", [transposed_write, row_major_write], ids=["vec-layout", "row-major"])
def test_move_tokens_copies_keys_and_values_in_either_layout(write):
    torch.manual_seed(0)
    num_blocks, heads, head_dim = 4, 2, 4
    cache = torch.randn(num_blocks, heads, BLOCK, 2 * head_dim)
    before = cache.clone()
    layout = probed(write, num_blocks, heads, BLOCK, head_dim)
    src, dst = torch.tensor([5, 14, 2]), torch.tensor([1, 2, 3])  # overlapping: slot 2 is read and written
    move_tokens(cache, src, dst, layout)

    def token(c: torch.Tensor, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        return kv_keys.read_token(c, slot, layout), kv_keys.read_token(c, slot, layout, value=True)

    for s, d in zip(src.tolist(), dst.tolist(), strict=True):
        for got, want in zip(token(cache, d), token(before, s), strict=True):
            assert torch.equal(got, want)
    untouched = [slot for slot in range(num_blocks * BLOCK) if slot not in dst.tolist()]
    for slot in untouched:
        assert all(torch.equal(a, b) for a, b in zip(token(cache, slot), token(before, slot), strict=True))


@pytest.mark.parametrize("layers", [(0, 1), (0, 1, 3)], ids=["strided", "offsets"])
@pytest.mark.parametrize("write", [transposed_write, row_major_write], ids=["vec-layout", "row-major"])
def test_per_head_moves_copy_each_heads_own_slots_and_leave_the_other_heads(write, layers):
    torch.manual_seed(0)
    num_blocks, heads, head_dim = 4, 3, 4
    # layers carved out of one allocation: evenly spaced they move as one strided view, unevenly
    # (0, 1, 3) through per-element offsets
    storage = torch.randn(4, num_blocks, heads, BLOCK, 2 * head_dim)
    caches = [storage[layer] for layer in layers]
    before = [c.clone() for c in caches]
    layout = probed(write, num_blocks, heads, BLOCK, head_dim)
    src = torch.tensor([[5, 6], [9, 2], [2, 3]])  # head h moves src[h] into dst[h]
    dst = torch.tensor([[1, 2], [1, 2], [1, 2]])
    kv_keys.move_tokens_in_layers(caches, src, dst, layout)
    for cache, old in zip(caches, before, strict=True):
        for head in range(heads):
            for slot in range(num_blocks * BLOCK):
                moved = dst[head].tolist().index(slot) if slot in dst[head].tolist() else None
                source = slot if moved is None else int(src[head, moved])
                for value in (False, True):
                    got = kv_keys.read_token(cache, slot, layout, value=value)[head]
                    assert torch.equal(got, kv_keys.read_token(old, source, layout, value=value)[head])


def test_quantize_and_defer_degrade_to_what_vllm_can_do():
    def vllm(decided: Action, can_evict: bool, free: int) -> Action:
        return enforceable_action(decided, can_evict=can_evict, free_pages=free, enforceable=VLLM_ACTIONS)

    assert vllm(Action.QUANTIZE, True, 5) is Action.EVICT
    assert vllm(Action.QUANTIZE, False, 5) is Action.ALLOCATE
    assert vllm(Action.DEFER, False, 0) is Action.PREEMPT
    assert vllm(Action.EVICT, True, 0) is Action.EVICT
    assert vllm(Action.EVICT, False, 3) is Action.ALLOCATE
    assert vllm(Action.ALLOCATE, True, 1) is Action.ALLOCATE


# ---- the scheduler-side enforcer against stand-ins of vLLM's scheduler objects ------------------------
class _Block:
    def __init__(self, block_id: int, ref_cnt: int = 1, block_hash=None):
        self.block_id, self.ref_cnt, self.block_hash = block_id, ref_cnt, block_hash


class _Pool:
    def __init__(self, num_free: int):
        self.free: list[int] = list(range(100, 100 + num_free))
        self.unhashed: list[int] = []

    def get_num_free_blocks(self) -> int:
        return len(self.free)

    def free_blocks(self, blocks) -> None:
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free.append(block.block_id)

    def _maybe_evict_cached_block(self, block) -> bool:
        self.unhashed.append(block.block_id)
        block.block_hash = None
        return True


def _scheduler(blocks: list[_Block], num_computed: int, prompt: int = 2, namespace: str | None = None,
               max_tokens: int | None = None, waiting: list | None = None):
    """One running request ``r`` (``max_tokens`` None: a stand-in without it, whose length is unknown)."""
    request = types.SimpleNamespace(
        request_id="r", num_computed_tokens=num_computed, num_prompt_tokens=prompt, num_tokens=num_computed + 1,
        spec_token_ids=[], sampling_params=types.SimpleNamespace(
            extra_args={"growpage_namespace": namespace} if namespace else {}))
    if max_tokens is not None:
        request.max_tokens = max_tokens
    single = types.SimpleNamespace(req_to_blocks={"r": blocks}, num_cached_block={"r": len(blocks)})
    manager = types.SimpleNamespace(block_pool=_Pool(10),
                                    coordinator=types.SimpleNamespace(single_type_managers=[single]))
    # vLLM's cache spec: 256 bytes per token per layer, two layers -> 512 bytes of KV per token
    spec = types.SimpleNamespace(page_size_bytes=BLOCK * 256, block_size=BLOCK)
    kv_cache_config = types.SimpleNamespace(kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=spec,
                                                                                   layer_names=["l0", "l1"])])
    return types.SimpleNamespace(running=[request], waiting=waiting or [], kv_cache_manager=manager,
                                 kv_cache_config=kv_cache_config), request


class _Decisions:
    """A stats listener keeping the decisions the controller records (what the exporter counts)."""

    def __init__(self):
        self.events = []

    def on_admit(self, event):
        pass

    def on_decision(self, event):
        self.events.append(event)

    def on_finish(self, event):
        pass


def _enforcer(*, gate: bool = False, step_costs: StepCostFit | None = None, **overrides) -> SchedulerEnforcer:
    config, _ = split_settings({"mode": "enforce", "base_pages": 3, "sink_tokens": 1,
                                "recent_window_tokens": 2, "growth_coefficient": 0,
                                "lts_grow_threshold": 100, **overrides}, env={}, block_size=BLOCK)
    enforcer = SchedulerEnforcer(GrowthController(config, num_layers=None), compression_gate=gate,
                                 step_costs=step_costs)
    enforcer.decisions = _Decisions()
    enforcer.controller.stats.add_listener(enforcer.decisions)
    enforcer.on_worker_ready(True)
    return enforcer


def test_enforcer_evicts_at_the_cap_frees_tail_blocks_and_plans_the_move():
    blocks = [_Block(0, block_hash="h0"), _Block(1), _Block(2)]
    scheduler, request = _scheduler(blocks, num_computed=12)
    enforcer = _enforcer()
    enforcer.before_schedule(scheduler)
    assert [b.block_id for b in blocks] == [0, 1] and 2 in scheduler.kv_cache_manager.block_pool.free
    assert scheduler.kv_cache_manager.block_pool.unhashed == [0]  # unhashed before it is rewritten
    assert getattr(request, DROPPED_ATTRIBUTE) == 4
    output = types.SimpleNamespace()
    enforcer.after_schedule(scheduler, output)
    payload = getattr(output, PAYLOAD_ATTRIBUTE)
    assert payload.plans["r"] == CompactionPlan(physical_tokens=12, keep_tokens=8, logical_length=12,
                                                shared_prefix_tokens=0, dropped=4, prompt_tokens=2)
    assert payload.dropped == {"r": 4} and payload.version == PAYLOAD_VERSION
    decisions = enforcer.decisions.events
    assert [d.kind for d in decisions] == ["evict"] and decisions[0].enforced
    # 12 tokens in, 8 kept, at 512 bytes per token (vLLM's own cache spec)
    assert (decisions[0].bytes_in, decisions[0].bytes_out) == (12 * 512, 8 * 512)
    enforcer.requests.preempted(request)  # vLLM recomputes it from scratch: physical = logical again
    assert getattr(request, DROPPED_ATTRIBUTE) == 0


def test_with_room_for_every_request_at_its_full_length_the_enforcer_grows_and_tells_the_workers():
    # r holds 3 blocks (12 tokens) and ends at 2 + 18 = 20 tokens: 2 blocks more, 10 free
    blocks = [_Block(0), _Block(1), _Block(2)]
    scheduler, request = _scheduler(blocks, num_computed=12, max_tokens=18)
    enforcer = _enforcer()
    enforcer.before_schedule(scheduler)
    assert len(blocks) == 3 and not getattr(request, DROPPED_ATTRIBUTE, 0)
    assert [(d.kind, d.reason) for d in enforcer.decisions.events] == [("allocate", "room_for_all")]
    output = types.SimpleNamespace()
    enforcer.after_schedule(scheduler, output)
    payload = getattr(output, PAYLOAD_ATTRIBUTE)
    assert payload.prompts_only and payload.plans == {}


def test_a_waiting_request_the_pool_could_not_also_hold_keeps_compression_on():
    # the same r, and a waiting prompt of 30 tokens asking 8 more: 10 blocks, 2 + 10 > 10 free
    waiting = types.SimpleNamespace(request_id="w", num_prompt_tokens=30, max_tokens=8)
    blocks = [_Block(0), _Block(1), _Block(2)]
    scheduler, request = _scheduler(blocks, num_computed=12, max_tokens=18, waiting=[waiting])
    enforcer = _enforcer()
    enforcer.before_schedule(scheduler)
    assert [d.kind for d in enforcer.decisions.events] == ["evict"] and getattr(request, DROPPED_ATTRIBUTE) == 4
    output = types.SimpleNamespace()
    enforcer.after_schedule(scheduler, output)
    assert not getattr(output, PAYLOAD_ATTRIBUTE).prompts_only


def _waiting_scheduler(dropped: int = 0):
    """r at its cap (3 blocks, 12 tokens) while a 30-token prompt waits that the pool cannot also hold."""
    waiting = types.SimpleNamespace(request_id="w", num_prompt_tokens=30, max_tokens=8)
    blocks = [_Block(0), _Block(1), _Block(2)]
    scheduler, request = _scheduler(blocks, num_computed=12 + dropped, max_tokens=18 + dropped, waiting=[waiting])
    if dropped:
        setattr(request, DROPPED_ATTRIBUTE, dropped)
    return scheduler, request, blocks


def test_with_the_compression_gate_idle_the_enforcer_grows_where_it_would_compress_and_observes_prompts_only():
    scheduler, request, blocks = _waiting_scheduler()
    enforcer = _enforcer(gate=True)
    enforcer.before_schedule(scheduler)
    assert len(blocks) == 3 and not getattr(request, DROPPED_ATTRIBUTE, 0)  # the KV is vLLM's own
    assert [(d.kind, d.reason) for d in enforcer.decisions.events] == [("allocate", "would_not_pay")]
    assert enforcer.compression_idle and not enforcer.degraded_total
    output = types.SimpleNamespace()
    enforcer.after_schedule(scheduler, output)
    assert getattr(output, PAYLOAD_ATTRIBUTE).prompts_only


def test_an_idle_step_with_no_boundary_plans_nothing_and_the_next_boundary_is_still_decided():
    """Most idle steps have no boundary and no prompt just cached: the enforcer skips the controller
    there, and must not skip the boundary that comes next."""
    scheduler, request, blocks = _waiting_scheduler()
    request.num_computed_tokens = 10  # mid-block: 10 of its 12 slots
    enforcer = _enforcer(gate=True)
    enforcer.before_schedule(scheduler)  # its first decode step settles its prompt (2 tokens: nothing to compress)
    enforcer.before_schedule(scheduler)
    assert enforcer.compression_idle and enforcer.decisions.events == [] and len(blocks) == 3
    request.num_computed_tokens = 12  # its blocks are full: the next token needs a page
    enforcer.before_schedule(scheduler)
    assert [(d.kind, d.reason) for d in enforcer.decisions.events] == [("allocate", "would_not_pay")]


def test_the_gate_opens_once_compactions_hold_a_request_of_pages_free():
    # r's earlier compactions dropped 12 tokens: 3 pages held free, as many as the one request holds
    scheduler, request, blocks = _waiting_scheduler(dropped=12)
    enforcer = _enforcer(gate=True)
    enforcer.before_schedule(scheduler)
    assert [d.kind for d in enforcer.decisions.events] == ["evict"] and not enforcer.compression_idle
    output = types.SimpleNamespace()
    enforcer.after_schedule(scheduler, output)
    assert not getattr(output, PAYLOAD_ATTRIBUTE).prompts_only


def _measured_steps() -> StepCostFit:
    """An engine whose steps cost 30 ms + 1 ms a request + 1 ms a prefilled token, as its meter fits them."""
    fit = StepCostFit()
    for step in range(40):
        requests, tokens = 1 + step % 4, (1 + step % 4) + (20 if step % 3 == 0 else 0)
        fit.record(requests=requests, tokens=tokens, seconds=0.03 + 0.001 * requests + 0.001 * (tokens - requests))
    return fit


def _fitted(fixed_s: float, per_request_s: float) -> StepCostFit:
    """An engine whose steps cost ``fixed_s`` + ``per_request_s`` a request + 1 ms a prefilled token."""
    fit = StepCostFit()
    for step in range(40):
        requests, tokens = 1 + step % 4, (1 + step % 4) + (20 if step % 3 == 0 else 0)
        fit.record(requests=requests, tokens=tokens,
                   seconds=fixed_s + per_request_s * requests + 0.001 * (tokens - requests))
    return fit


def test_the_enforcer_prices_the_wider_batch_a_compressed_prompt_buys_from_its_engines_own_steps():
    # one request running and one waiting: one more in the batch nearly doubles the tokens per second
    # of a step with a dominant fixed part, and adds nothing where every request costs its own time
    for fit, pays in ((None, True), (_fitted(0.03, 0.001), True), (_fitted(0.0005, 0.02), False)):
        scheduler, _, _ = _waiting_scheduler()
        enforcer = _enforcer(gate=True, step_costs=fit)
        pools: list[StepPool] = []
        enforcer.controller.plan_step = _recording(enforcer.controller.plan_step, pools)
        enforcer.before_schedule(scheduler)
        assert pools[-1].compression_idle and pools[-1].wider_batch_pays is pays, fit


def _recording(plan_step, pools: list):
    """``plan_step`` that first records the pool each call sees."""
    def recorded(pool, views, **kwargs):
        pools.append(pool)
        return plan_step(pool, views, **kwargs)
    return recorded


def test_only_a_preemption_whose_recompute_outweighs_the_work_opens_the_gate():
    cheap, dear = (types.SimpleNamespace(num_tokens=tokens) for tokens in (50, 5000))
    for preempted, opens in ((cheap, False), (dear, True)):
        scheduler, _, _ = _waiting_scheduler()
        enforcer = _enforcer(gate=True, step_costs=_measured_steps())
        enforcer.note_preemption(preempted)  # 50 ms or 5 s to recompute, against 2 x 3 % of 64 steps of ~31 ms
        enforcer.before_schedule(scheduler)
        assert [d.kind for d in enforcer.decisions.events] == (["evict"] if opens else ["allocate"]), preempted


def test_room_for_all_counts_each_request_at_its_full_length_and_never_reads_a_queue_longer_than_the_pool():
    def request(request_id, prompt, max_tokens, computed=0, dropped=0):
        return types.SimpleNamespace(request_id=request_id, num_prompt_tokens=prompt, max_tokens=max_tokens,
                                     num_computed_tokens=computed, **{DROPPED_ATTRIBUTE: dropped})

    # r: 2 + 18 = 20 tokens, 5 blocks, holds 3; compacted by 8 it ends in 3 blocks, needing none more
    held = {"r": [_Block(0), _Block(1), _Block(2)]}
    assert pages_to_finish(request("r", 2, 18, 12), 3, BLOCK) == 2
    assert pages_to_finish(request("r", 2, 18, 12, dropped=8), 3, BLOCK) == 0
    assert pages_to_finish(request("w", 2, 18, dropped=8), 0, BLOCK) == 5  # preempted: recomputed whole
    running = [request("r", 2, 18, 12)]
    assert room_for_all(7, running, [request("w", 2, 18)], held, BLOCK)  # 2 + 5
    assert not room_for_all(6, running, [request("w", 2, 18)], held, BLOCK)

    class LongQueue(list):
        def __iter__(self):
            raise AssertionError("a queue longer than the free blocks is not read")

    assert not room_for_all(3, running, LongQueue([request(f"w{n}", 2, 2) for n in range(4)]), held, BLOCK)


def test_enforcer_never_rewrites_shared_blocks_and_allocates_instead():
    blocks = [_Block(0, ref_cnt=2), _Block(1, ref_cnt=2), _Block(2)]
    scheduler, request = _scheduler(blocks, num_computed=12)
    enforcer = _enforcer()
    enforcer.before_schedule(scheduler)
    assert len(blocks) == 3 and not getattr(request, DROPPED_ATTRIBUTE, 0)
    output = types.SimpleNamespace()
    enforcer.after_schedule(scheduler, output)
    # eviction cannot free a block, so the contract falls back to quantizing, which vLLM cannot do
    assert [d.kind for d in enforcer.decisions.events] == ["allocate"]
    assert enforcer.degraded_total == {("quantize", "allocate"): 1}


def test_enforcer_waits_for_the_prefill_and_for_a_ready_worker():
    blocks = [_Block(0), _Block(1), _Block(2)]
    scheduler, request = _scheduler(blocks, num_computed=12, prompt=20)  # still prefilling
    enforcer = _enforcer()
    enforcer.before_schedule(scheduler)
    assert len(blocks) == 3
    scheduler, request = _scheduler(blocks, num_computed=12)
    enforcer = _enforcer()
    enforcer.worker_ready = False
    enforcer.before_schedule(scheduler)
    assert len(blocks) == 3  # degraded to allocate: the worker cannot move tokens yet


def test_enforce_namespaces_leave_other_requests_to_vllm():
    blocks = [_Block(0), _Block(1), _Block(2)]
    scheduler, request = _scheduler(blocks, num_computed=12, namespace="batch")
    enforcer = _enforcer(enforce_namespaces=["gold"])
    enforcer.before_schedule(scheduler)
    assert len(blocks) == 3 and enforcer.requests["r"].enforced is None


# ---- the worker side: applying a plan to stand-ins of the runner ---------------------------------------
def test_worker_compactor_moves_survivors_truncates_and_makes_inputs_physical():
    config, _ = split_settings({"mode": "enforce", "base_pages": 3, "sink_tokens": 1, "recent_window_tokens": 2},
                               env={}, block_size=BLOCK)
    heads, head_dim = 1, 2
    cache = torch.zeros(8, heads, BLOCK, 2 * head_dim)
    keys, values = torch.arange(12.0), torch.arange(12.0) + 100  # token t of the request: key t, value t+100
    blocks = [5, 2, 7]
    for t in range(12):
        block, offset = blocks[t // BLOCK], t % BLOCK
        flat = cache[block, 0].view(-1)
        flat[:BLOCK * head_dim].view(head_dim, BLOCK)[:, offset] = keys[t]
        flat[BLOCK * head_dim:].view(BLOCK, head_dim)[offset] = values[t]
    table = types.SimpleNamespace(num_blocks_per_row=[3], block_table=types.SimpleNamespace(cpu=torch.tensor([blocks])),
                                  slot_mapping=types.SimpleNamespace(gpu=torch.full((4,), -1, dtype=torch.long)))
    runner = types.SimpleNamespace(
        requests={"r": types.SimpleNamespace(block_ids=([5, 2, 7],))}, kv_caches=[cache],
        input_batch=types.SimpleNamespace(req_id_to_index={"r": 0}, req_ids=["r"], num_reqs=1,
                                          num_computed_tokens_cpu=[12],
                                          block_table=types.SimpleNamespace(block_tables=[table])),
        query_start_loc=types.SimpleNamespace(cpu=torch.tensor([0, 1])), seq_lens=torch.tensor([13]),
        optimistic_seq_lens_cpu=torch.tensor([13]))
    compactor = WorkerCompactor(config)
    scores = torch.zeros(12)
    scores[3] = 5.0  # token 3 is a heavy hitter; 4 tokens must go
    compactor.add_scores("r", scores)
    plan = CompactionPlan(physical_tokens=12, keep_tokens=8, logical_length=12, shared_prefix_tokens=0, dropped=4)
    output = types.SimpleNamespace(growpage=StepPayload({"r": plan}, {"r": 4}))
    compactor.begin_step(runner, output, probed(transposed_write, 8, 1, BLOCK, head_dim))
    kept = compactor.kept_positions["r"].tolist()
    assert kept == [0, 3, 6, 7, 8, 9, 10, 11]
    survivors = [cache[blocks[i // BLOCK], 0].view(-1)[:BLOCK * head_dim].view(head_dim, BLOCK)[0, i % BLOCK].item()
                 for i in range(8)]
    assert survivors == [float(p) for p in kept]
    assert runner.requests["r"].block_ids == ([5, 2],) and table.num_blocks_per_row == [2]
    table.block_table.cpu[0, 2] = 4  # vLLM appends the new block in _update_states
    table.num_blocks_per_row[0] = 3
    compactor.adjust_inputs(runner)
    assert runner.seq_lens.tolist() == [9]  # 13 logical - 4 dropped
    assert table.slot_mapping.gpu[0].item() == 4 * BLOCK + 0  # logical 12 -> physical 8 -> block 4, offset 0


def _runner_holding(keys: torch.Tensor, blocks: list[int]):
    """A runner stand-in whose one request holds ``keys`` (``[tokens, heads, head_dim]``, values the
    keys + 1000) in ``blocks`` of the CPU ``vec`` layout, and that layout."""
    tokens, heads, head_dim = keys.shape
    cache = torch.zeros(8, heads, BLOCK, 2 * head_dim)
    slots = torch.tensor([blocks[t // BLOCK] * BLOCK + t % BLOCK for t in range(tokens)])
    transposed_write(keys, keys + 1000, cache, slots)
    table = types.SimpleNamespace(num_blocks_per_row=[len(blocks)],
                                  block_table=types.SimpleNamespace(cpu=torch.tensor([blocks])),
                                  slot_mapping=types.SimpleNamespace(gpu=torch.full((4,), -1, dtype=torch.long)))
    runner = types.SimpleNamespace(
        requests={"r": types.SimpleNamespace(block_ids=(list(blocks),))}, kv_caches=[cache],
        input_batch=types.SimpleNamespace(req_id_to_index={"r": 0}, req_ids=["r"], num_reqs=1,
                                          num_computed_tokens_cpu=[tokens],
                                          block_table=types.SimpleNamespace(block_tables=[table])),
        query_start_loc=types.SimpleNamespace(cpu=torch.tensor([0, 1])), seq_lens=torch.tensor([tokens + 1]),
        optimistic_seq_lens_cpu=torch.tensor([tokens + 1]))
    return runner, cache, probed(transposed_write, 8, heads, BLOCK, head_dim)


def _compact(compactor: WorkerCompactor, runner, layout, keep: int, physical: int = 12, prompt: int = 0) -> None:
    dropped = compactor.dropped.get("r", 0) + physical - keep
    plan = CompactionPlan(physical_tokens=physical, keep_tokens=keep, logical_length=dropped + keep,
                          shared_prefix_tokens=0, dropped=dropped, prompt_tokens=prompt)
    payload = StepPayload({"r": plan}, {"r": plan.dropped})
    compactor.begin_step(runner, types.SimpleNamespace(growpage=payload), layout)


def test_per_head_compaction_leaves_each_kv_head_its_own_survivors_in_the_same_slots():
    config, _ = split_settings({"mode": "enforce", "base_pages": 3, "sink_tokens": 1, "recent_window_tokens": 2},
                               env={}, block_size=BLOCK)
    keys = (torch.arange(12.0)[:, None] + 100 * torch.arange(2.0)[None, :])[:, :, None].expand(12, 2, 2)
    runner, cache, layout = _runner_holding(keys.contiguous(), [5, 2, 7])
    compactor = WorkerCompactor(config)
    scores = torch.zeros(2, 12)
    scores[0, 3], scores[1, 6] = 5.0, 5.0  # KV head 0 needs token 3, KV head 1 token 6
    compactor.add_scores("r", scores)
    _compact(compactor, runner, layout, keep=8)
    kept = compactor.kept_positions["r"].tolist()
    assert kept == [[0, 3, 6, 7, 8, 9, 10, 11], [0, 5, 6, 7, 8, 9, 10, 11]]
    blocks = [5, 2]
    for head in range(2):
        for slot, position in enumerate(kept[head]):
            stored = kv_keys.read_token(cache, blocks[slot // BLOCK] * BLOCK + slot % BLOCK, layout)[head]
            value = kv_keys.read_token(cache, blocks[slot // BLOCK] * BLOCK + slot % BLOCK, layout, value=True)[head]
            assert stored.tolist() == [position + 100.0 * head] * 2 and value[0].item() == position + 1000 + 100 * head
    assert runner.requests["r"].block_ids == ([5, 2],)
    # the scores moved with each head's survivors: a second compaction still ranks head 1's token 6 first
    _compact(compactor, runner, layout, keep=5, physical=8)
    assert 6 in compactor.kept_positions["r"][1].tolist() and 3 in compactor.kept_positions["r"][0].tolist()


@pytest.mark.parametrize("per_head", [False, True], ids=["request", "kv_head"])
def test_redundancy_drops_older_copies_of_a_repeated_generated_key_before_unique_ones(per_head):
    config, _ = split_settings({"mode": "enforce", "base_pages": 3, "sink_tokens": 1, "recent_window_tokens": 2},
                               env={}, block_size=BLOCK)
    basis = torch.eye(4)
    keys = torch.zeros(12, 1, 4)
    keys[:4, 0] = basis[0]  # the prompt
    keys[4:7, 0] = basis[1]  # generated 4, 5, 6: one phrase three times
    keys[7:10, 0] = torch.tensor([[0, 0, 1, 0.], [0, 0, 0, 1.], [0, 0, -1, 0.]])  # three unlike keys
    keys[10:, 0] = basis[0]
    scores = torch.tensor([0, 1, 1, 1, .2, .2, .2, .1, .1, .1, 0, 0])  # the copies look at least as useful
    kept = {}
    for weight in (0.0, 0.9):
        runner, _, layout = _runner_holding(keys, [5, 2, 7])
        compactor = WorkerCompactor(config, redundancy_weight=weight)
        compactor.key_caches = list(runner.kv_caches)
        compactor.add_scores("r", scores[None] if per_head else scores)
        _compact(compactor, runner, layout, keep=10, prompt=4)
        kept[weight] = compactor.kept_positions["r"].flatten().tolist()
    assert kept[0.0] == [0, 1, 2, 3, 4, 5, 6, 9, 10, 11]  # attention alone drops two unlike tokens
    assert kept[0.9] == [0, 1, 2, 3, 6, 7, 8, 9, 10, 11]  # R-KV drops the older copies, keeps the newest


def test_a_failed_move_still_cuts_the_worker_blocks_like_the_scheduler_and_is_reported():
    config, _ = split_settings({"mode": "enforce", "base_pages": 3, "sink_tokens": 1, "recent_window_tokens": 2},
                               env={}, block_size=BLOCK)
    table = types.SimpleNamespace(num_blocks_per_row=[3])
    runner = types.SimpleNamespace(requests={"r": types.SimpleNamespace(block_ids=([5, 2, 7],))}, kv_caches=[],
                                   input_batch=types.SimpleNamespace(
                                       req_id_to_index={"r": 0},
                                       block_table=types.SimpleNamespace(block_tables=[table])))
    compactor = WorkerCompactor(config)
    plan = CompactionPlan(physical_tokens=12, keep_tokens=8, logical_length=12, shared_prefix_tokens=0, dropped=4)
    with pytest.raises(CompactionError):
        compactor.begin_step(runner, types.SimpleNamespace(growpage=StepPayload({"r": plan}, {"r": 4})),
                             layout=None)  # the layout is unknown: nothing can move
    assert runner.requests["r"].block_ids == ([5, 2],) and table.num_blocks_per_row == [2]
    assert compactor.dropped == {"r": 4} and compactor.kept_positions["r"].tolist() == list(range(8))


def test_scheduler_faults_are_counted_where_the_exporter_reads_them():
    enforcer = _enforcer()
    assert enforcer.controller.faults.call("plugin", "boundary decisions", lambda: 1 / 0) is None
    assert enforcer.controller.stats.agent_errors_total["plugin"] == 1


def test_pool_pressure_compresses_a_running_request_before_vllm_would_preempt():
    # Two decoding requests, an empty pool: "grower" is at a block boundary and needs a block; "holder"
    # has room in its last block but holds 6 blocks, 3 above its floor (base_pages 3).
    grower_blocks = [_Block(i, ref_cnt=2) for i in range(3)]  # shared: it cannot compress itself
    holder_blocks = [_Block(10 + i) for i in range(6)]
    scheduler, grower = _scheduler(grower_blocks, num_computed=12)
    holder = types.SimpleNamespace(
        request_id="h", num_computed_tokens=22, num_prompt_tokens=2, num_tokens=23, spec_token_ids=[],
        sampling_params=types.SimpleNamespace(extra_args={}))
    scheduler.running.append(holder)
    single = scheduler.kv_cache_manager.coordinator.single_type_managers[0]
    single.req_to_blocks["h"], single.num_cached_block["h"] = holder_blocks, 6
    scheduler.kv_cache_manager.block_pool.free.clear()
    enforcer = _enforcer()
    enforcer.before_schedule(scheduler)
    pool = scheduler.kv_cache_manager.block_pool
    # the holder gives just the block the grower lacks: 4 full blocks kept (+ the one its next token
    # takes: 5 of its 6), not down to its floor of 3
    assert len(holder_blocks) == 4 and getattr(holder, DROPPED_ATTRIBUTE) == 22 - 16
    assert len(pool.free) >= 1  # the grower's next block is there: vLLM has no reason to preempt
    output = types.SimpleNamespace()
    enforcer.after_schedule(scheduler, output)
    payload = getattr(output, PAYLOAD_ATTRIBUTE)
    events = {d.request_id: (d.kind, d.reason) for d in enforcer.decisions.events}
    # the grower, which could not compress its shared blocks, grows into the room the holder made
    assert events == {"h": ("evict", "pool_pressure"), "r": ("allocate", "narrow_demand")}
    assert payload.plans["h"].keep_tokens == 16


def test_both_homes_get_the_same_step_from_the_same_state():
    # One state, described to each home in its own terms: a pool of 9 pages, all held; "r" has
    # filled its 3 pages (12 tokens) and needs a fourth, "h" holds 6 pages (22 tokens), and a
    # 2-token request waits. The reference engine sees its pages, vLLM's home its blocks; both
    # must ask the controller the same question and get the same answer.
    settings = dict(base_pages=3, sink_tokens=1, recent_window_tokens=2, growth_coefficient=0.0,
                    lts_grow_threshold=100.0, density_threshold=1.0)
    manager = make_manager(num_pages=9, block_size=BLOCK, **settings)
    driver = Driver(manager)
    driver.admit("h", 22)
    driver.admit("r", 11)
    driver.step([("h", 22), ("r", 11)])
    driver.step([("r", 1)])
    assert manager.pool.num_free == 0

    r_blocks, h_blocks = [_Block(i) for i in range(3)], [_Block(10 + i) for i in range(6)]
    scheduler, _ = _scheduler(r_blocks, num_computed=12, prompt=11)
    scheduler.running.append(types.SimpleNamespace(
        request_id="h", num_computed_tokens=22, num_prompt_tokens=22, num_tokens=23, spec_token_ids=[],
        sampling_params=types.SimpleNamespace(extra_args={})))
    scheduler.waiting.append(types.SimpleNamespace(num_prompt_tokens=2))
    single = scheduler.kv_cache_manager.coordinator.single_type_managers[0]
    single.req_to_blocks["h"], single.num_cached_block["h"] = h_blocks, 6
    pool = scheduler.kv_cache_manager.block_pool
    pool.free.clear()
    pool.num_gpu_blocks = 10  # vLLM keeps one block as its null block
    enforcer = _enforcer(**settings)
    for request in scheduler.running:  # both prompts were settled when they were cached, as in the reference home
        enforcer._track(request).prompt_settled = True

    answers = {}
    for home, controller in (("reference", manager.controller), ("vllm", enforcer.controller)):
        plan_step = controller.plan_step

        def spy(pool_view, views, *args, _home=home, _plan=plan_step, **kwargs):
            answers[_home] = (pool_view, _plan(pool_view, views, *args, **kwargs))
            return answers[_home][1]

        controller.plan_step = spy
    manager.control_step([("r", 1), ("h", 1)], waiting_prompt_tokens=2)
    enforcer.before_schedule(scheduler)

    def summary(answer):
        step_pool, control = answer
        return (step_pool, control.pressure, control.reserve_pages,
                [(b.request_id, b.action, b.pages_after, b.fallback) for b in control.boundaries],
                control.reclaims)

    assert summary(answers["reference"]) == summary(answers["vllm"])
    _, control = answers["vllm"]
    assert [(b.request_id, b.action) for b in control.boundaries] == [("r", Action.EVICT)]
    assert [(c.request_id, c.pages_after) for c in control.reclaims] == [("h", 5)]  # room for the admission


def test_a_fixed_cap_compresses_the_cached_prompt_once_then_evicts_at_its_cap():
    # StreamingLLM-style cap of 3 blocks inside vLLM: same admission, floors and relief as GrowPage
    config, _ = split_settings({"mode": "enforce", "base_pages": 3, "sink_tokens": 1, "recent_window_tokens": 2},
                               env={}, block_size=BLOCK)
    enforcer = SchedulerEnforcer(GrowthController(config, num_layers=None, method=build_method("streaming_llm")))
    enforcer.decisions = _Decisions()
    enforcer.controller.stats.add_listener(enforcer.decisions)
    enforcer.on_worker_ready(True)
    blocks = [_Block(i) for i in range(6)]
    scheduler, request = _scheduler(blocks, num_computed=22, prompt=22)  # the first decode step
    enforcer.before_schedule(scheduler)
    assert len(blocks) == 2 and getattr(request, DROPPED_ATTRIBUTE) == 22 - 8  # 2 full blocks + the next one
    assert [(d.kind, d.reason) for d in enforcer.decisions.events] == [("evict", "prompt_budget")]
    assert enforcer.requests.enforced("r").allowed_blocks == 3
    enforcer.after_schedule(scheduler, types.SimpleNamespace())
    # decoding on: 12 logical tokens later its 3 blocks are full again, and the cap evicts at the boundary
    request.num_computed_tokens, request.num_tokens = 26, 27
    blocks.append(_Block(50))
    enforcer.before_schedule(scheduler)
    assert [(d.kind, d.reason) for d in enforcer.decisions.events][-1] == ("evict", "budget_reached")
    assert len(blocks) == 2  # the prompt is not compressed a second time: one eviction back to the cap


def test_a_worker_refuses_a_payload_of_another_version_and_moves_nothing():
    config, _ = split_settings({"mode": "enforce", "base_pages": 3, "sink_tokens": 1, "recent_window_tokens": 2},
                               env={}, block_size=BLOCK)
    compactor = WorkerCompactor(config)
    plan = CompactionPlan(physical_tokens=12, keep_tokens=8, logical_length=12, shared_prefix_tokens=0, dropped=4)
    runner = types.SimpleNamespace(requests={"r": types.SimpleNamespace(block_ids=([5, 2, 7],))}, kv_caches=[])
    for stale in (StepPayload({"r": plan}, {"r": 4}, version=PAYLOAD_VERSION + 1), {"plans": {}, "dropped": {}}):
        with pytest.raises(CompactionError, match="scheduler and workers must run the same GrowPage"):
            compactor.begin_step(runner, types.SimpleNamespace(growpage=stale), layout=None)
    assert runner.requests["r"].block_ids == ([5, 2, 7],) and compactor.dropped == {}
