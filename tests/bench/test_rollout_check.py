"""The forecast before enforce, judged (``growpage.bench.rollout``): a monitor run's forecast read as
``gpctl calibrate`` reads a window, its recommendation against what enforce then did."""

from __future__ import annotations

import pytest

from growpage.bench.goodput import answers_comparison
from growpage.bench.headline import verdict
from growpage.bench.rollout import rollout_check, rollout_lines, run_evidence, schedule_changed
from growpage.rollout import ENFORCE, STAY_IN_MONITOR


def _monitor_run(*, avoidable: int, recompute_s: float, wider_s: float, own_s: float) -> dict:
    """A monitor run as ``gpctl bench`` records it: the forecast's totals and GrowPage's own time."""
    return {"forecast": {"pages_freed": 14, "compactions": 14, "preemptions": 9, "preemptions_avoidable": avoidable,
                         "spare_pages": 0, "preemptions_avoidable_by_admission": 0,
                         "recompute_seconds_avoidable": recompute_s, "wider_batch_seconds": wider_s},
            "own_time": {"own_s": {"scheduler": own_s / 4, "worker": own_s * 3 / 4},
                         "step_s": {"scheduler": 1.0, "worker": 9.0}}}


def test_a_run_reads_as_a_window_own_seconds_from_both_sides():
    evidence = run_evidence(_monitor_run(avoidable=2, recompute_s=0.1, wider_s=0.2, own_s=0.5))
    assert evidence.own_seconds == pytest.approx(0.5) and evidence.own_share == pytest.approx(0.05)
    assert (evidence.preemptions_avoidable, evidence.recompute_seconds_avoidable) == (2, 0.1)
    # a run from before the saving was forecast: nothing to weigh, the count alone decides
    older = {"forecast": {"pages_freed": 14, "compactions": 14, "preemptions": 9, "preemptions_avoidable": 2}}
    assert run_evidence(older).recompute_seconds_avoidable is None and run_evidence(older).own_seconds is None


@pytest.mark.parametrize(("saved_s", "enforce_vs_vllm", "verdict_wanted", "right"), [
    (0.1, 0.94, STAY_IN_MONITOR, True),  # saves less than it costs, and enforce was slower: right
    (3.0, 1.12, ENFORCE, True),  # saves more, and enforce was faster: right
    (3.0, 0.96, ENFORCE, False),  # recommended enforce where it lost: wrong, and said so
    (0.1, 1.05, STAY_IN_MONITOR, False),  # held back where enforce would have won
])
def test_the_verdict_is_right_only_where_it_says_enforce_exactly_when_enforce_beat_vllm_alone(
        saved_s, enforce_vs_vllm, verdict_wanted, right):
    runs = [_monitor_run(avoidable=2, recompute_s=saved_s / 2, wider_s=saved_s / 2, own_s=0.5)] * 3
    result = rollout_check(runs, enforce_vs_vllm, measured_net_s=0.25)
    assert result["verdict"] == verdict_wanted and result["verdicts"] == [verdict_wanted] * 3
    assert result["right"] is right and result["enforce_paid"] is (enforce_vs_vllm > 1.0)
    assert result["saved_s"] == [pytest.approx(saved_s)] * 3 and result["own_s"] == [0.5] * 3
    # the time itself, beside the verdict: the forecast's saving less its own, and vLLM's wall time less enforce's
    assert result["forecast_net_s"] == pytest.approx(saved_s - 0.5) and result["measured_net_s"] == 0.25


def test_the_rounds_most_common_verdict_decides():
    runs = [_monitor_run(avoidable=2, recompute_s=0.1, wider_s=0.0, own_s=0.5),
            _monitor_run(avoidable=2, recompute_s=1.5, wider_s=0.0, own_s=0.5),
            _monitor_run(avoidable=2, recompute_s=0.2, wider_s=0.0, own_s=0.5)]
    result = rollout_check(runs, 0.95)
    assert result["verdicts"] == [STAY_IN_MONITOR, ENFORCE, STAY_IN_MONITOR]
    assert result["forecast_net_s"] == -0.3 and result["measured_net_s"] is None  # the median round's net
    assert result["verdict"] == STAY_IN_MONITOR and result["right"]
    with pytest.raises(ValueError, match="at least one monitor run"):
        rollout_check([], 1.0)


def _schedule(steps: int, preemptions: int) -> list[dict]:
    return [{"steps": steps, "preemptions": preemptions, "elapsed_s": 10.0}] * 3


def test_enforce_changed_the_schedule_only_with_fewer_steps_or_fewer_preemptions():
    alone = _schedule(299, 9)
    assert schedule_changed(alone, _schedule(299, 9)) is False
    assert schedule_changed(alone, _schedule(305, 9)) is False  # more steps buy nothing
    assert schedule_changed(alone, _schedule(297, 9)) is True
    assert schedule_changed(alone, _schedule(301, 6)) is True
    # runs from before the counts were recorded: unknown, and the speed alone decides as before
    assert schedule_changed([{"elapsed_s": 10.0}], _schedule(299, 9)) is None and schedule_changed([], alone) is None


@pytest.mark.parametrize(("verdict_wanted", "saved_s", "right"), [
    (STAY_IN_MONITOR, 0.1, True), (ENFORCE, 3.0, False)])
