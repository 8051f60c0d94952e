"""The quality and serving benchmarks run end to end on the packaged model (tiny sizes) and produce
the JSON shape and plots that docs/BENCHMARKS.md is built from."""

from __future__ import annotations

import pytest

from growpage.bench import harness, plots
from growpage.bench.quality import QualitySettings, pareto_front, run_quality_bench
from growpage.bench.serving import ServingSettings, median_run, run_serving_bench, verdict


@pytest.fixture(scope="module")
def loaded(prepared_model_dir, llama_model, tokenizer):
    return harness.Loaded(str(prepared_model_dir), llama_model, tokenizer)


@pytest.fixture(scope="module")
def quality(loaded):
    settings = QualitySettings(methods=("full_kv", "h2o", "growpage"), budgets=(6,), reasoning=1,
                               reasoning_max_tokens=40, retrieval_context_tokens=(256,), retrieval_depths=(0.5,),
                               retrieval_max_tokens=12, summaries=1, summary_max_tokens=8)
    return run_quality_bench(loaded.model_dir, settings, loaded=loaded)


def test_quality_compares_every_method_with_full_kv(quality):
    labels = [r["label"] for r in quality["results"]]
    assert labels == ["full_kv", "h2o@6", "growpage@6"]
    full = quality["results"][0]
    # Full KV against itself: perfect agreement, zero NLL delta, the byte reference.
    assert full["agree_prefix_fraction"] == 1.0 and full["nll_delta"] == 0.0
    assert full["kv_bytes_ratio_to_full"] == 1.0
    for result in quality["results"]:
        assert 0.0 <= result["agree_prefix_fraction"] <= 1.0
        # scored against true answers: the pass key, and the reasoning prompt's true result, apart
        assert set(result["accuracy"]) == {"retrieval", "reasoning"} and result["correct_per_s"] >= 0
        assert result["kv_bytes_peak"] >= result["kv_bytes_mean"] > 0
        for row in result["tasks"]:
            assert row["kv_bytes_mean"] % 1 == 0 and {"nll", "nll_delta", "agree_prefix_tokens"} <= row.keys()


def test_quality_h2o_holds_its_budget_while_full_kv_grows(quality):
    full, h2o = quality["results"][0], quality["results"][1]
    page_bytes = 16 * quality["kv_bytes_per_token_fp16"]
    # The 256-token retrieval prompt is 17+ pages: H2O compresses it to its 6-page budget.
    assert h2o["kv_bytes_mean"] < full["kv_bytes_mean"]
    assert h2o["decisions"].get("evict", 0) >= 1
    assert max(r["kv_bytes_peak"] for r in h2o["tasks"] if r["kind"] == "retrieval") > 6 * page_bytes  # before


def test_quality_records_a_decision_timeline_for_growpage(quality):
    timeline = quality["timeline"]
    assert timeline["method"] == "growpage" and timeline["signals"]
    assert {"sts_density", "lts_entropy", "pages_held", "tokens"} <= timeline["signals"][0].keys()


def test_serving_runs_every_method_at_every_pool_and_plots(loaded, quality, tmp_path):
    settings = ServingSettings(methods=("full_kv", "growpage"), pool_fractions=(0.5, 1.0), reasoning=2,
                               reasoning_max_tokens=20, summaries=1, summary_max_tokens=6, rate_per_s=50.0,
                               base_pages=6, retrieval=1, fidelity=True)
    serving = run_serving_bench(loaded.model_dir, settings, loaded=loaded)
    assert len(serving["runs"]) == 2 * len(serving["pools"])
    assert set(serving["verdicts"]) == {"growpage"}
    expected_tokens = sum(a["max_tokens"] for a in serving["arrivals"])
    for run in serving["runs"]:
        assert run["output_tokens"] == expected_tokens  # ignore_eos: every method does the same work
        assert run["tokens_per_s"] > 0 and run["itl_p99_ms"] >= run["itl_p50_ms"] > 0
        assert run["peak_running"] >= 1
        full = next(r for r in serving["runs"] if r["method"] == "full_kv" and r["pool_pages"] == run["pool_pages"])
        answered = {a["task"] for a in serving["arrivals"] if not a["task"].startswith("summary")}
        assert set(run["final_answers"]) == answered
        # against true answers (reasoning apart) and, forced through full KV's continuation, fidelity
        assert set(run["accuracy"]) == {"reasoning", "retrieval"} == set(run["correct_per_s"])
        if run["method"] == "full_kv":  # preemption recomputes: full KV's cache is full KV's
            assert abs(run["nll_increase"]) < 1e-3
        else:
            assert run["nll_increase"] is not None
        same = sum(run["final_answers"][t] == full["final_answers"][t] for t in full["final_answers"])
        assert run["answer_agreement"] == round(same / len(full["final_answers"]), 3)
    written = plots.write_all({"quality": quality, "serving": serving}, tmp_path)
    assert {p.name for p in written} == {"quality_pareto.png", "decision_timeline.png",
                                         "serving_throughput_latency.png", "serving_throughput_pool.png"}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)


