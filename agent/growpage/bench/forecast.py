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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from growpage.bench.workloads import reasoning_tasks

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


def compare(monitor: dict, enforce: dict) -> dict:
    """The forecast of one monitor run against one enforce run of the same trace (pure)."""
    forecast = monitor["forecast"]
    avoided = monitor["preemptions"] - enforce["preemptions"]
    freed_error = relative_error(forecast["pages_freed"], enforce["pages_freed"])
    avoided_error = relative_error(forecast["preemptions_avoidable"], avoided)

    def within(error: float | None) -> bool:
        return error is None or error <= FORECAST_TOLERANCE

    return {"pages_freed": {"forecast": forecast["pages_freed"], "enforce": enforce["pages_freed"],
                            "relative_error": freed_error},
            "preemptions_avoided": {"forecast": forecast["preemptions_avoidable"], "enforce": avoided,
                                    "monitor_preemptions": monitor["preemptions"],
                                    "enforce_preemptions": enforce["preemptions"],
                                    "relative_error": avoided_error},
            "compactions": {"forecast": forecast["compactions"],
                            "enforce_evictions": enforce["decisions"].get("evict", 0)},
            "within_tolerance": within(freed_error) and within(avoided_error), "tolerance": FORECAST_TOLERANCE}


def forecast_trace(model_dir: str, settings: VllmBenchSettings, seed: int, log: Log, timeout_s: float) -> dict:
    """Monitor, then enforce, on the pressure trace of ``seed``; the forecast against enforce."""
    # deferred: both import torch; compare() and the forecast's tables need none
    from growpage.bench import goodput
    from growpage.tooling.vllm_runs import run_child

    prompts = [task.prompt for task in reasoning_tasks(settings.requests, settings.max_tokens, seed=seed)]
    runs = {}
    for mode in ("monitor", "enforce"):
        if log:
            log(f"vllm bench: forecast, seed {seed}, {mode}")
        spec = goodput.spec(model_dir, settings.block_size, prompts, settings.max_tokens, settings.kv_blocks, mode,
                            settings.growpage_config(mode))
        runs[mode] = goodput.without_outputs(run_child(spec, lambda report: None, timeout_s))
    return {"seed": seed, "kv_blocks": settings.kv_blocks, "runs": runs, **compare(runs["monitor"], runs["enforce"])}
