"""The actuator end to end: attention equals dense attention, compression frees pages, monitor
mode touches nothing, and no page leaks under random workloads."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from growpage.core.methods import METHOD_NAMES, PROMPT_PRIOR_STEPS, build_method
from growpage.engine.kv.kv_store import PageFormat
from growpage.engine.kv.manager import NEED_EVERY_TOKENS, SlotStatus
from growpage.engine.kv.pool import PageState
from support.factories import LAYERS, Driver, dense_attention, make_manager


def check_against_dense(driver, outputs, queries, request_id, positions_now):
    manager = driver.manager
    stored = driver.stored_positions(request_id)
    n = outputs[request_id].shape[1]
    end = manager.requests[request_id].logical_length
    q_positions = list(range(end - n, end))
    for layer in range(LAYERS):
        expected = dense_attention(driver.kv[request_id], stored, queries[request_id][layer], q_positions, layer)
        torch.testing.assert_close(outputs[request_id][layer], expected, atol=1e-5, rtol=1e-5)


def test_paged_attention_equals_dense_for_prefill_and_decode_in_a_mixed_batch():
    driver = Driver(make_manager(mode="off"))
    driver.admit("a", 7)
    driver.admit("b", 3)
    outputs, queries = driver.step([("a", 7), ("b", 3)])  # two prefills, ragged
    check_against_dense(driver, outputs, queries, "a", None)
    check_against_dense(driver, outputs, queries, "b", None)
    for _ in range(12):  # decode steps crossing several page boundaries
        outputs, queries = driver.step([("a", 1), ("b", 1)])
        check_against_dense(driver, outputs, queries, "a", None)
        check_against_dense(driver, outputs, queries, "b", None)
    driver.admit("c", 5)  # prefill next to decodes: attention runs per group, both exact
    outputs, queries = driver.step([("a", 1), ("c", 5), ("b", 1)])
    check_against_dense(driver, outputs, queries, "c", None)
    check_against_dense(driver, outputs, queries, "a", None)
    check_against_dense(driver, outputs, queries, "b", None)


def run_until(driver, request_id, predicate, max_steps=200):
    for _ in range(max_steps):
        outputs, queries = driver.step([(request_id, 1)])
        if predicate():
            return outputs, queries
    raise AssertionError("condition never reached")


def test_eviction_keeps_sinks_and_recent_window_frees_a_page_and_attention_stays_exact():
    manager = make_manager(density_threshold=1.0, lts_grow_threshold=100.0, growth_coefficient=0.0)  # always evict
    driver = Driver(manager)
    driver.admit("a", 4)
    driver.step([("a", 4)])
    outputs, queries = run_until(driver, "a", lambda: manager.stats.decisions_total["evict"] > 0)
    request = manager.requests["a"]
    stored = driver.stored_positions("a")
    length = request.logical_length
    assert len(stored) < length  # tokens were dropped
    assert {0, 1} <= set(stored)  # sinks kept
    assert set(range(length - 4, length)) <= set(stored)  # recent window kept
    assert request.pages_held <= manager.config.base_pages  # it compressed instead of growing
    check_against_dense(driver, outputs, queries, "a", None)  # new tokens keep their true positions
    for _ in range(10):  # and after several more evictions, attention is still exact
        outputs, queries = driver.step([("a", 1)])
    check_against_dense(driver, outputs, queries, "a", None)
    assert manager.make_stats().decisions_total["evict"] >= 2


def test_quantization_frees_pages_and_reports_exact_bytes():
    manager = make_manager(density_threshold=0.0, kv_dtype="float16", quantization_bits=8)
    driver = Driver(manager)
    driver.admit("a", 4)
    driver.step([("a", 4)])
    run_until(driver, "a", lambda: manager.stats.decisions_total["quantize"] > 0)
    snapshot = manager.make_stats()
    store = manager.store
    int8_pages = [p for p in manager.requests["a"].pages if store.format[p] is PageFormat.INT8]
    assert int8_pages and all(store.fill[p] == 2 * manager.config.block_size for p in int8_pages)
    # Two FP16 pages in, one INT8 page plus one float16 scale per (layer, K|V, head) out.
    page_bytes = LAYERS * manager.config.block_size * 2 * 2 * 8 * 2
    scale_bytes = LAYERS * 2 * 2 * 2
    events = [e for e in snapshot.decision_events if e.kind == "quantize"]
    assert (events[0].bytes_in, events[0].bytes_out) == (2 * page_bytes, page_bytes + scale_bytes)
    assert snapshot.intra_page_compress_ratio == pytest.approx(
        snapshot.window_compress_input_bytes / snapshot.window_compress_output_bytes)
    assert 1.9 < events[0].bytes_in / events[0].bytes_out < 2.0  # INT8 never reaches 2.0x
    assert snapshot.gauges.compression_ratio > 1.0  # the pool stores fewer bytes than it logically holds


@pytest.mark.parametrize("bits, tolerance", [(8, 0.05), (4, 0.6)])
def test_attention_over_quantized_pages_stays_close_to_dense(bits, tolerance):
    manager = make_manager(density_threshold=0.0, quantization_bits=bits, base_pages=6)
    driver = Driver(manager)
    driver.admit("a", 4)
    driver.step([("a", 4)])
    outputs, queries = run_until(driver, "a", lambda: manager.stats.decisions_total["quantize"] > 0)
    outputs, queries = driver.step([("a", 1)])
    length = manager.requests["a"].logical_length
    for layer in range(LAYERS):
        expected = dense_attention(driver.kv["a"], driver.stored_positions("a"), queries["a"][layer],
                                   [length - 1], layer)
        assert (outputs["a"][layer] - expected).abs().max() < tolerance


def test_monitor_mode_changes_no_kv_byte_and_matches_off():
    results = {}
    for mode in ("off", "monitor"):
        manager = make_manager(mode=mode, density_threshold=0.0)  # would quantize if enforced
        driver = Driver(manager, seed=7)
        driver.admit("a", 5)
        driver.step([("a", 5)])
        outs = [driver.step([("a", 1)])[0]["a"] for _ in range(30)]
        results[mode] = (manager.store.arena.clone(), torch.stack(outs), manager.make_stats())
    off_arena, off_out, _ = results["off"]
    mon_arena, mon_out, mon_stats = results["monitor"]
    assert torch.equal(off_arena, mon_arena)
    assert torch.equal(off_out, mon_out)  # bit-identical outputs
    assert mon_stats.decisions_total["quantize"] > 0  # the decisions were computed and recorded
    assert all(not e.enforced for e in mon_stats.decision_events)
    assert mon_stats.compress_input_bytes_total == 0


def test_shared_prefix_pages_are_reused_and_never_modified():
    manager = make_manager(density_threshold=1.0, lts_grow_threshold=100.0, base_pages=4, growth_coefficient=0.0)
    driver = Driver(manager)
    hashes = [11, 22, 33]
    driver.admit("a", 9, block_hashes=hashes)
    driver.step([("a", 9)])
    assert manager.publish_prefix("a", hashes) == 2  # two full pages of 4 tokens
    shared = manager.requests["a"].pages[:2]
    before = manager.store.arena[:, shared].clone()
    admission = driver.admit("b", 9, block_hashes=hashes)
    assert admission.cached_tokens == 8
    assert manager.requests["b"].pages[:2] == shared
    driver.kv["b"] = {p: driver.kv["a"][p] for p in range(8)}
    driver.step([("b", 1)])
    for _ in range(30):  # both decode through many evictions
        driver.step([("a", 1), ("b", 1)])
    assert manager.stats.decisions_total["evict"] > 0
    assert torch.equal(manager.store.arena[:, shared], before)
    assert all(manager.store.format[p] is PageFormat.FULL for p in shared)
    manager.release("a")
    assert manager.pool.state(shared[0]) is PageState.USED  # b still holds them
    manager.release("b")
    assert manager.pool.num_free == manager.pool.num_pages


def test_fully_cached_prompt_still_computes_its_last_token():
    manager = make_manager(base_pages=4)
    driver = Driver(manager)
    driver.admit("a", 8, block_hashes=[1, 2])
    driver.step([("a", 8)])
    manager.publish_prefix("a", [1, 2])
    assert driver.admit("b", 8, block_hashes=[1, 2]).cached_tokens == 4


def test_throttle_refuses_growth_until_time_passes(clock):
    # reserving admission: the 4 granted pages fill before the first growth
    manager = make_manager(clock=clock, method=build_method("growpage_reserving"), max_growth_rate=0.25,
                           density_threshold=1.0,
                           lts_grow_threshold=0.0, growth_coefficient=0.0)
    driver = Driver(manager)
    driver.admit("a", 4)
    driver.step([("a", 4)])
    for _ in range(13):
        driver.step([("a", 1)])  # fills the 4 granted pages, then the first growth (bucket full)
    assert manager.requests["a"].pages_held == 5
    for _ in range(8):
        driver.step([("a", 1)])  # budget spent: growth is throttled, eviction makes room instead
    stats = manager.make_stats()
    assert stats.decisions_total["throttled"] >= 1 and stats.decisions_total["evict"] >= 1
    assert manager.requests["a"].pages_held == 5
    clock.now += 1.0  # 0.25 * 5 pages = 1.25 pages per second
    for _ in range(4):
        driver.step([("a", 1)])
    assert manager.requests["a"].pages_held == 6


def test_pool_exhaustion_falls_back_to_eviction():
    manager = make_manager(num_pages=5, lts_grow_threshold=0.0, density_threshold=1.0)
    driver = Driver(manager)
    driver.admit("a", 4)
    driver.step([("a", 4)])
    for _ in range(20):
        driver.step([("a", 1)])  # wants to allocate (LTS > 0), pool of 1 page soon empty -> evict
    stats = manager.make_stats()
    assert stats.decisions_total["denied"] > 0 and stats.decisions_total["evict"] > 0
    assert stats.oom_events_total == 0


def test_preempts_when_nothing_can_be_freed_and_the_pool_is_empty():
    # b shares a's 3 prompt pages (read-only) and owns one page whose 4 tokens are all in its
    # recent window: nothing to quantize or evict, and a holds the rest of the pool.
    manager = make_manager(num_pages=5, base_pages=4, density_threshold=1.0, lts_grow_threshold=0.0)
    driver = Driver(manager)
    hashes = [1, 2, 3]
    driver.admit("a", 13, block_hashes=hashes)
    driver.step([("a", 13)])
    manager.publish_prefix("a", hashes)
    assert driver.admit("b", 13, block_hashes=hashes).cached_tokens == 12
    driver.kv["b"] = dict(driver.kv["a"])
    assert manager.pool.num_free == 0
    driver.step([("b", 1)])
    for _ in range(3):
        driver.step([("b", 1)])
    assert manager.ensure_slots("b", 1) is SlotStatus.PREEMPT
    stats = manager.make_stats()
    assert stats.decisions_total["preempt"] == 1 and stats.oom_events_total == 1
    manager.release("b", reason="preempted")
    manager.release("a")
    assert manager.pool.num_free == 5


def test_off_mode_is_plain_paging():
    manager = make_manager(mode="off", num_pages=5)
    driver = Driver(manager)
    driver.admit("a", 4)
    driver.step([("a", 4)])
    for _ in range(16):
        driver.step([("a", 1)])
    assert manager.requests["a"].pages_held == 5
    assert manager.ensure_slots("a", 1) is SlotStatus.PREEMPT
    stats = manager.make_stats()
    assert sum(stats.decisions_total.values()) == 0 and stats.oom_events_total == 1


def test_faults_inside_growpage_are_counted_and_fall_back(monkeypatch):
    manager = make_manager(density_threshold=0.0, growth_coefficient=0.0)
    driver = Driver(manager)
    driver.admit("a", 4)
    driver.step([("a", 4)])

    def broken(*args, **kwargs):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(manager, "_quantize", broken)
    monkeypatch.setattr(manager, "_evict", broken)
    monkeypatch.setattr(manager.summaries, "observe", broken)
    for _ in range(20):
        driver.step([("a", 1)])  # never raises
    errors = manager.make_stats().agent_errors_total
    assert errors["actuator"] >= 1 and errors["summaries"] >= 1
    assert manager.requests["a"].pages_held > manager.config.base_pages  # fell back to growing


def test_gauges_follow_the_contract_definitions():
    manager = make_manager(mode="off", base_pages=4, method=build_method("growpage_reserving"))
    driver = Driver(manager)
    driver.admit("a", 6)  # 4 pages reserved (16 slots), 6 tokens written over 2 pages
    driver.step([("a", 6)])
    gauges = manager.make_stats().gauges
    assert (gauges.pages_used, gauges.pages_reserved) == (2, 2)
    assert gauges.utilization == pytest.approx(6 / 16)
    assert gauges.fragmentation == pytest.approx(1 - 6 / 8)
    assert gauges.compression_ratio == pytest.approx(1.0)  # nothing compressed (slack is fragmentation)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(["off", "monitor", "enforce"]),
       bits=st.sampled_from([8, 4]), method=st.sampled_from(METHOD_NAMES), coverage=st.sampled_from([0.0, 0.95]))
def test_no_page_leaks_under_random_workloads(seed, mode, bits, method, coverage):
    """Every KV method (GrowPage, the benchmark baselines, the ablations) keeps the ledger exact,
    with the per-step controller call and attention needs in the loop."""
    rng = random.Random(seed)
    manager = make_manager(mode=mode, num_pages=24, base_pages=3, quantization_bits=bits, attention_coverage=coverage,
                           density_threshold=rng.random(), lts_grow_threshold=rng.random() * 3,
                           recent_window_tokens=3, sink_tokens=1, method=build_method(method, seed))
    driver = Driver(manager, seed=seed)
    running: list[str] = []
    next_id = 0
    for _ in range(40):
        action = rng.random()
        if action < 0.25:
            prompt = rng.randint(1, 10)
            hashes = [rng.randint(0, 3) for _ in range(3)]
            if manager.can_admit(prompt, hashes):
                rid = f"r{next_id}"
                next_id += 1
                admission = driver.admit(rid, prompt, block_hashes=hashes)
                driver.kv[rid] = {}
                driver.step([(rid, prompt - admission.cached_tokens)])
                manager.compress_prompt(rid)
                if not manager.method.compress_prompt:
                    manager.publish_prefix(rid, hashes)
                running.append(rid)
        elif action < 0.35 and running:
            manager.release(running.pop(rng.randrange(len(running))), reason="aborted")
        elif running:
            manager.control_step([(rid, 1) for rid in running], waiting_prompt_tokens=rng.choice([None, 4]))
            running = [rid for rid in running if rid in manager.requests]
            manager.admission_reserve_pages = rng.choice([0, 0, 2, 5])
            batch = []
            for rid in running:
                status = manager.ensure_slots(rid, 1)
                if status is SlotStatus.PREEMPT:
                    manager.release(rid, reason="preempted")
                elif status is SlotStatus.OK:
                    batch.append((rid, 1))
            running = [rid for rid in running if rid in manager.requests]
            if batch:
                driver.step(batch)
        manager.pool.check_invariants()
        gauges = manager.gauges()
        assert gauges.pages_free + gauges.pages_reserved + gauges.pages_used == 24
        assert 0.0 <= gauges.utilization <= 1.0 and 0.0 <= gauges.fragmentation <= 1.0
    for rid in running:
        manager.release(rid)
    manager.pool.check_invariants()
    assert manager.pool.num_free == 24
    assert not manager.requests


def test_listeners_see_the_lifecycle_and_their_faults_are_contained():
    manager = make_manager(density_threshold=1.0, lts_grow_threshold=100.0, growth_coefficient=0.0,
                           method=build_method("growpage_reserving"))
    seen = []

    class Recorder:
        def on_admit(self, event):
            seen.append(("admit", event.request_id, event.pages_granted))

        def on_decision(self, event):
            seen.append(("decision", event.kind))

        def on_finish(self, event):
            seen.append(("finish", event.reason, event.num_tokens))

    class Broken:
        def on_admit(self, event):
            raise RuntimeError("listener bug")

        on_decision = on_finish = on_admit

    manager.stats.add_listener(Recorder())
    manager.stats.add_listener(Broken())
    driver = Driver(manager)
    driver.admit("a", 4)
    driver.step([("a", 4)])
    for _ in range(14):
        driver.step([("a", 1)])
    manager.release("a")
    assert seen[0] == ("admit", "a", 4)
    assert ("decision", "evict") in seen
    assert seen[-1] == ("finish", "finished", 18)
    assert manager.make_stats().agent_errors_total["listener"] >= 3


def test_pool_pressure_compresses_another_request_instead_of_preempting():
    manager = make_manager(num_pages=12, base_pages=3, density_threshold=1.0, lts_grow_threshold=0.0)
    driver = Driver(manager)
    driver.admit("big", 4)
    driver.step([("big", 4)])
    while manager.requests["big"].pages_held < 9:  # broad demand: it grows while the pool has pages
        driver.step([("big", 1)])
    driver.admit("small", 4)
    driver.step([("small", 4)])
    free_before = manager.pool.num_free
    freed = manager.relieve_pressure(3, exclude="small")
    big = manager.requests["big"]
    assert freed >= 3 and manager.pool.num_free == free_before + freed
    assert big.pages_held >= big.base_pages  # the floor protects a running request
    events = [e for e in manager.make_stats().decision_events if e.reason == "pool_pressure"]
    # INT8 first: old pages are halved and no token is lost, before anything is evicted
    assert events and events[0].request_id == "big" and events[0].kind == "quantize", events
    assert any(manager.store.format[p] is PageFormat.INT8 for p in big.pages)
    assert manager.pool.num_free + manager.pool.num_reserved + manager.pool.num_used == 12
    driver.step([("big", 1), ("small", 1)])  # both still decode


def test_without_quantization_pressure_relief_evicts():
    manager = make_manager(num_pages=12, base_pages=3, density_threshold=1.0, lts_grow_threshold=0.0,
                           method=build_method("growpage_no_quant"))
    driver = Driver(manager)
    driver.admit("big", 4)
    driver.step([("big", 4)])
    while manager.requests["big"].pages_held < 9:
        driver.step([("big", 1)])
    driver.admit("small", 4)
    driver.step([("small", 4)])
    assert manager.relieve_pressure(3, exclude="small") >= 3
    events = [e for e in manager.make_stats().decision_events if e.reason == "pool_pressure"]
    assert events and all(e.kind == "evict" for e in events)
    assert all(manager.store.format[p] is PageFormat.FULL for p in manager.requests["big"].pages)


def test_eviction_rewrites_only_from_the_page_of_the_first_dropped_token():
    # Tokens ahead of the first dropped one stay where they are: their pages are neither read nor
    # rewritten (less copying; quantized pages keep their exact codes), and attention stays exact.
    manager = make_manager(density_threshold=1.0, lts_grow_threshold=100.0, growth_coefficient=0.0, base_pages=6)
    driver = Driver(manager)
    driver.admit("a", 4)
    driver.step([("a", 4)])
    written: list[tuple[list[int], list[int]]] = []
    write_group = manager.store.write_group

    def recording(pages, fmt, values, positions, scores):
        group = [p for p in manager.requests["a"].pages if manager.store.format[p] is fmt]
        written.append((list(pages), group))
        return write_group(pages, fmt, values, positions, scores)

    manager.store.write_group = recording
    outputs, queries = run_until(driver, "a", lambda: manager.stats.decisions_total["evict"] >= 3)
    assert written
    for pages, group in written:
        assert pages == group[len(group) - len(pages):]  # a suffix of the group
        assert group[0] not in pages  # the first page holds the sinks: never dropped, never rewritten
    check_against_dense(driver, outputs, queries, "a", None)
    for _ in range(6):
        outputs, queries = driver.step([("a", 1)])
    check_against_dense(driver, outputs, queries, "a", None)


def _prompt_then_decode(method_name, steps=3, **config):
    manager = make_manager(method=build_method(method_name), base_pages=16, **config)
    driver = Driver(manager, seed=3)
    driver.admit("a", 10)
    driver.step([("a", 6)])  # a prompt chunk that does not end the prompt
    driver.step([("a", 4)])  # the step that ends it
    after_prompt = manager.store.scores.clone()
    for _ in range(steps):
        driver.step([("a", 1)])
    return manager, after_prompt, driver


def test_growpage_ranks_by_its_prompts_attention_as_a_prior_of_32_decode_steps():
    # the same inputs for GrowPage and H2O: GrowPage's scores are H2O's with the prompt's last
    # query counted 32 times and an earlier chunk's not at all (vLLM's prompt-anchored ranking)
    growpage, growpage_prompt, _ = _prompt_then_decode("growpage", steps=0)
    h2o, _, _ = _prompt_then_decode("h2o", steps=0)
    h2o_chunks = make_manager(method=build_method("h2o"), base_pages=16)
    driver = Driver(h2o_chunks, seed=3)
    driver.admit("a", 10)
    driver.step([("a", 6)])
    first_chunk = h2o_chunks.store.scores.clone()
    torch.testing.assert_close(growpage_prompt, PROMPT_PRIOR_STEPS * (h2o.store.scores - first_chunk))
    growpage_decoded, _, _ = _prompt_then_decode("growpage", steps=2)
    h2o_decoded, _, _ = _prompt_then_decode("h2o", steps=2)
    torch.testing.assert_close(growpage_decoded.store.scores - growpage_prompt,
                               h2o_decoded.store.scores - h2o.store.scores)


def test_attention_coverage_raises_growpages_floor_in_the_reference_engine():
    manager, _, _ = _prompt_then_decode("growpage", attention_coverage=0.95)
    manager.control_step([("a", 1)])
    request = manager.requests["a"]
    need = manager.controller.requests["a"].attention_tokens
    stored = sum(manager.store.fill[p] for p in request.pages)
    protected = manager.config.sink_tokens + manager.config.recent_window_tokens
    assert protected < need <= stored  # more than the protected tokens, never more than it holds
    # the floor follows the need: a request needing 13 tokens in 4-token pages keeps 5 pages
    view = manager._view(request, 1)
    assert manager.controller.floor_of(view) >= -(-need // manager.config.block_size) + 1
    for method, coverage in (("h2o", 0.95), ("growpage", 0.0)):  # a fixed cap is a cap; 0: the floor alone
        other, _, _ = _prompt_then_decode(method, attention_coverage=coverage)
        other.control_step([("a", 1)])
        assert other.controller.requests["a"].attention_tokens == 0


def test_attention_need_is_measured_once_per_8_tokens():
    manager, _, driver = _prompt_then_decode("growpage", attention_coverage=0.95)
    manager.control_step([("a", 1)])
    measured_at = manager.requests["a"].need_measured_at
    assert measured_at == manager.requests["a"].logical_length
    for step in range(1, NEED_EVERY_TOKENS + 1):
        driver.step([("a", 1)])
        manager.control_step([("a", 1)])
        expected = measured_at + NEED_EVERY_TOKENS if step == NEED_EVERY_TOKENS else measured_at
        assert manager.requests["a"].need_measured_at == expected


@pytest.mark.parametrize("method, coverage, waiting_tokens, pages_after",
                         [("growpage", 0.95, None, 6), ("growpage", 0.95, 8, 6), ("growpage", 0.5, 30, None),
                          ("growpage", 0.0, 30, 6), ("h2o", 0.0, None, 3)])
def test_growpage_compresses_a_cached_prompt_only_when_a_waiting_request_cannot_be_admitted(method, coverage,
                                                                                             waiting_tokens,
                                                                                             pages_after):
    # 12 pages; a 20-token prompt holds 6 (its first token's reserved page included); a 30-token
    # request waiting needs 8 and cannot be admitted, an 8-token one fits as it is; a fixed cap
    # compresses its prompt either way, to the same 3 pages (2 of tokens, the reserved next one)
    manager = make_manager(num_pages=12, base_pages=3, method=build_method(method), attention_coverage=coverage)
    driver = Driver(manager)
    driver.admit("a", 20)
    manager.control_step([("a", 20)], waiting_prompt_tokens=waiting_tokens)
    driver.step([("a", 20)])
    manager.compress_prompt("a")
    if pages_after is None:  # down to what its prompt's attention needs, measured right then
        need = manager.controller.requests["a"].attention_tokens
        assert 6 < need < 16  # more than the protected tokens, less than the prompt: it compresses
        pages_after = -(-need // 4) + 1
    assert manager.requests["a"].pages_held == pages_after
    manager.pool.check_invariants()
    if pages_after < 6:  # down to its floor: sinks and the recent window kept, the next token's page
        assert set(driver.stored_positions("a")) >= {0, 1, 16, 17, 18, 19}
        assert len(driver.stored_positions("a")) == 4 * (pages_after - 1) and len(manager.requests["a"].reserved) == 1
        events = manager.make_stats().decision_events
        assert [(e.kind, e.reason) for e in events] == [("evict", "prompt_budget")]


def test_a_step_mixing_decodes_and_a_prompt_chunk_runs_attention_per_group():
    # a decode row is not padded to the chunk's queries (the reference engine's cost was
    # batch x chunk x keys whenever a prompt chunk ran beside decodes)
    manager = make_manager(mode="off")
    driver = Driver(manager)
    driver.admit("a", 3)
    driver.step([("a", 3)])
    driver.admit("c", 5)
    for request_id, tokens in (("a", 1), ("c", 5)):
        assert manager.ensure_slots(request_id, tokens) is SlotStatus.OK
    layout = manager.plan_step([("a", 1), ("c", 5)]).layout
    assert layout.single_query_rows.tolist() == [0] and layout.multi_query_rows.tolist() == [1]
    assert manager.ensure_slots("a", 1) is SlotStatus.OK
    assert manager.plan_step([("a", 1)]).layout.single_query_rows is None  # one group: one call


def _stored_kv(manager, request_id: str) -> dict[int, torch.Tensor]:
    """What the store holds for ``request_id``, dequantized: position -> ``[layers, 2, heads, dim]``."""
    store, kv = manager.store, {}
    for page in manager.requests[request_id].pages:
        fill = store.fill[page]
        values = store.read_all_layers([page], torch.float32)  # [L, fill, 2, H, D]
        for slot, position in enumerate(store.positions[page, :fill].tolist()):
            kv[position] = values[:, slot]
    return kv


def test_a_batch_mixing_quantized_and_full_pages_attends_over_each_rows_own_keys_exactly():
    # each row's keys are packed side by side: a row is not padded to the widest row of every format
    manager = make_manager(density_threshold=0.0, quantization_bits=8, base_pages=6)
    driver = Driver(manager)
    driver.admit("a", 4)
    driver.step([("a", 4)])
    run_until(driver, "a", lambda: manager.stats.decisions_total["quantize"] > 0)
    driver.admit("b", 9)
    driver.step([("b", 9)])
    store = manager.store
    formats = {r: {store.format[p] for p in manager.requests[r].pages if store.fill[p]} for r in "ab"}
    assert formats == {"a": {PageFormat.FULL, PageFormat.INT8}, "b": {PageFormat.FULL}}
    outputs, queries = driver.step([("a", 1), ("b", 1)])
    for request_id in "ab":
        kv = _stored_kv(manager, request_id)
        newest = manager.requests[request_id].logical_length - 1
        for layer in range(LAYERS):
            expected = dense_attention(kv, sorted(kv), queries[request_id][layer], [newest], layer)
            torch.testing.assert_close(outputs[request_id][layer], expected, atol=1e-5, rtol=1e-5)
    for request_id in "ab":
        assert manager.ensure_slots(request_id, 1) is SlotStatus.OK
    layout = manager.plan_step([("a", 1), ("b", 1)]).layout
    keys_per_row = [sum(store.capacity(p) for p in manager.requests[r].pages if store.fill[p]) for r in "ab"]
    assert layout.max_keys == max(keys_per_row)