def test_serving_fidelity_forces_growpage_at_the_coverage_it_served_with(loaded, monkeypatch):
    # The NLL beside a run must be that run's policy: a forced GrowPage at another coverage would
    # report another operating point's fidelity next to this one's tokens/s.
    built: list[tuple[str, float]] = []
    real = harness.build_engine

    def recording(loaded_model, method_name, **kwargs):
        built.append((method_name, kwargs.get("attention_coverage", 0.0)))
        return real(loaded_model, method_name, **kwargs)

    monkeypatch.setattr(harness, "build_engine", recording)
    settings = ServingSettings(methods=("full_kv", "growpage"), pool_fractions=(0.5,), reasoning=1,
                               reasoning_max_tokens=12, summaries=0, rate_per_s=50.0, base_pages=6,
                               fidelity=True, attention_coverage=0.8)
    serving = run_serving_bench(loaded.model_dir, settings, loaded=loaded)
    growpage_runs = [coverage for method, coverage in built if method == "growpage"]
    assert len(growpage_runs) == 2 and set(growpage_runs) == {0.8}  # served once, forced once
    assert serving["settings"]["attention_coverage"] == 0.8


def test_a_budget_pool_gives_every_method_the_same_memory_and_growpage_lives_within_it(loaded):
    # 8 reasoning sequences of ~11 pages each outlive the retrieval ones: about 90 pages wanted
    # from a 6 x 10 + 19 = 79-page pool
    settings = QualitySettings(methods=("full_kv", "h2o", "growpage"), budgets=(6,), reasoning=4,
                               reasoning_max_tokens=100, retrieval_context_tokens=(256,), retrieval_depths=(0.5,),
                               retrieval_max_tokens=12, summaries=0, pool="budget")
    result = run_quality_bench(loaded.model_dir, settings, loaded=loaded)
    full, h2o, growpage = result["results"]
    # GrowPage shares the pool instead of capping each request: under that pressure it compresses
    # (here, other requests too, before anyone is preempted) and holds fewer bytes than full KV
    # with free memory; H2O caps every request at its budget
    assert growpage["kv_bytes_mean"] < full["kv_bytes_mean"], (growpage, full)
    assert growpage["decisions"].get("evict", 0) + growpage["decisions"].get("quantize", 0) >= 1
    assert h2o["kv_bytes_mean"] < full["kv_bytes_mean"]
    with pytest.raises(ValueError, match="pool"):
        QualitySettings(pool="tiny")


def test_pareto_front_keeps_only_undominated_points():
    points = [{"label": "a", "kv_bytes_mean": 10, "answer_agreement": 1.0},
              {"label": "b", "kv_bytes_mean": 5, "answer_agreement": 0.9},
              {"label": "c", "kv_bytes_mean": 6, "answer_agreement": 0.8},  # dominated by b
              {"label": "d", "kv_bytes_mean": 3, "answer_agreement": None}]
    assert pareto_front(points) == ["a", "b"]