def test_a_faster_enforce_in_vllm_alones_schedule_is_the_hosts_noise_and_did_not_pay(verdict_wanted, saved_s, right):
    runs = [_monitor_run(avoidable=2, recompute_s=saved_s / 2, wider_s=saved_s / 2, own_s=0.5)] * 3
    result = rollout_check(runs, 1.026, changed_schedule=False)
    assert result["verdict"] == verdict_wanted
    assert result["enforce_paid"] is False and result["schedule_changed"] is False and result["right"] is right
    line = rollout_lines({"headlines": [{"seed": 41, "verdict": {"rollout": result}}]})[0]
    assert "enforce ran 1.026x vLLM alone in vLLM alone's engine steps and preemptions" in line
    # the same speed in a schedule enforce changed did pay
    assert rollout_check(runs, 1.026, changed_schedule=True)["enforce_paid"] is True


def _speed_point(speed: float, runs: list[dict] | None = None) -> dict:
    return {"tokens_per_s": {"median": speed, "range": [speed, speed], "values": [speed]}, "nll_increase": 0.0,
            "preemptions": [0], "mean_blocks_per_running": {"median": 5.0}, "goodput": {"answerable": 0},
            "runs": runs or [{"elapsed_s": 1000.0 / speed}]}


def test_the_headline_judges_the_recommendation_against_enforce_over_untuned_vllm_alone():
    monitor = _speed_point(95.0, [_monitor_run(avoidable=2, recompute_s=0.05, wider_s=0.0, own_s=0.5)] * 3)
    variants = {"vllm": _speed_point(100.0), "vllm@seqs4": _speed_point(90.0), "monitor": monitor,
                "growpage": _speed_point(94.0), "limit": _speed_point(150.0)}
    rollout = verdict(variants)["rollout"]
    assert rollout["verdict"] == STAY_IN_MONITOR and rollout["enforce_vs_vllm"] == 0.94 and rollout["right"]
    assert rollout["measured_net_s"] == pytest.approx(10.0 - 1000.0 / 94.0, abs=1e-3)
    assert verdict({name: point for name, point in variants.items() if name != "monitor"})["rollout"] is None
    # enforce faster than vLLM alone in its very steps and preemptions: noise, judged as not paid
    same = {**variants, "vllm": _speed_point(100.0, _schedule(299, 9)),
            "growpage": _speed_point(102.0, _schedule(299, 9))}
    assert verdict(same)["rollout"]["enforce_paid"] is False and verdict(same)["rollout"]["right"]
    fewer = {**same, "growpage": _speed_point(102.0, _schedule(290, 9))}
    assert verdict(fewer)["rollout"]["enforce_paid"] is True and not verdict(fewer)["rollout"]["right"]


def _answers_point(correct_per_s: float, runs: list[dict] | None = None) -> dict:
    spread = {"median": correct_per_s, "range": [correct_per_s, correct_per_s], "values": [correct_per_s]}
    return {"accuracy": {"median": 1.0}, "correct_per_s": spread, "elapsed_s": {"median": 16.0 / correct_per_s},
            "runs": runs or []}


def test_retrieval_judges_it_against_correct_answers_per_second():
    # no preemption anywhere: what enforce buys is the wider batch its compressed prompts let in
    monitor = _answers_point(1.9, [_monitor_run(avoidable=0, recompute_s=0.0, wider_s=2.5, own_s=0.4)] * 3)
    variants = {"vllm": _answers_point(2.0), "monitor": monitor, "growpage": _answers_point(2.3)}
    rollout = answers_comparison(variants)["rollout"]
    assert rollout["verdict"] == ENFORCE and rollout["enforce_vs_vllm"] == 1.15 and rollout["right"]
    assert rollout["measured_net_s"] == pytest.approx(16.0 / 2.0 - 16.0 / 2.3, abs=1e-3)


def test_each_judged_trace_prints_one_line_with_its_verdict_and_whether_enforce_bore_it_out():
    stay = rollout_check([_monitor_run(avoidable=2, recompute_s=0.05, wider_s=0.0, own_s=0.5)], 0.94)
    go = rollout_check([_monitor_run(avoidable=0, recompute_s=0.0, wider_s=2.5, own_s=0.4)], 0.97)
    result = {"headlines": [{"seed": 39, "verdict": {"rollout": stay}}, {"seed": 40, "verdict": {"rollout": None}}],
              "retrieval": {"comparison": {"rollout": go}}, "mixed": {"comparison": {"rollout": stay}}}
    lines = rollout_lines(result)
    assert lines[0] == ("headline seed 39: calibrate from monitor's forecast says stay_in_monitor (saved [0.05] s "
                        "against GrowPage's own [0.5] s); enforce ran 0.940x vLLM alone: right")
    timed = rollout_check([_monitor_run(avoidable=2, recompute_s=0.05, wider_s=0.0, own_s=0.5)], 0.94, -0.41)
    assert rollout_lines({"headlines": [{"seed": 39, "verdict": {"rollout": timed}}]})[0].endswith(
        "right (net seconds forecast -0.45, measured -0.41)")
    assert lines[1].startswith("retrieval: calibrate from monitor's forecast says enforce")
    assert lines[1].endswith("0.970x vLLM alone: wrong")
    assert lines[2].startswith("mixed: calibrate from monitor's forecast says stay_in_monitor")
    assert len(lines) == 3 and rollout_lines({}) == []
