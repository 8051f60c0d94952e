"""``growpage.bench.vllm`` without running engines (a real run takes minutes: ``gpctl bench vllm``)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from growpage.bench.vllm import _summary
from growpage.bench.vllm_settings import VARIANTS, VllmBenchSettings
from growpage.errors import ConfigError


def test_variants_are_vllm_alone_growpage_and_the_attainable_limit():
    assert VARIANTS == ("vllm", "growpage", "limit")
    settings = VllmBenchSettings(base_pages=3, growpage={"observed_heads": 2})
    config = settings.growpage_config()
    assert config["mode"] == "enforce" and config["base_pages"] == 3 and config["observed_heads"] == 2
    assert settings.growpage_config("monitor")["mode"] == "monitor"
    json.dumps(dataclasses.asdict(settings))  # the JSON result carries it


def test_the_kv_space_is_under_pressure_and_the_limit_holds_everyone():
    for settings in (VllmBenchSettings(), VllmBenchSettings.quick()):
        prompt_tokens = 60
        full_blocks = -(-(prompt_tokens + settings.max_tokens) // settings.block_size)
        assert settings.requests * full_blocks > 2 * (settings.kv_blocks - 1)  # vLLM alone must queue or preempt
        assert settings.limit_blocks(prompt_tokens) - 1 >= settings.requests * full_blocks
    assert len(VllmBenchSettings().seeds) >= 2  # a second trace guards against tuning to one


def test_summary_reports_each_seed():
    traces = [{"seed": 0, "growpage_vs_vllm": 1.5, "captured_gain_share": 0.5, "preemptions": {"vllm": 3},
               "answer_agreement": 0.75},
              {"seed": 1, "growpage_vs_vllm": 1.4, "captured_gain_share": 0.4, "preemptions": {"vllm": 2},
               "answer_agreement": 0.5}]
    summary = _summary(traces, {"monitor_vs_vllm": 0.99})
    assert summary["growpage_vs_vllm_by_seed"] == {0: 1.5, 1: 1.4} and summary["monitor_vs_vllm"] == 0.99
    assert summary["answer_agreement_by_seed"] == {0: 0.75, 1: 0.5}


def test_final_answers_are_read_up_to_the_end_of_sequence():
    from growpage.bench.vllm import _answer_agreement

    class Tokenizer:  # ids are digits; 0 ends the sequence
        eos_token_id = 0

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(str(i) for i in ids if i)

    # same answer (7) before the end, different rambling after it: they agree
    assert _answer_agreement(Tokenizer(), [[3, 7, 0, 9]], [[5, 7, 0, 4]]) == 1.0
    assert _answer_agreement(Tokenizer(), [[3, 7], [2]], [[3, 8], [2]]) == 0.5


def test_the_overhead_rounds_alternate_their_order_and_cover_every_variant():
    from growpage.bench.vllm import OVERHEAD_VARIANTS, overhead_order

    assert set(OVERHEAD_VARIANTS) == {"vllm", "monitor", "enforce_idle"}
    assert overhead_order(0) == tuple(reversed(overhead_order(1)))
    assert all(set(overhead_order(r)) == set(OVERHEAD_VARIANTS) for r in range(4))
    assert VllmBenchSettings().repeats >= 3


def test_retrieval_under_pressure_is_16_requests_in_a_quarter_of_their_kv():
    from growpage.bench.goodput import retrieval_tasks
    from growpage.bench.vllm_settings import PARTS

    settings = VllmBenchSettings()
    tasks = retrieval_tasks(settings)
    assert len(tasks) >= 16 and len({t.answer for t in tasks}) == len(tasks)
    assert settings.retrieval_kv_share <= 0.25 and {"retrieval", "accuracy"} <= set(PARTS)
    assert settings.repeats >= 3  # interleaved rounds for every pressure and retrieval variant


def test_reasoning_prompts_are_scored_only_where_they_have_a_true_result():
    from growpage.bench.vllm import _true_results
    from growpage.bench.workloads import reasoning_tasks

    tasks = reasoning_tasks(6, 8)
    scored = _true_results(tasks)
    assert [s is None for s in scored] == [t.expected is None for t in tasks]
    assert all(s.family == "reasoning" and s.answer == t.expected for s, t in zip(scored, tasks, strict=True) if s)


def test_retrieval_compares_growpage_with_the_most_accurate_fixed_cap():
    from growpage.bench.goodput import RETRIEVAL_CAPS, answers_comparison

    def variant(accuracy: float, correct_per_s: float, elapsed_s: float = 10.0) -> dict:
        return {"accuracy": {"median": accuracy}, "correct_per_s": {"median": correct_per_s},
                "elapsed_s": {"median": elapsed_s}}

    variants = {"vllm": variant(1.0, 0.5), "growpage": variant(0.5, 0.3, 8.0), "streaming_llm@4": variant(0.25, 0.2),
                "h2o@4": variant(0.375, 0.2), "snapkv@4": variant(0.375, 0.25),
                "tova@4": variant(0.25, 0.3), "limit": variant(1.0, 0.6)}
    comparison = answers_comparison(variants)
    assert set(RETRIEVAL_CAPS) == {"streaming_llm", "h2o", "snapkv", "tova"}
    assert comparison["best_cap"] == "snapkv@4"  # h2o ties on accuracy; snapkv answers faster
    assert comparison["growpage_accuracy_minus_best_cap"] == 0.125
    assert comparison["growpage_correct_per_s_vs_best_cap"] == 1.2
    assert comparison["growpage_accuracy_share_of_vllm"] == 0.5 and comparison["growpage_wall_vs_vllm"] == 0.8


def test_retrieval_judges_growpage_against_tuned_vllm_alone():
    from growpage.bench.goodput import answers_comparison

    def variant(accuracy: float, correct_per_s: float) -> dict:
        return {"accuracy": {"median": accuracy}, "correct_per_s": {"median": correct_per_s},
                "elapsed_s": {"median": 16 / correct_per_s}}

    variants = {"vllm": variant(1.0, 0.50), "vllm@seqs4": variant(1.0, 0.60), "growpage": variant(1.0, 0.55),
                "growpage@projected": variant(1.0, 0.59), "limit": variant(1.0, 0.8)}
    comparison = answers_comparison(variants)
    assert comparison["tuned_vllm"] == "vllm@seqs4"  # the faster of vLLM alone's batch sizes
    verdicts = comparison["against_tuned_vllm"]
    assert verdicts["growpage"] == {"correct_per_s_vs_tuned": 0.917, "accuracy_share_of_tuned": 1.0,
                                    "never_worse": False}
    assert verdicts["growpage@projected"]["never_worse"]  # 0.983x at the same accuracy
    fewer_answers = {**variants, "growpage@projected": variant(0.875, 0.62)}
    assert not answers_comparison(fewer_answers)["against_tuned_vllm"]["growpage@projected"]["never_worse"]


def test_retrieval_variants_can_be_left_out_except_what_the_comparison_reads():
    from growpage.bench.goodput import retrieval_configs

    settings = VllmBenchSettings()
    floor = settings.floor_pages
    configs = retrieval_configs(settings)
    assert list(configs)[:6] == ["vllm", "vllm@seqs4", "vllm@seqs6", "monitor", "growpage", "growpage@projected"]
    assert configs["growpage@projected"]["growpage"]["admission"] == "projected"
    assert configs["monitor"]["growpage"]["mode"] == "monitor"  # its forecast: calibrate's rollout, judged
    assert configs["vllm@seqs4"] == {"growpage": None, "max_num_seqs": 4}
    assert f"h2o@{floor}" in configs and list(configs)[-1] == "limit"
    caps = tuple(name for name in configs if "@" in name and name.split("@")[0] in ("streaming_llm", "h2o",
                                                                                    "snapkv", "tova"))
    shorter = retrieval_configs(dataclasses.replace(settings, retrieval_skip=(*caps, "vllm@seqs6", "monitor")))
    assert list(shorter) == ["vllm", "vllm@seqs4", "growpage", "growpage@projected", "limit"]
    with pytest.raises(ConfigError, match="retrieval_skip names no variant: h2o@99; choose among vllm,"):
        retrieval_configs(dataclasses.replace(settings, retrieval_skip=("h2o@99",)))
    with pytest.raises(ConfigError, match="retrieval_skip cannot leave out growpage"):
        retrieval_configs(dataclasses.replace(settings, retrieval_skip=("growpage",)))


@pytest.mark.parametrize(("parts", "skip"), [(("headline",), {"headline_skip": ("limit",)}),
                                             (("retrieval",), {"retrieval_skip": ("growpage",)})])
def test_a_bad_skip_fails_before_any_engine_starts(tmp_path, parts, skip):
    """A skip the comparison cannot do without fails at once: the warm-up alone takes minutes, and a
    model directory that holds no model would fail it (so reaching it would raise something else)."""
    from growpage.bench.vllm import run_vllm_bench

    settings = dataclasses.replace(VllmBenchSettings(), parts=parts, **skip)
    with pytest.raises(ConfigError, match="cannot leave out"):
        run_vllm_bench(str(tmp_path), settings)
