"""``gpctl bench vllm --part headline``: GrowPage at its shipped defaults against every baseline a
skeptic asks for, on the decode-heavy pressure trace of each seed.

Variants, all in the same KV space (``kv_blocks``) except the limit:

* ``vllm``: vLLM alone as it runs untuned (``max_num_seqs`` holds every request);
* ``vllm@seqsN``: vLLM alone with ``max_num_seqs`` N
  (:attr:`~growpage.bench.vllm.VllmBenchSettings.tuned_max_num_seqs`): a smaller batch can avoid
  the preemption thrash a full one causes, the baseline a vLLM maintainer would ask for. *Tuned
  vLLM alone* is whichever of these has the best median tokens/s;
* ``monitor``: GrowPage in monitor at the shipped defaults (vLLM pages on its own): what monitor
  costs on this trace, and its forecast of enforce, compared with what ``growpage`` then does
  (:func:`growpage.bench.forecast.compare`, per round);
* ``growpage``: enforce at the shipped defaults
  (:meth:`~growpage.bench.vllm.VllmBenchSettings.growpage_config`);
* ``growpage@vllm``, ``growpage@projected`` and ``growpage@after_preemption``: the same with each
  ``admission`` (the shipped default is ``auto``: ``projected`` on CPU, ``vllm`` on a GPU; skip
  the duplicate with ``headline_skip``): what
  holding a start until the batch's projected KV fits buys, or costs, beside compression;
* ``growpage@coverageC``: the shipped defaults at ``attention_coverage`` C, for each of
  ``headline_coverage``: a lower coverage lowers every request's floor, so admission starts more
  and relief compresses further; the operator's table of speed against NLL increase;
* ``growpage_when_it_pays@projected``: growth-aware admission with the contract compressing only
  when that buys something (a preemption avoided, a waiting request admitted): with admission
  holding the queue and room in the pool, a boundary grows, so a batch that fits pays for no
  compaction (the "leave the cache alone" candidate for never-worse-than-vLLM);
* ``CAP@eq``: each fixed cap (``streaming_llm``, ``h2o``, ``snapkv``) at *equal memory*: a budget
  of GrowPage's measured mean KV per running request (blocks in use per running request,
  step-weighted), rounded up to whole blocks, taken from a pilot GrowPage run that also warms the
  machine and is discarded;
* ``CAP@floor``: each fixed cap at GrowPage's floor, with ``headline_caps_at_floor`` (earlier
  sweeps measured the caps at this floor) and when it differs from the matched budget;
* ``limit``: vLLM alone with room for every request: the attainable throughput;
* ``growpage@room``: GrowPage at its defaults in the limit's space, where nothing can be won:
  what it costs there (speed against ``limit``, NLL increase against full KV).

Every variant runs ``repeats`` interleaved rounds (the order reverses each round); each compressed
variant is forced once through the limit's continuation for its NLL increase over full KV (forced
decoding is deterministic). :func:`verdict` reads the medians against the targets.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from growpage.bench import goodput
from growpage.bench.forecast import compare
from growpage.bench.rollout import rollout_check, schedule_changed
from growpage.bench.tasks import with_truth
from growpage.bench.workloads import reasoning_tasks
from growpage.core.methods import VLLM_CAP_NAMES
from growpage.core.quantiles import spread
from growpage.errors import ConfigError
from growpage.tooling.vllm_child import engine_arguments
from growpage.tooling.vllm_runs import run_child
from growpage.vllm_plugin.settings import resolved_settings

if TYPE_CHECKING:
    from growpage.bench.vllm_settings import VllmBenchSettings

Log = Callable[[str], None] | None
CAPS = VLLM_CAP_NAMES  # every fixed cap vLLM runs, as registered
TUNED_PREFIX = "vllm@seqs"
# growpage@<admission>: each admission beside the shipped default (auto: measured on the host)
ADMISSION_VARIANTS = ("vllm", "projected", "after_preemption")
COVERAGE_PREFIX = "growpage@coverage"  # the shipped defaults at another attention_coverage
WHEN_IT_PAYS = "growpage_when_it_pays"  # the contract compressing only when it buys something
ALWAYS_RUN = ("vllm", "growpage", "limit")  # what the verdict reads
# Targets (issue "enforce that never loses to vLLM alone"): GrowPage's speed at least this share of
# tuned vLLM alone's; at least this share of the attainable gain (limit over tuned vLLM alone) at no
# more than this NLL increase; at equal memory an NLL increase this much below the best cap's.
NEVER_WORSE_SHARE = 0.98
GAIN_SHARE_TARGET = 0.5
GAIN_NLL_LIMIT = 0.05
EQUAL_MEMORY_NLL_MARGIN = 0.2


def matched_budget(mean_blocks_per_running: float, floor_pages: int) -> int:
    """The fixed caps' budget at equal memory: GrowPage's mean KV per running request rounded up to
    whole blocks, never below GrowPage's floor (the caps' protected tokens must fit, as GrowPage's do)."""
    return max(floor_pages, math.ceil(mean_blocks_per_running - 1e-9))


