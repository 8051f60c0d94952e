"""The decode-heavy pressure sweep inside vLLM: tokens/s against fidelity, per method and floor.

``gpctl bench vllm --part sweep``. On each pressure trace (the reasoning prompts of
:mod:`growpage.bench.vllm`, ``ignore_eos``), in the trace's tight KV space:

* ``vllm``: vLLM alone (recompute on preemption: full KV's fidelity, by construction);
* ``growpage@N``: GrowPage enforcing with a floor of ``N`` blocks per request;
* ``growpage@N+cov<C>`` (with ``sweep_coverage``): GrowPage at the lowest floor ``N`` with
  ``attention_coverage`` ``C``: each request's floor rises to what its attention needs, so the
  coverage, not the floor, sets the operating point. These points belong to GrowPage's curve too;
* ``streaming_llm@N``, ``h2o@N``, ``snapkv@N``: the fixed caps of ``N`` blocks under the same
  admission, pressure relief and floors (the plugin's ``method`` setting);
* ``<point>/<label>`` (with ``sweep_variants``): a point again with more plugin settings, e.g.
  ``growpage@2/heads`` with ``keep_sets: kv_head``: an ablation inside one interleaved run. A variant
  names the methods it applies to (default: every swept method) and runs at every floor and
  coverage point of theirs;
* ``limit``: vLLM alone with room for every request (the attainable speed, and the reference).

Every variant runs ``repeats`` times, interleaved (the order reverses each round), for its tokens/s
median and range; each compressed variant is then forced once through the limit's continuation
for its NLL increase (deterministic: one run is enough). :func:`verdict` reads the points against
the target: GrowPage's curve on or above every fixed cap's, and at least 1.5x vLLM alone's
tokens/s at an NLL increase no larger than the best fixed cap's at that speed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from growpage.bench import goodput
from growpage.bench.vllm_settings import COVERAGE_MARK, SWEEP_METHODS, VARIANT_MARK, SweepVariant, VllmBenchSettings
from growpage.bench.workloads import reasoning_tasks
from growpage.core.quantiles import spread
from growpage.tooling.vllm_runs import run_child

Log = Callable[[str], None] | None
FIXED_CAPS = SWEEP_METHODS[1:]
SPEEDUP_TARGET = 1.5
COVERAGE_AXIS = "coverage"


SWEEP_PROTECTION = {"sink_tokens": 4, "recent_window_tokens": 16, "evict_min_pages": 1}


def variant_name(method: str, pages: int, coverage: float | None = None, label: str = "") -> str:
    return (f"{method}@{pages}" + ("" if coverage is None else f"{COVERAGE_MARK}{coverage:g}")
            + (f"{VARIANT_MARK}{label}" if label else ""))


def sweep_configs(settings: VllmBenchSettings) -> dict[str, dict | None]:
    """Every variant's ``additional_config["growpage"]`` (None: vLLM alone), in run order.

    GrowPage's floor points name their ``attention_coverage`` (``--setting``'s, else 0: the floor
    alone), so what a point ran does not depend on the config's default. Each settings variant
    (:class:`SweepVariant`) follows its methods' points with its own."""
    variants = [SweepVariant("", {}), *settings.sweep_variants]
    configs: dict[str, dict | None] = {"vllm": None}
    # the sweep's floors go below the shipped one (2 blocks of 32), where the shipped 64-token recent
    # window cannot fit; every point protects what the sweep always did, so its curves stay comparable
    protection = {**SWEEP_PROTECTION, **{k: v for k, v in settings.growpage.items() if k in SWEEP_PROTECTION}}
    floor_coverage = {"attention_coverage": settings.growpage.get("attention_coverage", 0.0)}
    for method in settings.sweep_methods:
        for pages in settings.sweep_pages:
            base = {**settings.growpage_config(), **protection, "base_pages": pages, "method": method}
            base |= floor_coverage if method == "growpage" else {}
            for variant in variants:
                if variant.applies_to(method):
                    configs[variant_name(method, pages, label=variant.label)] = {**base, **variant.settings}
    if "growpage" in settings.sweep_methods:
        pages = min(settings.sweep_pages)
        for coverage in settings.sweep_coverage:
            base = {**settings.growpage_config(), **protection, "base_pages": pages, "method": "growpage",
                    "attention_coverage": coverage}
            for variant in variants:
                if variant.applies_to("growpage"):
                    configs[variant_name("growpage", pages, coverage, variant.label)] = {**base, **variant.settings}
    configs["limit"] = None
    return configs


