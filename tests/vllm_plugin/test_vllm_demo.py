"""The main job (`make run`): vLLM alone, then vLLM + GrowPage, on the packaged model under KV pressure."""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console

from support.vllm_guard import require_vllm_plugin

require_vllm_plugin()

from growpage.demos.vllm_engine import VllmDemoSettings, prompts_for, run_vllm_demo  # noqa: E402
from growpage.tooling.vllm_runs import run_engine  # noqa: E402

# Smaller than --quick: two engine starts, each serving its variant's reasoning, (forced,) retrieval runs.
# 24 blocks hold one retrieval question (~600 tokens) but not every reasoning request at full length.
SETTINGS = VllmDemoSettings(requests=8, max_tokens=64, kv_blocks=24, report_interval_s=0.5,
                            retrieval_families=("code",), retrieval_depths=(0.35, 0.9))


@pytest.fixture(scope="module")
def demo_run(prepared_model_dir):
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, force_terminal=False, color_system=None)
    summary = run_vllm_demo(str(prepared_model_dir), SETTINGS, console=console)
    return summary, buffer.getvalue()


def test_the_workload_needs_more_kv_than_the_space_holds():
    # each request needs at least 2 blocks of 32 for its prompt and 64 new tokens: vLLM alone must queue or preempt
    assert SETTINGS.requests * 3 > SETTINGS.kv_blocks - 1
    assert len(set(prompts_for(SETTINGS))) == SETTINGS.requests


def test_both_runs_finish_every_request_and_return_every_block(demo_run):
    summary, _ = demo_run
    for name, variant in summary["variants"].items():
        assert variant["generated_tokens"] == SETTINGS.requests * SETTINGS.max_tokens, name
    assert summary["blocks_leaked"] == {"vllm": 0, "growpage": 0}


def test_a_demo_whose_kv_space_cannot_hold_one_retrieval_question_says_how_large_it_must_be(prepared_model_dir):
    from growpage.errors import GrowPageError

    with pytest.raises(GrowPageError, match=r"raise kv_blocks to \d+ or shorten retrieval_context_tokens"):
        run_vllm_demo(str(prepared_model_dir), dataclasses.replace(SETTINGS, kv_blocks=12),
                      console=Console(file=io.StringIO()))


def test_growpage_decides_inside_vllm_and_preempts_no_more_than_vllm_alone(demo_run):
    summary, _ = demo_run
    base, grow = summary["variants"]["vllm"], summary["variants"]["growpage"]
    assert base["decisions"] == {}  # vLLM alone runs no GrowPage code
    assert sum(grow["decisions"].values()) > 0
    assert grow["preemptions"] <= base["preemptions"]
    assert 0.0 <= summary["mean_matched_share"] <= 1.0


def test_progress_and_table_read_well_in_80_columns_without_a_tty(demo_run):
    _, output = demo_run
    lines = output.splitlines()
    assert any(line.startswith("vLLM alone") and " kv " in line for line in lines)
    assert any(line.startswith("+GrowPage") for line in lines)
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "…" not in output  # no truncated header or cell
    for measure in ("tokens/s", "peak running", "preemptions", "decisions", "KV compressed", "grant p99",
                    "same answer", "NLL +nats/token", "retrieval correct", "retrieval correct/s"):
        assert measure in output


def test_retrieval_in_the_same_kv_space_keeps_the_answers_vllm_alone_gives(demo_run):
    summary, _ = demo_run
    retrieval = summary["retrieval"]
    assert len(retrieval["tasks"]) == 2 and retrieval["blocks_needed"] > retrieval["kv_blocks"] - 1  # under pressure
    base, grow = retrieval["variants"]["vllm"], retrieval["variants"]["growpage"]
    assert tuple(base["correct"]) == (2, 2)  # the packaged model finds both codes
    assert tuple(grow["correct"]) == (2, 2)  # GrowPage's default floor follows the question's attention
    # at the default (admission auto: growth-aware on the CPU build) GrowPage may start the second
    # question once it fits rather than compress a prompt; either way every block comes back
    assert grow["blocks_total"] == grow["blocks_free_at_end"]


def test_a_run_on_a_shared_engine_cannot_change_the_engine():
    with pytest.raises(ValueError, match="'kv_blocks' needs an engine of its own"):
        run_engine({"variant": "vllm"}, [{"prompts": ["hi"]}, {"kv_blocks": 3}], lambda report: None, 10.0)


def test_the_default_admission_measured_the_engine_it_ran_in(demo_run):
    # auto times vLLM's own steps and fits their cost; the run records what it read and how often it looked ahead
    summary, _ = demo_run
    admission = summary["variants"]["growpage"]["admission"]
    assert admission["policy"] == "measured"
    costs = admission["step_costs"]
    assert costs is not None and costs["steps"] >= 16 and costs["fixed_s"] + costs["per_request_s"] > 0, costs
    assert 0.0 <= admission["lookahead_share"] <= 1.0
    assert summary["variants"]["vllm"]["admission"] is None  # vLLM alone: no agent, nothing measured