def variant_configs(settings: VllmBenchSettings, budget: int) -> dict[str, dict[str, Any]]:
    """Every variant's run settings, in run order: ``growpage`` (None: vLLM alone), ``max_num_seqs``
    (None: every request) and ``limit`` (room for all)."""
    growpage = settings.growpage_config()
    configs: dict[str, dict[str, Any]] = {"vllm": {"growpage": None}}
    for seqs in settings.tuned_max_num_seqs:
        configs[f"{TUNED_PREFIX}{seqs}"] = {"growpage": None, "max_num_seqs": seqs}
    configs["monitor"] = {"growpage": settings.growpage_config("monitor")}
    configs["growpage"] = {"growpage": growpage}
    for admission in ADMISSION_VARIANTS:  # the same with growth-aware admission: what it buys or costs
        configs[f"growpage@{admission}"] = {"growpage": {**growpage, "admission": admission}}
    for coverage in settings.headline_coverage:
        configs[f"{COVERAGE_PREFIX}{coverage:g}"] = {"growpage": {**growpage, "attention_coverage": coverage}}
    for variant in settings.headline_variants:
        configs[f"growpage/{variant.label}"] = {"growpage": {**growpage, **variant.settings}}
    configs[f"{WHEN_IT_PAYS}@projected"] = {"growpage": {**growpage, "admission": "projected", "method": WHEN_IT_PAYS}}
    at_floor = settings.headline_caps_at_floor and settings.floor_pages != budget
    budgets = {"eq": budget} | ({"floor": settings.floor_pages} if at_floor else {})
    for label, pages in budgets.items():
        for cap in CAPS:
            configs[f"{cap}@{label}"] = {"growpage": {**growpage, "method": cap, "base_pages": pages}}
    configs["limit"] = {"growpage": None, "limit": True}
    configs["growpage@room"] = {"growpage": growpage, "limit": True}
    unknown = sorted(set(settings.headline_skip) - set(configs))
    if unknown:
        raise ConfigError(f"headline_skip names no variant: {', '.join(unknown)}; "
                                 f"choose among {', '.join(configs)}")
    kept = [name for name in settings.headline_skip if name in ALWAYS_RUN]
    if kept:
        raise ConfigError(f"headline_skip cannot leave out {', '.join(kept)}: the verdict reads "
                                 f"{', '.join(ALWAYS_RUN)}")
    return {name: config for name, config in configs.items() if name not in settings.headline_skip}


