"""``gpctl bench vllm --part forecast``: monitor's forecast of enforce against what enforce then does.

Per trace (the decode-heavy pressure trace of each seed, in the same KV space), two runs at the
shipped defaults: ``monitor`` (vLLM pages on its own; GrowPage forecasts enforce,
:mod:`growpage.vllm_plugin.forecast`) and ``enforce``. Compared:

* **pages freed**: the forecast's ``growpage_forecast_pages_freed_total`` against the pages
  enforce's compactions freed (boundary evictions against growing, compressions outside a boundary
  by what they cut; :class:`~growpage.tooling.vllm_child.FreedPages`);
* **preemptions avoided**: the forecast's avoidable preemptions against monitor's preemptions
  (vLLM's own: monitor changes nothing) less enforce's.

The target: each within :data:`FORECAST_TOLERANCE` (relative) of what enforce did, on traces never
used for tuning. The forecast's compactions are reported beside enforce's evictions.

Where a part also runs vLLM alone (``--part headline``, ``--part retrieval`` and ``--part mixed``), each monitor run's
forecast also goes through ``gpctl calibrate``'s recommendation, judged against what enforce then did
(:mod:`growpage.bench.rollout`).

Neither side is one number. Under ``admission: auto`` both decide on step times they measure, so
the same trace can run differently twice (enforce once avoided 8 preemptions on a trace where it
avoided 1 in its other runs). So each trace runs ``repeats`` interleaved rounds of both, and the
verdict compares the forecast's median with enforce's (:func:`compare_rounds`), beside every
round's own comparison and each count's range.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from growpage.bench.workloads import reasoning_tasks
from growpage.core.quantiles import spread

if TYPE_CHECKING:
    from growpage.bench.vllm_settings import VllmBenchSettings

Log = Callable[[str], None] | None
FORECAST_TOLERANCE = 0.25


def relative_error(forecast: float, actual: float) -> float | None:
    """``|forecast - actual| / actual``; None when enforce did nothing (0) and the forecast said so too,
    infinity when the forecast saw something enforce did not."""
    if actual == 0:
        return None if forecast == 0 else float("inf")
    return abs(forecast - actual) / abs(actual)


def _within(error: float | None) -> bool:
    return error is None or error <= FORECAST_TOLERANCE


def compare(monitor: dict, enforce: dict) -> dict:
    """The forecast of one monitor run against one enforce run of the same trace (pure)."""
    forecast = monitor["forecast"]
    avoided = monitor["preemptions"] - enforce["preemptions"]
    freed_error = relative_error(forecast["pages_freed"], enforce["pages_freed"])
    avoided_error = relative_error(forecast["preemptions_avoidable"], avoided)
    return {"pages_freed": {"forecast": forecast["pages_freed"], "enforce": enforce["pages_freed"],
                            "relative_error": freed_error},
            "preemptions_avoided": {"forecast": forecast["preemptions_avoidable"], "enforce": avoided,
                                    "monitor_preemptions": monitor["preemptions"],
                                    "enforce_preemptions": enforce["preemptions"],
                                    "relative_error": avoided_error},
            "compactions": {"forecast": forecast["compactions"],
                            "enforce_evictions": enforce["decisions"].get("evict", 0)},
            "within_tolerance": _within(freed_error) and _within(avoided_error), "tolerance": FORECAST_TOLERANCE}


def compare_rounds(rounds: Sequence[tuple[dict, dict]]) -> dict:
    """The forecast against enforce over repeated rounds of one trace (pure): each count's median over
    the rounds, compared as :func:`compare` compares one round; each count's spread; and every
    round's own comparison. ``rounds``: (monitor, enforce) run pairs, in round order."""
    if not rounds:
        raise ValueError("compare_rounds needs at least one (monitor, enforce) round")
    per_round = [compare(monitor, enforce) for monitor, enforce in rounds]

    def values(metric: str, key: str) -> list[float]:
        return [entry[metric][key] for entry in per_round]

    def median(metric: str, key: str) -> float:
        return statistics.median(values(metric, key))

    freed = {side: median("pages_freed", side) for side in ("forecast", "enforce")}
    # enforce's avoided preemptions: the median of each round's (monitor - enforce), as compare() counts them
    avoided = {key: median("preemptions_avoided", key)
               for key in ("forecast", "enforce", "monitor_preemptions", "enforce_preemptions")}
    freed_error = relative_error(freed["forecast"], freed["enforce"])
    avoided_error = relative_error(avoided["forecast"], avoided["enforce"])
    return {"pages_freed": {**freed, "relative_error": freed_error},
            "preemptions_avoided": {**avoided, "relative_error": avoided_error},
            "compactions": {"forecast": median("compactions", "forecast"),
                            "enforce_evictions": median("compactions", "enforce_evictions")},
            "within_tolerance": _within(freed_error) and _within(avoided_error),
            "tolerance": FORECAST_TOLERANCE,
            "spread": {f"{metric}_{side}": spread(values(metric, side))
                       for metric in ("pages_freed", "preemptions_avoided") for side in ("forecast", "enforce")},
            "rounds": per_round, "rounds_within_tolerance": sum(entry["within_tolerance"] for entry in per_round)}


def forecast_rows(result: dict) -> list[tuple[str, ...]]:
    """``gpctl bench vllm --part forecast``'s table: per seed, each count as forecast against enforce
    (medians, [ranges] over the rounds), the rounds within tolerance, and the verdict."""

    def counts(entry: dict, metric: str) -> str:
        low, high = entry["spread"][f"{metric}_forecast"]["range"]
        enforce_low, enforce_high = entry["spread"][f"{metric}_enforce"]["range"]
        return (f"{entry[metric]['forecast']:g} [{low:g}-{high:g}] / "
                f"{entry[metric]['enforce']:g} [{enforce_low:g}-{enforce_high:g}]")

    rows: list[tuple[str, ...]] = []
    for entry in result.get("forecasts", []):
        if "spread" not in entry:  # a result written before the rounds were repeated
            continue
        rows.append((str(entry["seed"]),
                     counts(entry, "pages_freed"), counts(entry, "preemptions_avoided"),
                     f"{entry['rounds_within_tolerance']}/{len(entry['rounds'])}",
                     "within" if entry["within_tolerance"] else "outside"))
    return rows


def forecast_trace(model_dir: str, settings: VllmBenchSettings, seed: int, log: Log, timeout_s: float) -> dict:
    """``settings.repeats`` interleaved rounds of monitor and enforce on the pressure trace of ``seed``;
    the forecast against enforce (:func:`compare_rounds`)."""
    # deferred: both import torch; compare() and the forecast's tables need none
    from growpage.bench import goodput
    from growpage.tooling.vllm_runs import run_child

    prompts = [task.prompt for task in reasoning_tasks(settings.requests, settings.max_tokens, seed=seed)]

    def run(mode: str) -> dict:
        spec = goodput.spec(model_dir, settings.block_size, prompts, settings.max_tokens, settings.kv_blocks, mode,
                            settings.growpage_config(mode))
        return goodput.without_outputs(run_child(spec, lambda report: None, timeout_s))

    runs = goodput.repeated(run, ("monitor", "enforce"), settings.repeats, log, f"forecast, seed {seed}")
    rounds = list(zip(runs["monitor"], runs["enforce"], strict=True))
    return {"seed": seed, "kv_blocks": settings.kv_blocks, "repeats": settings.repeats,
            "runs": [{"monitor": monitor, "enforce": enforce} for monitor, enforce in rounds],
            **compare_rounds(rounds)}