def pressure_sweep(model_dir: str, settings: VllmBenchSettings, seed: int, log: Log, timeout_s: float) -> dict:
    """One trace: every variant's tokens/s (interleaved repeats) and NLL increase over the limit."""
    # deferred: transformers takes seconds to import; only a run that tokenizes loads it
    from transformers import AutoTokenizer

    prompts = [task.prompt for task in reasoning_tasks(settings.requests, settings.max_tokens, seed=seed)]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    longest = max(goodput.prompt_tokens(tokenizer, prompt) for prompt in prompts)
    configs = sweep_configs(settings)
    blocks = {name: settings.limit_blocks(longest) if name == "limit" else settings.kv_blocks for name in configs}

    def run_spec(name: str) -> dict:
        spec = goodput.spec(model_dir, settings.block_size, prompts, settings.max_tokens, blocks[name], name,
                            configs[name])
        return {**spec, "logprobs": name == "limit"}

    runs = goodput.repeated(lambda name: run_child(run_spec(name), lambda report: None, timeout_s), list(configs),
                            settings.repeats, log, f"sweep seed {seed}")
    reference = runs["limit"][0]
    points = {}
    for name, results in runs.items():
        config = configs[name]
        nll = goodput.forced_nll(run_spec(name), reference, log, timeout_s) if config is not None else None
        points[name] = {"method": config["method"] if config is not None else name,
                        "variant": name.partition(VARIANT_MARK)[2],
                        "settings": {k: v for k, v in (config or {}).items() if k not in ("mode", "method")},
                        "base_pages": config["base_pages"] if config is not None else None,
                        "attention_coverage": (config or {}).get("attention_coverage", 0.0),
                        "axis": COVERAGE_AXIS if COVERAGE_MARK in name else "budget",
                        "kv_blocks": blocks[name], "tokens_per_s": spread([r["tokens_per_s"] for r in results]),
                        "nll_increase": nll["mean"] if nll else 0.0, "nll": nll,
                        "preemptions": [r["preemptions"] for r in results], "decisions": results[0]["decisions"],
                        "runs": [goodput.without_outputs(r) for r in results]}
    return {"seed": seed, "points": points, "verdict": verdict(points)}


def _speed(point: dict) -> float:
    return point["tokens_per_s"]["median"]


def _growpage_speed_at(growpage: Sequence[dict], nll: float) -> float | None:
    """GrowPage's fastest point whose NLL increase is at most ``nll`` (its curve read at ``nll``)."""
    speeds = [_speed(point) for point in growpage if point["nll_increase"] <= nll]
    return max(speeds) if speeds else None


def verdict(points: dict[str, dict]) -> dict:
    """The sweep's points against the target (pure: medians of the repeats).

    * every fixed cap's point is *covered* when some GrowPage point is at least as fast at no more NLL;
    * the speed target: a GrowPage point at >= 1.5x vLLM alone's tokens/s whose NLL increase is no
      larger than the best (lowest-NLL) fixed cap at that speed or faster.
    """
    growpage = [point for point in points.values() if point["method"] == "growpage"]
    caps = [(name, point) for name, point in points.items() if point["method"] in FIXED_CAPS]
    base = _speed(points["vllm"])
    uncovered = [name for name, point in caps
                 if (_growpage_speed_at(growpage, point["nll_increase"]) or 0.0) < _speed(point)]
    fast = [point for point in growpage if _speed(point) >= SPEEDUP_TARGET * base]
    best = min(fast, key=lambda point: point["nll_increase"]) if fast else None
    rivals = [point["nll_increase"] for _, point in caps if best is not None and _speed(point) >= _speed(best)]
    return {"caps_not_covered": uncovered, "curve_on_or_above_every_cap": not uncovered,
            "fastest_growpage_vs_vllm": round(max((_speed(p) for p in growpage), default=0.0) / base, 3)
            if base else None,
            "speed_target_point": _describe(best),
            "best_cap_nll_at_that_speed": min(rivals) if rivals else None,
            "speed_target_met": best is not None and (not rivals or best["nll_increase"] <= min(rivals)),
            "targets": {"speedup_vs_vllm": SPEEDUP_TARGET, "curve": "on or above every fixed cap"}}


def _describe(point: dict | None) -> dict | None:
    if point is None:
        return None
    return {"base_pages": point["base_pages"], "attention_coverage": point.get("attention_coverage", 0.0),
            "tokens_per_s": _speed(point), "nll_increase": point["nll_increase"]}


def sweep_rows(sweeps: Sequence[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Table rows: seed, variant, tokens/s (median [range]), x vLLM alone, NLL increase, preemptions."""
    rows: list[tuple[str, ...]] = []
    for sweep in sweeps:
        base = _speed(sweep["points"]["vllm"])
        for name, point in sweep["points"].items():
            spread = point["tokens_per_s"]
            low, high = spread["range"]
            rows.append((str(sweep["seed"]), name, f"{spread['median']:.1f} [{low:.1f}-{high:.1f}]",
                         f"{_speed(point) / base:.2f}x" if base else "-",
                         "0 (ref)" if name == "limit" else f"{point['nll_increase']:+.4f}",
                         "/".join(str(count) for count in point["preemptions"])))
    return rows