def headline_trace(model_dir: str, settings: VllmBenchSettings, seed: int, log: Log, timeout_s: float) -> dict:
    """One seed's trace: the pilot, every variant's interleaved rounds, the forced NLLs, the verdict."""
    # deferred: transformers takes seconds to import; only a run that tokenizes loads it
    from transformers import AutoTokenizer

    tasks = reasoning_tasks(settings.requests, settings.max_tokens, seed=seed)
    prompts = [task.prompt for task in tasks]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    longest = max(goodput.prompt_tokens(tokenizer, prompt) for prompt in prompts)

    def run_spec(name: str, config: dict[str, Any]) -> dict:
        blocks = settings.limit_blocks(longest) if config.get("limit") else settings.kv_blocks
        spec = goodput.spec(model_dir, settings.block_size, prompts, settings.max_tokens, blocks, name,
                            config["growpage"])
        return {**spec, "logprobs": bool(config.get("limit")), "max_num_seqs": config.get("max_num_seqs")}

    variant_configs(settings, settings.floor_pages)  # a bad headline_skip fails now, not after the pilot
    if log:
        log(f"vllm bench: headline seed {seed}, pilot GrowPage run (discarded; sets the caps' equal-memory budget)")
    pilot = run_child(run_spec("growpage", {"growpage": settings.growpage_config()}), lambda report: None, timeout_s)
    budget = matched_budget(pilot["mean_blocks_per_running"], settings.floor_pages)
    configs = variant_configs(settings, budget)
    runs = goodput.repeated(lambda name: run_child(run_spec(name, configs[name]), lambda report: None, timeout_s),
                            list(configs), settings.repeats, log, f"headline seed {seed}")
    reference = runs["limit"][0]
    truth = [with_truth(task) for task in tasks]
    variants = {}
    for name, results in runs.items():
        config = configs[name]
        compressed = config["growpage"] is not None and config["growpage"]["mode"] == "enforce"
        nll = goodput.forced_nll(run_spec(name, config), reference, log, timeout_s) if compressed else None
        spec = run_spec(name, config)
        variants[name] = {
            "growpage": (resolved_settings(config["growpage"], settings.block_size)
                         if config["growpage"] is not None else None),
            "engine": engine_arguments(spec, len(prompts)),
            "tokens_per_s": spread([r["tokens_per_s"] for r in results]),
            "nll_increase": nll["mean"] if nll else 0.0, "nll": nll,
            "preemptions": [r["preemptions"] for r in results],
            "mean_blocks_per_running": spread([r["mean_blocks_per_running"] for r in results]),
            "mean_running": spread([r["mean_running"] for r in results]),
            "decisions": results[0]["decisions"],
            "goodput": goodput.scored(tokenizer, truth, results),
            "runs": [goodput.without_outputs(r) for r in results]}
    forecasts = [compare(monitor, enforce)
                 for monitor, enforce in zip(runs.get("monitor", ()), runs["growpage"], strict=False)]
    return {"seed": seed, "kv_blocks": settings.kv_blocks, "limit_blocks": settings.limit_blocks(longest),
            "pilot": goodput.without_outputs(pilot), "matched_budget_pages": budget,
            "variants": variants, "forecast_by_round": forecasts, "verdict": verdict(variants)}


def _speed(point: dict) -> float:
    return float(point["tokens_per_s"]["median"])


