"""``gpctl bench core``: the cost of GrowPage's own machinery, side by side in one run.

Measured on the model geometry of the packaged model (SmolLM2-135M: 30 layers, 3 KV heads of 64,
9 query heads) unless told otherwise:

* ``decide()`` time per call (pure policy);
* per decode step, the cost of observing attention (summaries + eviction scores) relative to the
  paged attention it observes: the same batch stepped with ``mode=off`` and ``mode=monitor``,
  interleaved, medians of each and their ratio;
* page grant latency p50/p99 (what ``growpage_page_allocation_latency_seconds`` reports);
* quantize and evict throughput in tokens/s (tokens rewritten per second of compression);
* inside vLLM, at an 8B geometry: one observed step's milliseconds and peak transient memory,
  before and after chunked scoring, and one compaction (:mod:`growpage.bench.observation`).

Times are medians over repeats; on CUDA every timed region is synchronised.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import platform
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from growpage import __version__
from growpage.bench import observation
from growpage.config import GrowPageConfig, Mode
from growpage.core.policy import BoundaryState, decide
from growpage.core.quantiles import percentile
from growpage.core.summaries import summarize_attention
from growpage.engine.kv import attention as attn
from growpage.engine.kv.manager import GrowPageManager, SlotStatus
from growpage.errors import GrowPageError
from growpage.vllm_plugin.scoring import DEFAULT_CAP_BYTES


@dataclasses.dataclass(frozen=True)
class Geometry:
    num_layers: int = 30
    num_kv_heads: int = 3
    num_q_heads: int = 9
    head_dim: int = 64


@dataclasses.dataclass(frozen=True)
class CoreBenchSettings:
    device: str = "cpu"
    batch_size: int = 16
    context_tokens: int = 512
    decode_steps: int = 24
    repeats: int = 5
    geometry: Geometry = Geometry()
    # the vLLM observer and compactor: (requests, tokens) per observed step, at observation_geometry
    observation_sizes: tuple[tuple[int, int], ...] = ((16, 2048), (16, 8192), (128, 2048), (128, 8192))
    observation_geometry: observation.ObservationGeometry = observation.ObservationGeometry()
    observation_cap_bytes: int = DEFAULT_CAP_BYTES

    @classmethod
    def quick(cls, device: str = "cpu") -> CoreBenchSettings:
        return cls(device=device, batch_size=4, context_tokens=64, decode_steps=6, repeats=2,
                   geometry=Geometry(num_layers=4), observation_sizes=((4, 128),),
                   observation_geometry=observation.ObservationGeometry(num_layers=4, num_q_heads=8, num_kv_heads=4,
                                                                        head_dim=32),
                   observation_cap_bytes=2 ** 16)


def _median_time(fn: Callable[[], object], repeats: int, device: str) -> float:
    return observation.median_time(fn, repeats, torch.device(device))


def bench_decide(calls: int = 20_000) -> dict:
    config = GrowPageConfig()
    rng = random.Random(0)
    states = [BoundaryState(pages_held=rng.randint(100, 200), base_pages=128, sts_density=rng.random(),
                            lts_entropy=rng.random() * 4, pool_free_pages=rng.randint(0, 5),
                            growth_budget_pages=rng.random() * 3, can_quantize=rng.random() < 0.8,
                            can_evict=rng.random() < 0.8) for _ in range(256)]
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for i in range(calls):
            decide(states[i & 255], config)
        samples.append((time.perf_counter() - start) / calls)
    return {"decide_ns_per_call": round(statistics.median(samples) * 1e9, 1)}


def _manager(settings: CoreBenchSettings, mode: str, **config: Any) -> GrowPageManager:
    g = settings.geometry
    pages_per_request = math.ceil((settings.context_tokens + settings.decode_steps * settings.repeats * 4 + 64) / 16)
    cfg = GrowPageConfig(mode=Mode(mode), base_pages=pages_per_request, **config)
    return GrowPageManager(cfg, num_layers=g.num_layers, num_kv_heads=g.num_kv_heads, head_dim=g.head_dim,
                           num_pages=pages_per_request * (settings.batch_size + 2) + 64,
                           device=settings.device, max_requests=settings.batch_size + 2)


def _prefill(manager: GrowPageManager, settings: CoreBenchSettings, generator: torch.Generator) -> list[str]:
    g, device = settings.geometry, settings.device
    ids = [f"r{i}" for i in range(settings.batch_size)]
    for rid in ids:
        manager.admit(rid, settings.context_tokens)
        manager.ensure_slots(rid, settings.context_tokens)
        plan = manager.plan_step([(rid, settings.context_tokens)])
        for layer in range(g.num_layers):
            query = torch.randn(1, settings.context_tokens, g.num_q_heads, g.head_dim, generator=generator).to(device)
            kv = torch.randn(2, settings.context_tokens, g.num_kv_heads, g.head_dim, generator=generator).to(device)
            manager.attend(layer, plan, query, kv[0], kv[1], g.head_dim ** -0.5)
        manager.finish_step(plan)
    return ids


def _decode_step(manager: GrowPageManager, ids: list[str], settings: CoreBenchSettings,
                 inputs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
    g = settings.geometry
    for rid in ids:
        assert manager.ensure_slots(rid, 1) is SlotStatus.OK
    plan = manager.plan_step([(rid, 1) for rid in ids])
    for layer in range(g.num_layers):
        query, key, value = inputs[layer]
        manager.attend(layer, plan, query, key, value, g.head_dim ** -0.5)
    manager.finish_step(plan)


def bench_monitor_overhead(settings: CoreBenchSettings) -> dict:
    """Decode steps with mode off vs monitor on identical inputs, interleaved, medians."""
    g, device = settings.geometry, settings.device
    managers, ids = {}, {}
    for mode in ("off", "monitor"):
        managers[mode] = _manager(settings, mode)
        ids[mode] = _prefill(managers[mode], settings, torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(1)
    inputs = [(torch.randn(settings.batch_size, 1, g.num_q_heads, g.head_dim, generator=generator).to(device),
               torch.randn(settings.batch_size, g.num_kv_heads, g.head_dim, generator=generator).to(device),
               torch.randn(settings.batch_size, g.num_kv_heads, g.head_dim, generator=generator).to(device))
              for _ in range(g.num_layers)]
    step_s: dict[str, list[float]] = {"off": [], "monitor": []}
    for _ in range(settings.repeats):
        for mode in ("off", "monitor"):
            step_s[mode].append(_median_time(
                functools.partial(_decode_step, managers[mode], ids[mode], settings, inputs), settings.decode_steps,
                device))
    off, monitor = statistics.median(step_s["off"]), statistics.median(step_s["monitor"])

    # The observation alone, isolated: one layer's attention vs observing it (probs, summaries
    # inputs, eviction scores) vs folding a step into the summaries.
    manager = managers["monitor"]
    plan = manager.plan_step([(rid, 1) for rid in ids["monitor"]])
    query = inputs[0][0]
    scale = g.head_dim ** -0.5

    def attention_only():
        keys, values = attn.gather_kv(manager.store, 0, plan.layout, manager.compute_dtype)
        return attn.paged_attention(query, keys, values, plan.layout, scale)

    keys, _ = attn.gather_kv(manager.store, 0, plan.layout, manager.compute_dtype)
    attend_s = _median_time(attention_only, 10, device)
    observe_s = _median_time(lambda: manager._observe(plan, query, keys, scale), 10, device)
    summary_s = _median_time(lambda: manager.summaries.observe(
        plan.summary_rows, plan.bin_mass, plan.entropy), 10, device)
    return {
        "batch_size": settings.batch_size,
        "context_tokens": settings.context_tokens,
        "observed_layers": len(manager.observed_layers),
        "step_ms_off": round(off * 1e3, 3),
        "step_ms_monitor": round(monitor * 1e3, 3),
        "monitor_over_off_step_time": round(monitor / off, 4),
        "attention_ms_one_layer": round(attend_s * 1e3, 3),
        "observe_ms_one_layer": round(observe_s * 1e3, 3),
        "summary_update_ms_per_step": round(summary_s * 1e3, 4),
        "summary_cost_per_step_vs_observed_attention": round(
            (observe_s * len(manager.observed_layers) + summary_s) / (attend_s * g.num_layers), 4),
    }


def bench_grants(settings: CoreBenchSettings) -> dict:
    """Grant one page at a time until a request has grown by many pages; latency percentiles."""
    manager = _manager(settings, "enforce", max_growth_rate=1e9)
    manager.admit("grower", 1)
    latencies = []
    for _ in range(400):
        if not manager.pool.can_reserve(1):
            break
        start = time.perf_counter()
        manager._grant_one(manager.requests["grower"])
        latencies.append(time.perf_counter() - start)
    latencies.sort()
    return {"grant_latency_p50_us": round(_required(percentile(latencies, 0.50)) * 1e6, 2),
            "grant_latency_p99_us": round(_required(percentile(latencies, 0.99)) * 1e6, 2),
            "grants_measured": len(latencies)}


def bench_compression(settings: CoreBenchSettings) -> dict:
    """Tokens rewritten per second by quantize (FP16 -> INT8, INT4) and by evict + compact."""
    results: dict[str, float] = {}
    for label, overrides in (("quantize_int8", dict(quantization_bits=8)),
                             ("quantize_int4", dict(quantization_bits=4)),
                             ("evict", dict()), ("evict_late", dict())):
        manager = _manager(settings, "enforce", recent_window_tokens=16, sink_tokens=4, **overrides)
        ids = _prefill(manager, settings, torch.Generator().manual_seed(2))
        request = manager.requests[ids[0]]
        if label == "evict_late":
            # H2O-style accumulated scores favour old tokens (they have been attended to longest),
            # so the lowest-ranked tokens sit just before the recent window: only the group's last
            # pages are rewritten
            positions = manager.store.positions[request.pages].float()
            manager.store.scores[request.pages] = torch.where(positions >= 0, 1.0 / (positions + 1.0), 0.0)
        samples = []
        tokens = 0
        for _ in range(settings.repeats):
            if label.startswith("evict"):
                evict_plan = manager._plan_evict(request)
                if evict_plan is None:
                    break
                tokens = int(evict_plan.keep.numel())
                per_page = manager.store.tokens_per_page[evict_plan.fmt]
                first_dropped = int((~evict_plan.keep).nonzero()[0, 0])
                results[f"{label}_tokens_rewritten_per_event"] = tokens - first_dropped // per_page * per_page
                samples.append(_median_time(functools.partial(manager._evict, request, evict_plan), 1,
                                            settings.device))
            else:
                quantize_plan = manager._plan_quantize(request)
                if quantize_plan is None:
                    break
                tokens = len(quantize_plan.pages) * manager.config.block_size
                samples.append(_median_time(functools.partial(manager._quantize, request, quantize_plan), 1,
                                            settings.device))
        if samples:
            seconds = statistics.median(samples)
            results[f"{label}_tokens_per_s"] = round(tokens / seconds)
            results[f"{label}_ms_per_event"] = round(seconds * 1e3, 3)
            results[f"{label}_tokens_per_event"] = tokens
    return results


def bench_observation(settings: CoreBenchSettings) -> dict:
    """The vLLM observer's step and one compaction at ``observation_geometry``, before and after
    chunked scoring (:mod:`growpage.bench.observation`).

    On CPU the synthetic cache holds only the observed layers, requests share a pool of at most
    1.5 GiB of blocks, a ``before`` whose analytic peak exceeds 2 GiB is not run, and peaks are
    analytic; on CUDA they are measured (``torch.cuda.max_memory_allocated``) and the limits are
    60 GiB.
    """
    g = settings.observation_geometry
    cpu = not settings.device.startswith("cuda")
    limit, pool = (2 * observation.GIB, 3 * observation.GIB // 2) if cpu else (60 * observation.GIB,
                                                                                 40 * observation.GIB)
    bins = GrowPageConfig().sts_num_bins
    steps = [observation.measure_observation(
        g, requests, tokens, device=settings.device, cap_bytes=settings.observation_cap_bytes, max_bytes=limit,
        pool_bytes=pool, repeats=1 if cpu else 5, num_bins=bins,
        summarize=lambda probs, positions, lengths: summarize_attention(probs, positions, lengths, bins))
        for requests, tokens in settings.observation_sizes]
    compactions = [observation.measure_compaction(g, tokens, device=settings.device, repeats=1 if cpu else 3,
                                                  max_bytes=limit)
                   for tokens in sorted({tokens for _, tokens in settings.observation_sizes})]
    return {"geometry": {k: str(v) for k, v in dataclasses.asdict(g).items()},
            "cache": "observed layers only" + (", requests share a 1.5 GiB block pool" if cpu else ""),
            "steps": steps, "compaction": compactions}


def run_core_bench(settings: CoreBenchSettings) -> dict:
    """Run every core benchmark; returns a JSON-ready dict."""
    if settings.device.startswith("cuda") and not torch.cuda.is_available():
        raise GrowPageError("--device cuda was asked for but torch sees no CUDA device; use --device cpu")
    device_name = torch.cuda.get_device_name() if settings.device.startswith("cuda") else platform.processor() or "cpu"
    return {
        "benchmark": "core",
        "growpage_version": __version__,
        "torch_version": torch.__version__,
        "device": settings.device,
        "device_name": device_name,
        "threads": torch.get_num_threads(),
        "geometry": dataclasses.asdict(settings.geometry),
        "policy": bench_decide(2_000 if settings.repeats < 3 else 20_000),
        "monitor_overhead": bench_monitor_overhead(settings),
        "grants": bench_grants(settings),
        "compression": bench_compression(settings),
        "observation": bench_observation(settings),
    }


def _required(value: float | None) -> float:
    return float("nan") if value is None else value
