"""``gpctl bench engine``: the reference engine on the packaged model, side by side in one run.

* decode throughput at batch 1, 8 and 32 (GrowPage off), and the process's peak RSS;
* the per-step cost of GrowPage monitor mode vs off, and of telemetry (metrics; metrics + tracing
  sampled at 1.0 and at 0.01) vs none: variants interleaved round-robin on the same workload so
  machine noise hits all of them alike; medians and ratios to the baseline.

Every run is greedy with ``ignore_eos`` so each variant computes exactly the same tokens.
"""

from __future__ import annotations

import dataclasses
import resource
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from growpage import __version__
from growpage.chat import chat_token_ids, user_turn
from growpage.config import GrowPageConfig, Mode
from growpage.engine.engine import EngineConfig, LLMEngine
from growpage.engine.llama import LlamaModel
from growpage.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from growpage.telemetry import TelemetryAgent

PROMPT = "Explain step by step how a bicycle converts pedalling into forward motion."


@dataclasses.dataclass(frozen=True)
class EngineBenchSettings:
    batch_sizes: tuple[int, ...] = (1, 8, 32)
    new_tokens: int = 64
    overhead_batch: int = 8
    overhead_tokens: int = 48
    repeats: int = 3
    threads: int | None = None

    @classmethod
    def quick(cls) -> EngineBenchSettings:
        return cls(batch_sizes=(1, 4), new_tokens=16, overhead_batch=2, overhead_tokens=12, repeats=2)


def _engine(model: LlamaModel, tokenizer: Any, model_dir: str, mode: str, batch: int) -> LLMEngine:
    config = GrowPageConfig(mode=Mode(mode), base_pages=16, kv_dtype="float16")
    return LLMEngine(EngineConfig(model_dir=model_dir, num_pages=batch * 24 + 32, max_num_seqs=max(batch, 1),
                                  max_num_batched_tokens=4096, enable_prefix_caching=False),
                     config, model=model, tokenizer=tokenizer)


def _prompts(tokenizer: Any, batch: int) -> list[list[int]]:
    ids = chat_token_ids(tokenizer, user_turn(PROMPT))
    return [ids + [1 + i] for i in range(batch)]  # distinct prompts, equal lengths


def _run(engine: LLMEngine, prompts: list[list[int]], new_tokens: int,
         on_step: Callable[[], None] | None = None) -> dict[str, float]:
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(prompt, params)
    engine.step()  # prefill, timed separately from decode
    start = time.perf_counter()
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
        if on_step is not None:
            on_step()
    elapsed = time.perf_counter() - start
    decoded = len(prompts) * (new_tokens - 1)
    return {"decode_tokens_per_s": decoded / elapsed, "step_ms": elapsed / max(steps, 1) * 1e3}


def bench_throughput(model: LlamaModel, tokenizer: Any, model_dir: str,
                     settings: EngineBenchSettings) -> dict[str, dict[str, float]]:
    results = {}
    for batch in settings.batch_sizes:
        engine = _engine(model, tokenizer, model_dir, "off", batch)
        run = _run(engine, _prompts(tokenizer, batch), settings.new_tokens)
        results[f"batch_{batch}"] = {k: round(v, 2) for k, v in run.items()}
    return results


def _telemetry_variant(engine: LLMEngine, sample_ratio: float | None) -> tuple[TelemetryAgent, Callable[[], None]]:
    """Attach a telemetry agent (and a tracer sampling at ``sample_ratio``); scrape once a second."""
    # deferred: the OpenTelemetry SDK and growpage.telemetry load only for the telemetry variant
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from growpage.telemetry import TelemetryAgent

    provider = None
    if sample_ratio is not None:
        provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
        provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    agent = TelemetryAgent(engine.manager, model="bench", tracer_provider=provider)
    last_scrape = [time.monotonic()]

    def on_step() -> None:
        agent.on_step()
        if time.monotonic() - last_scrape[0] >= 1.0:  # a Prometheus scraping every second
            agent.render(None)
            last_scrape[0] = time.monotonic()

    return agent, on_step


def bench_overheads(model: LlamaModel, tokenizer: Any, model_dir: str, settings: EngineBenchSettings) -> dict[str, Any]:
    variants = {
        "off": ("off", None, False),
        "monitor": ("monitor", None, False),
        "monitor+metrics": ("monitor", None, True),
        "monitor+metrics+tracing@1.0": ("monitor", 1.0, True),
        "monitor+metrics+tracing@0.01": ("monitor", 0.01, True),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    prompts = _prompts(tokenizer, settings.overhead_batch)
    for _ in range(settings.repeats):
        for name, (mode, ratio, metrics) in variants.items():
            engine = _engine(model, tokenizer, model_dir, mode, settings.overhead_batch)
            if metrics:
                agent, on_step = _telemetry_variant(engine, ratio)
                run = _run(engine, prompts, settings.overhead_tokens, on_step)
                agent.close()
            else:
                run = _run(engine, prompts, settings.overhead_tokens)
            samples[name].append(run["decode_tokens_per_s"])
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return {
        "batch_size": settings.overhead_batch,
        "new_tokens": settings.overhead_tokens,
        "repeats": settings.repeats,
        "decode_tokens_per_s_median": {k: round(v, 2) for k, v in medians.items()},
        "throughput_ratio_monitor_vs_off": round(medians["monitor"] / medians["off"], 4),
        "throughput_ratio_vs_monitor": {name: round(medians[name] / medians["monitor"], 4)
                                        for name in variants if name.startswith("monitor+")},
    }


def run_engine_bench(model_dir: str, settings: EngineBenchSettings) -> dict[str, Any]:
    # deferred: transformers takes seconds to import; only a run that tokenizes loads it
    from transformers import AutoTokenizer

    if settings.threads:
        torch.set_num_threads(settings.threads)
    model = LlamaModel.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    result: dict[str, Any] = {
        "benchmark": "engine",
        "growpage_version": __version__,
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "model_dir": model_dir,
        "throughput": bench_throughput(model, tokenizer, model_dir, settings),
        "overheads": bench_overheads(model, tokenizer, model_dir, settings),
    }
    result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return result