def verdict(variants: dict[str, dict]) -> dict:
    """The trace's medians against the targets (pure)."""
    alone = {name: point for name, point in variants.items() if name == "vllm" or name.startswith(TUNED_PREFIX)}
    monitor = variants.get("monitor")
    tuned_name = max(alone, key=lambda name: _speed(alone[name]))
    tuned, grow, limit = _speed(alone[tuned_name]), _speed(variants["growpage"]), _speed(variants["limit"])
    gain = limit - tuned

    def captured_share(point: dict) -> float | None:
        return (_speed(point) - tuned) / gain if gain > 0 else None

    def meets_gain(point: dict) -> bool:
        share = captured_share(point)
        return share is not None and share >= GAIN_SHARE_TARGET and float(point["nll_increase"]) <= GAIN_NLL_LIMIT

    captured = captured_share(variants["growpage"])
    nll = float(variants["growpage"]["nll_increase"])
    equal = {name: point for name, point in variants.items() if name.endswith("@eq")}
    best_cap = min(equal, key=lambda name: equal[name]["nll_increase"]) if equal else None
    cap_nll = float(equal[best_cap]["nll_increase"]) if best_cap else None
    room = variants.get("growpage@room")
    return {
        "tuned_vllm": tuned_name, "tuned_vllm_tokens_per_s": tuned,
        "growpage_vs_tuned_vllm": round(grow / tuned, 3) if tuned else None,
        "growpage_vs_untuned_vllm": round(grow / _speed(variants["vllm"]), 3),
        "limit_vs_tuned_vllm": round(limit / tuned, 3) if tuned else None,
        "captured_gain_share": _rounded(captured),
        "never_worse_met": grow >= NEVER_WORSE_SHARE * tuned,
        "gain_target_met": meets_gain(variants["growpage"]),
        "best_cap_at_equal_memory": best_cap, "best_cap_nll_increase": cap_nll,
        "growpage_nll_increase": nll,
        "equal_memory_nll_met": (cap_nll is not None and nll <= (1 - EQUAL_MEMORY_NLL_MARGIN) * cap_nll),
        # where nothing can be won (room for all): GrowPage's speed against vLLM alone's, and what it cost
        "room_vs_limit": round(_speed(room) / limit, 3) if room is not None and limit else None,
        "room_nll_increase": float(room["nll_increase"]) if room is not None else None,
        "monitor_vs_untuned_vllm": (round(_speed(monitor) / _speed(variants["vllm"]), 3)
                                    if monitor is not None else None),
        # the forecast before enforce: calibrate's recommendation from monitor's runs against what
        # enforce then did against vLLM alone at the same engine arguments
        "rollout": (rollout_check(monitor["runs"], grow / _speed(variants["vllm"]),
                                  _median_elapsed(variants["vllm"]) - _median_elapsed(variants["growpage"]),
                                  schedule_changed(variants["vllm"]["runs"], variants["growpage"]["runs"]))
                    if monitor is not None and monitor.get("runs") else None),
        # growth-aware admission: each variant's speed against tuned vLLM alone, and whether it meets
        # the never-worse target where the shipped default does not
        "admission_vs_tuned_vllm": {name: round(_speed(variants[name]) / tuned, 3)
                                    for name in (f"growpage@{a}" for a in ADMISSION_VARIANTS)
                                    if name in variants and tuned},
        # GrowPage at each other attention_coverage: the share of the gain it captures, at what NLL
        "coverage_points": {name[len(COVERAGE_PREFIX):]: {
            "vs_tuned_vllm": round(_speed(point) / tuned, 3) if tuned else None,
            "captured_gain_share": _rounded(captured_share(point)),
            "nll_increase": float(point["nll_increase"]), "gain_target_met": meets_gain(point)}
            for name, point in variants.items() if name.startswith(COVERAGE_PREFIX)},
        "targets": {"never_worse_share": NEVER_WORSE_SHARE, "gain_share": GAIN_SHARE_TARGET,
                    "gain_nll_limit": GAIN_NLL_LIMIT, "equal_memory_nll_margin": EQUAL_MEMORY_NLL_MARGIN}}


def _median_elapsed(point: dict) -> float:
    """A variant's median wall time over its rounds (0 where its runs were not kept)."""
    return statistics.median([run["elapsed_s"] for run in point["runs"]]) if point.get("runs") else 0.0


def _rounded(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None


def headline_rows(result: dict) -> list[tuple[str, ...]]:
    """One row per (seed, variant) for the CLI's table and docs/BENCHMARKS.md."""
    rows: list[tuple[str, ...]] = []
    for trace in result.get("headlines", []):
        tuned = trace["verdict"]["tuned_vllm_tokens_per_s"]
        for name, point in trace["variants"].items():
            speed = point["tokens_per_s"]
            correct = point["goodput"].get("correct_per_s", {})
            low, high = speed["range"]
            rows.append((str(trace["seed"]), name, f"{speed['median']:.1f} [{low:.1f}-{high:.1f}]",
                         f"{speed['median'] / tuned:.2f}x", f"{point['nll_increase']:+.3f}",
                         "/".join(str(p) for p in point["preemptions"]),
                         f"{point['mean_blocks_per_running']['median']:.1f}",
                         f"{correct.get('median', 0.0):.3f}" if correct else "-"))
    return rows
