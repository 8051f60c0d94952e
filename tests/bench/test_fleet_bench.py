"""The fleet benchmark's trace and arithmetic (the run itself starts vLLM: ``gpctl bench fleet``)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpctl.main import app
from growpage.bench.fleet import FleetBenchSettings, percentile, skewed_trace, summarize, table


def test_the_trace_alternates_questions_with_true_answers_and_long_generations():
    settings = FleetBenchSettings.quick()
    trace = skewed_trace(settings)
    families = [task.family for task in trace]
    assert families.count("reasoning") == settings.reasoning and len(trace) == settings.retrieval + settings.reasoning
    assert families[:4] == ["passkey", "reasoning", "reasoning", "passkey"]  # both kinds on both replicas
    assert all(task.answer for task in trace)  # every request is scored against a true answer
    assert skewed_trace(settings) == trace  # deterministic per seed


def test_percentile_is_nearest_rank():
    assert percentile([], 0.99) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0


def test_summary_counts_preemptions_on_every_replica_and_correct_answers_per_second():
    results = [{"family": "passkey", "correct": True, "ttft_s": 0.5, "gaps_s": [0.1, 0.2], "started_s": 10.0,
                "finished_s": 12.0},
               {"family": "reasoning", "correct": False, "ttft_s": 1.5, "gaps_s": [0.3], "started_s": 11.0,
                "finished_s": 14.0},
               {"family": "code", "error": "503", "correct": False}]
    before = [{"preemptions": 2.0, "finished": 5.0}, {"preemptions": 0.0, "finished": 1.0}]
    after = [{"preemptions": 5.0, "finished": 6.0}, {"preemptions": 1.0, "finished": 2.0}]
    summary = summarize(results, before, after)
    assert summary["preemptions"] == 4.0 and summary["finished_per_replica"] == [1.0, 1.0]
    assert summary["errors"] == 1 and summary["correct"] == 1 and summary["retrieval_correct"] == 1
    assert summary["span_s"] == 4.0 and summary["correct_per_s"] == pytest.approx(0.25)
    assert summary["ttft_p99_s"] == 1.5 and summary["itl_p99_s"] == 0.3
    assert "growpage" in table({"variants": {"growpage": summary}})


def test_an_unknown_variant_exits_2_with_one_line():
    result = CliRunner().invoke(app, ["bench", "fleet", "--variant", "fastest"])
    assert result.exit_code == 2 and "unknown" in result.output and "Traceback" not in result.output
