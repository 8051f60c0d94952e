"""The fleet benchmark's trace and arithmetic (the run itself starts vLLM: ``gpctl bench fleet``)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpctl.main import app
from growpage.bench.fleet import (
    VARIANTS,
    FleetBenchSettings,
    medians,
    refresh,
    round_order,
    setup_record,
    skewed_trace,
    summarize,
    table,
    verdict,
)


def test_the_trace_alternates_questions_with_true_answers_and_long_generations():
    settings = FleetBenchSettings.quick()
    trace = skewed_trace(settings)
    families = [task.family for task in trace]
    assert families.count("reasoning") == settings.reasoning and len(trace) == settings.retrieval + settings.reasoning
    assert families[:4] == ["passkey", "reasoning", "reasoning", "passkey"]  # both kinds on both replicas
    assert all(task.answer for task in trace)  # every request is scored against a true answer
    assert skewed_trace(settings) == trace  # deterministic per seed


def test_summary_counts_preemptions_on_every_replica_and_correct_answers_per_second():
    results = [{"family": "passkey", "correct": True, "ttft_s": 0.5, "gaps_s": [0.1, 0.2], "started_s": 10.0,
                "finished_s": 12.0, "tokens": 3},
               {"family": "reasoning", "correct": False, "ttft_s": 1.5, "gaps_s": [0.3], "started_s": 11.0,
                "finished_s": 14.0, "tokens": 2},
               {"family": "code", "error": "503", "correct": False}]
    before = [{"preemptions": 2.0, "finished": 5.0}, {"preemptions": 0.0, "finished": 1.0}]
    after = [{"preemptions": 5.0, "finished": 6.0}, {"preemptions": 1.0, "finished": 2.0}]
    summary = summarize(results, before, after)
    assert summary["preemptions"] == 4.0 and summary["finished_per_replica"] == [1.0, 1.0]
    assert summary["errors"] == 1 and summary["correct"] == 1 and summary["retrieval_correct"] == 1
    assert summary["span_s"] == 4.0 and summary["correct_per_s"] == pytest.approx(0.25)
    assert summary["tokens_per_s"] == pytest.approx(5 / 4.0) and summary["answer_p99_s"] == pytest.approx(2.0)
    # the one percentile of the project (linear between ranks): p99 of [0.5, 1.5] and of [0.1, 0.2, 0.3]
    assert summary["ttft_p99_s"] == pytest.approx(1.49) and summary["itl_p99_s"] == pytest.approx(0.298)


def _round(preemptions: float, ttft: float, itl: float, correct: int, per_s: float) -> dict:
    return {"requests": 20, "retrieval": 8, "errors": 0, "retrieval_correct": 8, "span_s": 60.0,
            "preemptions": preemptions, "ttft_p99_s": ttft, "itl_p99_s": itl, "correct": correct,
            "correct_per_s": per_s, "finished_per_replica": [7.0, 13.0]}


def test_rounds_alternate_their_order_and_report_medians_with_ranges():
    names = ("round_robin", "power_of_two_vllm", "growpage")
    assert round_order(names, 0) == names and round_order(names, 1) == tuple(reversed(names))
    assert FleetBenchSettings().repeats >= 2 and FleetBenchSettings.quick().repeats == 1
    summary = medians([_round(0, 3.0, 1.0, 8, 0.2), _round(2, 9.0, 1.2, 8, 0.3), _round(1, 4.0, None, 9, 0.1)])
    assert summary["preemptions"] == 1 and summary["preemptions_range"] == [0, 2]
    assert summary["ttft_p99_s"] == 4.0 and summary["itl_p99_s"] == pytest.approx(1.1)  # a round without gaps
    assert summary["finished_per_replica"] == [7.0, 13.0]
    line = table({"variants": {"growpage": summary}}).splitlines()[1]
    assert line.startswith("growpage") and "4.00 [3.00-9.00]" in line and "1 [0-2]" in line


def test_the_verdict_needs_every_number_better_than_both_baselines():
    fleet = {"round_robin": medians([_round(1, 20.0, 1.0, 8, 0.18)]),
             "power_of_two_vllm": medians([_round(3, 4.0, 2.0, 8, 0.19)]),
             "growpage": medians([_round(0, 3.5, 0.9, 8, 0.20)])}
    result = verdict(fleet)
    assert result["target_met"] and set(result["against"]) == {"round_robin", "power_of_two_vllm"}
    fleet["growpage"] = medians([_round(0, 10.0, 0.9, 8, 0.20)])  # slower first token than power_of_two
    result = verdict(fleet)
    assert not result["target_met"] and result["against"]["power_of_two_vllm"]["lower_ttft_p99"] is False
    assert result["against"]["round_robin"] == {"fewer_preemptions": True, "lower_ttft_p99": True,
                                                "lower_itl_p99": True, "accuracy_at_least": True}
    assert verdict({"round_robin": fleet["round_robin"]}) == {}


@pytest.mark.parametrize(("args", "message"), [
    (["--variant", "fastest"], "unknown"),
    (["--retrieval", "0", "--reasoning", "0"], "the trace is empty"),
    (["--kv-blocks", "66"], "give it twice"),
    (["--kv-blocks", "20", "--kv-blocks", "99"], "at least 33 blocks"),
])
def test_bad_input_exits_2_with_one_line(args, message):
    result = CliRunner().invoke(app, ["bench", "fleet", *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def _engine_flags(argv: list[str]) -> dict[str, str]:
    wanted = ("--max-num-seqs", "--max-num-batched-tokens", "--max-model-len", "--served-model-name")
    return {flag: argv[argv.index(flag) + 1] for flag in wanted if flag in argv}


def test_every_arm_runs_vllm_with_the_same_engine_arguments(prepared_model_dir):
    """vLLM alone's CPU server defaults to 2048 tokens a step against gpctl serve's 512: an arm that
    differs in its prefill chunks would win or lose TTFT for a reason the table does not name."""
    import inspect

    from gpctl.commands.serve import serve

    settings = FleetBenchSettings(kv_blocks=(66, 66))
    flags = {name: [_engine_flags(replica["argv"]) for replica in replicas]
             for name, replicas in setup_record(settings, str(prepared_model_dir))["replica_commands"].items()}
    assert set(flags) == set(VARIANTS)
    first = flags["round_robin"][0]
    serve_default = inspect.signature(serve).parameters["max_num_batched_tokens"].default
    assert first["--max-num-batched-tokens"] == str(serve_default)
    assert all(replica == first for replicas in flags.values() for replica in replicas)


def test_the_record_names_what_ran(prepared_model_dir):
    record = setup_record(FleetBenchSettings(variants=("growpage_monitor", "growpage")), str(prepared_model_dir))
    assert set(record["resolved_growpage"]) == {"enforce", "monitor"}
    assert record["resolved_growpage"]["enforce"]["growpage"]["mode"] == "enforce"
    assert record["vllm_version"] and record["router_version"]
    kv = {replica["kv_blocks"] for replicas in record["replica_commands"].values() for replica in replicas}
    assert kv == {33, 99}


def test_a_report_gains_the_answer_latency_and_tokens_per_second_from_its_recorded_requests():
    """A question's answer waits for its last token; the span (and correct answers per second) waits
    for the longest generation, which the table must not pass off as the questions' latency."""
    requests = [{"family": "passkey", "correct": True, "started_s": 0.0, "finished_s": 2.0, "tokens": 4},
                {"family": "reasoning", "correct": False, "started_s": 0.5, "finished_s": 20.5, "tokens": 96},
                {"family": "code", "correct": True, "started_s": 1.0, "finished_s": 5.0, "tokens": 6},
                {"family": "code", "error": "503", "correct": False}]
    old_round = {**_round(0, 3.0, 1.0, 2, 0.1), "span_s": 20.5, "results": requests}
    old = {"variants": {"growpage": {"rounds": [old_round]}}}
    variant = refresh(old)["variants"]["growpage"]
    assert variant["answer_p99_s"] == pytest.approx(2.0 + 0.99 * 2.0)  # of 2 s and 4 s, the errored one left out
    assert variant["tokens_per_s"] == pytest.approx(106 / 20.5)
    assert variant["rounds"][0]["results"] == requests and variant["correct_per_s"] == 0.1
    line = table({"variants": {"growpage": variant}}).splitlines()[1]
    assert "3.98" in line and "5.2" in line
