"""Growth-aware admission's arithmetic: projections to full KV or to GrowPage's floor, who starts,
the learned shares, and the measured step costs that say whether looking ahead pays."""

from __future__ import annotations

from growpage.core.admission import (
    MIN_FINISHED,
    CompletionHistory,
    Compression,
    KVDemand,
    StepCostFit,
    StepCosts,
    admissible,
    full_peak_tokens,
    lookahead_pays,
    projected_demand,
    standing_need_share,
)

GROWPAGE = Compression(base_pages=4, sink_tokens=4, recent_window_tokens=64)  # a 128-token floor at 32


def test_a_request_is_projected_to_its_max_tokens_scaled_by_the_output_share():
    assert full_peak_tokens(100, output_tokens=20, max_tokens=160, output_share=1.0) == 240
    assert full_peak_tokens(100, output_tokens=20, max_tokens=160, output_share=0.5) == 170
    assert full_peak_tokens(100, output_tokens=200, max_tokens=160, output_share=1.0) == 100  # past max: nothing


def test_a_request_vllm_pages_is_projected_to_full_kv():
    assert projected_demand("a", pages_now=3, peak_tokens=256, block_size=32) == KVDemand("a", 3, 8)


def test_a_compressed_request_is_projected_to_its_floor_at_its_end_never_above_full_kv():
    # observed attention needs 30 % of its tokens: 77 of 256, 3 pages and the next token's: 4; base 4
    needy = Compression(4, 4, 64, need_share=0.3)
    assert projected_demand("a", pages_now=3, peak_tokens=256, block_size=32, compression=needy).peak_pages == 4
    # needing 60 %: 154 tokens, 5 pages + 1
    assert projected_demand("a", pages_now=3, peak_tokens=256, block_size=32,
                            compression=Compression(4, 4, 64, need_share=0.6)).peak_pages == 6
    # not observed yet: the learned share stands in (1.0 before any request finished: full KV)
    assert projected_demand("a", pages_now=3, peak_tokens=256, block_size=32, compression=GROWPAGE).peak_pages == 8
    assert projected_demand("a", pages_now=3, peak_tokens=256, block_size=32, compression=GROWPAGE,
                            learned_need_share=0.3).peak_pages == 4
    # a fixed cap keeps no attention need: its cap
    cap = Compression(5, 4, 64, need_share=0.0)
    assert projected_demand("a", pages_now=7, peak_tokens=256, block_size=32, compression=cap).peak_pages == 5


def test_waiting_requests_start_in_order_while_the_projected_peaks_fit():
    running = [KVDemand("r1", 3, 8), KVDemand("r2", 3, 8)]
    waiting = [KVDemand(f"w{i}", 0, 8) for i in range(4)]
    assert admissible(running, waiting, total_pages=39) == 2  # 16 + 8 + 8 = 32; a fifth 8 makes 40
    assert admissible(running, waiting, total_pages=15) == 0
    # queue order: a large head is not skipped for a small one behind it (no starvation)
    assert admissible(running, [KVDemand("big", 0, 30), KVDemand("small", 0, 1)], total_pages=39) == 0


def test_an_empty_batch_always_takes_its_first_request():
    assert admissible([], [KVDemand("huge", 0, 500), KVDemand("next", 0, 1)], total_pages=39) == 1


def test_shares_stay_one_until_enough_requests_finished_then_follow_a_high_quantile():
    history = CompletionHistory()
    for _ in range(MIN_FINISHED - 1):
        history.record(output_tokens=40, max_tokens=160, need_share=0.5)
    assert (history.shares().output_share, history.shares().need_share) == (1.0, None)  # the caller stands in
    history.record(output_tokens=40, max_tokens=160, need_share=0.5)
    shares = history.shares()
    assert (shares.output_share, shares.need_share, shares.finished) == (0.25, 0.5, MIN_FINISHED)
    for _ in range(20):  # a run of long answers raises the share: admission plans for the long ones
        history.record(output_tokens=160, max_tokens=160)
    assert history.shares().output_share == 1.0
    assert history.shares().need_share == 0.5  # requests whose attention was not observed say nothing of it


def test_history_forgets_old_traffic():
    history = CompletionHistory(history=8)
    for _ in range(8):
        history.record(output_tokens=160, max_tokens=160)
    for _ in range(8):
        history.record(output_tokens=16, max_tokens=160)
    assert history.shares().output_share == 0.1


def test_before_requests_finish_an_unobserved_request_is_planned_like_the_neediest_running_one():
    assert standing_need_share(0.2, [Compression(4, 4, 64, need_share=0.9)]) == 0.2  # learned wins
    running = [Compression(4, 4, 64, need_share=0.1), Compression(4, 4, 64, need_share=0.4), None,
               Compression(4, 4, 64, need_share=None)]
    assert standing_need_share(None, running) == 0.4
    assert standing_need_share(None, [None, Compression(4, 4, 64)]) == 1.0  # nothing observed: every token


