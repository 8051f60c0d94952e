"""The compression gate: decode-time compression on only while it buys width or a dear recompute."""

from __future__ import annotations

from growpage.core.admission import StepCosts
from growpage.core.compression_gate import (
    DECODE_WORK_SHARE,
    GATE_WINDOW_STEPS,
    RECOMPUTE_COST_FACTOR,
    CompressionGate,
    GateStep,
    StepGate,
    buys_width,
    recompute_outweighs,
    wider_batch_pays,
)

STEP_S = 0.03  # a 30 ms engine step
# the recompute the window's decode-time work is worth, twice over: 2 x 3 % x 30 ms x 64 steps = 115 ms
THRESHOLD_S = RECOMPUTE_COST_FACTOR * DECODE_WORK_SHARE * STEP_S * GATE_WINDOW_STEPS


def test_pages_held_free_buy_width_only_once_they_add_up_to_one_more_request():
    assert not buys_width(4, 5.0)  # 4 pages spared among requests of 5: the batch is no wider
    assert buys_width(5, 5.0)
    assert not buys_width(0, 0.0)  # nothing runs


def test_a_wider_batch_pays_where_the_steps_fixed_part_dominates_never_where_each_request_costs_its_own_time():
    # the AMX host's fit on mixed work (seed 2): 19 ms fixed, 2 ms a request
    amx = StepCosts(fixed_s=0.0192, per_request_s=0.0020, per_token_s=0.0003, steps=200)
    assert wider_batch_pays(amx, 5)  # one more of 6: 12 % more tokens per second, over twice the 3 % work
    assert not wider_batch_pays(amx, 10)  # 4.7 %: under the factor
    # a GPU-like step, fixed part only: 1/width
    gpu = StepCosts(fixed_s=0.02, per_request_s=0.0, per_token_s=0.0, steps=200)
    threshold = RECOMPUTE_COST_FACTOR * DECODE_WORK_SHARE
    assert wider_batch_pays(gpu, int(1 / threshold)) and not wider_batch_pays(gpu, int(1 / threshold) + 1)
    # a step that grows with every request (AVX2: half the batch ran as fast in twice the steps)
    avx2 = StepCosts(fixed_s=0.001, per_request_s=0.02, per_token_s=0.004, steps=200)
    assert not wider_batch_pays(avx2, 1)
    # unmeasured (or nothing running, or a fit with no cost at all): as before pricing, it pays
    assert wider_batch_pays(None, 12) and wider_batch_pays(amx, 0)
    assert wider_batch_pays(StepCosts(0.0, 0.0, 0.0, steps=8), 3)


def test_a_recompute_outweighs_the_windows_work_only_past_the_factor_and_only_once_a_step_is_priced():
    assert recompute_outweighs(THRESHOLD_S * 1.01, STEP_S)
    assert not recompute_outweighs(THRESHOLD_S * 0.99, STEP_S)
    assert not recompute_outweighs(100.0, None)  # the engine's steps are not measured yet: never on a guess


def test_the_gate_starts_idle_and_stays_idle_while_compression_buys_nothing():
    gate = CompressionGate()
    for step in range(1, 300):  # a decode-heavy burst: a page or two spared, cheap preemptions
        assert not gate.step(GateStep(step, pages_saved=2, pages_per_request=5.0, recompute_s=0.06, step_s=STEP_S))
    assert gate.reason == "idle"


def test_width_opens_the_gate_for_a_window_and_it_closes_when_the_width_is_gone():
    gate = CompressionGate(window_steps=8)
    assert gate.step(GateStep(1, pages_saved=6, pages_per_request=5.0)) and gate.reason == "width"
    assert all(gate.step(GateStep(step, pages_saved=6, pages_per_request=5.0)) for step in range(2, 20))
    # the compacted requests finished: their pages are no longer held free
    assert all(gate.step(GateStep(step, pages_saved=0, pages_per_request=5.0)) for step in range(20, 27))
    assert not gate.step(GateStep(27, pages_saved=0, pages_per_request=5.0)) and gate.reason == "idle"


def test_a_dear_preemption_opens_the_gate_so_the_next_ones_are_avoided():
    gate = CompressionGate()
    assert not gate.step(GateStep(1, 0, 5.0, recompute_s=THRESHOLD_S / 2, step_s=STEP_S))
    assert gate.step(GateStep(2, 0, 5.0, recompute_s=THRESHOLD_S * 4, step_s=STEP_S)) and gate.reason == "recompute"
    assert gate.step(GateStep(1 + GATE_WINDOW_STEPS, 0, 5.0))
    assert not gate.step(GateStep(2 + GATE_WINDOW_STEPS, 0, 5.0))


def test_a_homes_step_gate_says_why_compression_runs_each_step():
    """The enforce log writes it beside each compaction: none may say idle."""
    off, gated = StepGate(), StepGate(CompressionGate(window_steps=4))
    assert off.reason == "off" and not off.step(dropped_tokens=0, pages_held=[5], block_size=32, costs=lambda: None)
    assert gated.step(dropped_tokens=0, pages_held=[5], block_size=32, costs=lambda: None)  # idle
    assert gated.reason == "idle"
    assert not gated.step(dropped_tokens=5 * 32, pages_held=[5, 5], block_size=32, costs=lambda: None)
    assert gated.reason == "width"