def test_verdict_reads_the_largest_pool_where_full_kv_preempts():
    runs = [{"method": "full_kv", "pool_pages": 40, "preemptions": 3, "tokens_per_s": 10.0, "itl_p99_ms": 900.0},
            {"method": "growpage", "pool_pages": 40, "preemptions": 0, "tokens_per_s": 21.0, "itl_p99_ms": 300.0},
            {"method": "full_kv", "pool_pages": 80, "preemptions": 0, "tokens_per_s": 20.0, "itl_p99_ms": 250.0},
            {"method": "growpage", "pool_pages": 80, "preemptions": 0, "tokens_per_s": 20.0, "itl_p99_ms": 260.0}]
    result = verdict(runs)
    assert result["pool_pages"] == 40 and result["tokens_per_s_ratio"] == 2.1
    assert result["meets_2x_throughput"] and result["itl_p99_no_worse"]
    assert verdict(runs[2:])["pool_pages"] is None


def test_a_calibration_trace_feeds_gpctl_calibrate_and_the_benchmarks_read_its_thresholds(loaded, tmp_path):
    """The rollout's monitoring phase end to end: monitor mode on the reference engine, its
    /metrics/growpage saved, gpctl calibrate on the snapshot, the config back into a benchmark."""
    from typer.testing import CliRunner

    from gpctl.main import app
    from growpage.bench.calibration import CalibrationSettings, run_calibration_trace
    from growpage.bench.harness import CALIBRATED_KEYS, build_engine, thresholds_from

    settings = CalibrationSettings(reasoning=3, reasoning_max_tokens=40, retrieval_context_tokens=(128,),
                                   retrieval_depths=(0.5,), retrieval_max_tokens=8, summaries=1,
                                   summary_max_tokens=8, max_num_seqs=4, base_pages=6)
    snapshot = tmp_path / "snapshot.prom"
    summary = run_calibration_trace(loaded.model_dir, settings, snapshot, loaded=loaded)
    assert summary["requests"] == 5 and snapshot.read_text().startswith("# growpage-snapshot-time: ")
    assert "growpage_lts_entropy_bucket" in snapshot.read_text()
    config = tmp_path / "calibrated.yaml"
    result = CliRunner().invoke(app, ["calibrate", "--snapshot", str(snapshot), "--min-samples", "1",
                                      "--output", str(config)])
    assert result.exit_code == 0, result.output
    thresholds = thresholds_from(str(config))
    assert set(thresholds) == set(CALIBRATED_KEYS) and "calibrated by gpctl calibrate" in config.read_text()
    engine, _ = build_engine(loaded, "growpage", base_pages=6, num_pages=32, block_size=16, max_num_seqs=2,
                             thresholds=thresholds)
    assert engine.manager.config.lts_grow_threshold == thresholds["lts_grow_threshold"]
    pinned, _ = build_engine(loaded, "growpage_uncalibrated", base_pages=6, num_pages=32, block_size=16,
                             max_num_seqs=2, thresholds=thresholds)
    assert pinned.manager.config.lts_grow_threshold == 2.1  # the ablation keeps the published value


def test_repeated_serving_rounds_report_medians_with_every_round_kept():
    def round_(tokens_per_s, preemptions, retrieval):
        return {"method": "growpage", "pool_pages": 96, "tokens_per_s": tokens_per_s, "makespan_s": 100.0,
                "itl_p50_ms": 150.0, "itl_p99_ms": None, "queueing_p50_s": 20.0, "queueing_p99_s": 30.0,
                "preemptions": preemptions, "peak_running": 12, "final_answers": {"r0": "7"},
                "decisions": {"evict": preemptions}, "accuracy": {"retrieval": retrieval},
                "correct_per_s": {"retrieval": retrieval / 10}}

    run = median_run([round_(70.0, 4, 1.0), round_(60.0, 9, 0.5), round_(75.0, 5, 1.0)])
    assert (run["tokens_per_s"], run["preemptions"], run["accuracy"]["retrieval"]) == (70.0, 5, 1.0)
    assert run["correct_per_s"]["retrieval"] == 0.1
    assert run["rounds"]["tokens_per_s"] == {"median": 70.0, "range": [60.0, 75.0], "values": [70.0, 60.0, 75.0]}
    assert run["rounds"]["accuracy_retrieval"]["values"] == [1.0, 0.5, 1.0]
    assert run["itl_p99_ms"] is None and "itl_p99_ms" not in run["rounds"]  # no round had one
    assert run["final_answers"] == {"r0": "7"} and len(run["rounds"]["decisions"]) == 3
    assert median_run([round_(70.0, 4, 1.0)]) == round_(70.0, 4, 1.0)  # one round: as measured