def _steps(fit: StepCostFit, *, fixed: float, per_request: float, per_token: float) -> None:
    """Steps as an engine runs them: decode at widths 1-8, every fifth step prefilling a prompt."""
    for step in range(64):
        requests = 1 + step % 8
        extra = 200 if step % 5 == 0 else 0
        seconds = fixed + per_request * requests + per_token * extra
        fit.record(requests=requests, tokens=requests + extra, seconds=seconds)


def test_a_step_cost_fit_recovers_the_fixed_per_request_and_per_token_parts():
    fit = StepCostFit()
    _steps(fit, fixed=0.012, per_request=0.0029, per_token=0.0002)
    costs = fit.costs()
    assert costs is not None and costs.steps == 64
    assert (round(costs.fixed_s, 6), round(costs.per_request_s, 6), round(costs.per_token_s, 6)) == \
        (0.012, 0.0029, 0.0002)


def test_a_fit_waits_until_the_steps_can_price_a_token():
    fit = StepCostFit()
    for _ in range(100):  # no prefill: what a recompute costs is unknown
        fit.record(requests=4, tokens=4, seconds=0.03)
    assert fit.costs() is None
    fit.record(requests=0, tokens=0, seconds=1.0)  # an empty step teaches nothing
    fit.record(requests=2, tokens=2, seconds=-1.0)  # nor a clock that went backwards
    assert len(fit) == 100
    widths = StepCostFit()
    for step in range(40):
        widths.record(requests=1 + step % 4, tokens=1 + step % 4, seconds=0.01 + 0.002 * (1 + step % 4))
    assert widths.costs() is None  # widths vary, but no step prefilled: a recompute's price is unknown


def test_steps_at_one_width_give_the_whole_intercept_as_fixed_so_a_holding_prior_cannot_keep_itself_on():
    """A prior that looks ahead can hold the batch at one width for a whole run; the fit must then
    still answer (it used to wait for a second width, which the held batch never reached)."""
    fit = StepCostFit()
    for step in range(40):  # four requests all along, a prompt prefilled every tenth step
        extra = 300 if step % 10 == 0 else 0
        fit.record(requests=4, tokens=4 + extra, seconds=0.02 + 4 * 0.003 + 0.0008 * extra)
    costs = fit.costs()
    assert costs is not None  # priced: fixed and per-request in one, as fixed
    assert (round(costs.fixed_s, 6), costs.per_request_s, round(costs.per_token_s, 6)) == (0.032, 0.0, 0.0008)
    # read so, the width is worth the most it can be: a host whose steps are mostly fixed admits
    assert not lookahead_pays(costs, width=4, output_tokens=160, recompute_tokens=300)
    for step in range(40):  # once admitting changes the width, the parts come apart
        fit.record(requests=2 + step % 6, tokens=2 + step % 6, seconds=0.02 + (2 + step % 6) * 0.003)
    costs = fit.costs()
    assert costs is not None and round(costs.fixed_s, 6) == 0.02 and round(costs.per_request_s, 6) == 0.003


def test_the_fit_follows_the_newest_steps():
    fit = StepCostFit(window=64)
    _steps(fit, fixed=0.5, per_request=0.5, per_token=0.5)
    _steps(fit, fixed=0.012, per_request=0.0029, per_token=0.0002)  # the host changed (or warmed up)
    costs = fit.costs()
    assert costs is not None and round(costs.fixed_s, 6) == 0.012


def test_noise_below_zero_reads_as_no_cost():
    fit = StepCostFit()
    _steps(fit, fixed=-0.001, per_request=0.01, per_token=0.0001)
    costs = fit.costs()
    assert costs is not None and costs.fixed_s == 0.0 and costs.per_request_s > 0


def test_holding_pays_where_a_recompute_costs_more_than_the_width():
    # a step whose time grows with each request and prefill that costs what decode does per token
    # (a CPU without wide vector units): a recompute of 180 tokens dwarfs what one more request saves
    compute_bound = StepCosts(fixed_s=0.0135, per_request_s=0.0265, per_token_s=0.0265, steps=64)
    assert lookahead_pays(compute_bound, width=5, output_tokens=160, recompute_tokens=180)
    # a large fixed part and batched prefill (an AVX-512 CPU, a GPU): the width is worth more
    fixed_dominated = StepCosts(fixed_s=0.012, per_request_s=0.0029, per_token_s=0.0002, steps=64)
    assert not lookahead_pays(fixed_dominated, width=5, output_tokens=160, recompute_tokens=180)
    # the same host with a wide batch already: one more request shares little, the recompute stays
    assert lookahead_pays(fixed_dominated, width=64, output_tokens=160, recompute_tokens=180)
    # short answers share few steps: holding their start costs little
    assert lookahead_pays(fixed_dominated, width=5, output_tokens=4, recompute_tokens=180)


def test_the_history_learns_how_long_answers_run():
    history = CompletionHistory()
    assert history.shares().output_tokens is None
    for tokens in (100, 200):
        history.record(output_tokens=tokens, max_tokens=256)
    assert history.shares().output_tokens == 150
