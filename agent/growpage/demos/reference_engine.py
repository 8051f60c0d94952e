"""The main job: GrowPage on the packaged model, side by side with full KV, in a few minutes.

Two runs of the same mixed workload through the reference engine, one model in memory:
1. full KV: GrowPage off, a pool large enough for everything (plain paging, the reference answers);
2. GrowPage enforce: small per-request grants, so long step-by-step answers meet page boundaries
   and GrowPage decides, live, whether to grow or compress each request.
Then a summary: pages granted, compressions by kind, bytes saved, grant latency, throughput, and
how closely GrowPage's greedy answers agree with the full-KV ones.
"""

from __future__ import annotations

import dataclasses
import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from growpage.agreement import token_agreement
from growpage.bench.prompts import REASONING_PROMPTS, SUMMARY_PROMPTS
from growpage.chat import chat_token_ids, user_turn
from growpage.config import GrowPageConfig, Mode
from growpage.core.quantiles import percentile
from growpage.core.stats import StatsSnapshot
from growpage.engine.engine import EngineConfig, LLMEngine
from growpage.engine.llama import LlamaModel
from growpage.engine.request import Request
from growpage.engine.sampling import SamplingParams


@dataclasses.dataclass(frozen=True)
class DemoSettings:
    reasoning_max_tokens: int = 320
    summary_max_tokens: int = 48
    base_pages: int = 8  # 128 tokens: short answers fit, long ones meet boundaries
    block_size: int = 16
    kv_cache_mib: int = 64
    max_num_seqs: int = 10

    @classmethod
    def quick(cls) -> DemoSettings:
        return cls(reasoning_max_tokens=128, summary_max_tokens=24, base_pages=4, kv_cache_mib=24)


@dataclasses.dataclass(frozen=True)
class RunResult:
    label: str
    requests: list[Request]
    wall_s: float
    stats: StatsSnapshot


Workload = list[tuple[list[int], SamplingParams, str]]  # (prompt ids, sampling, namespace = kind)


def build_workload(engine: LLMEngine, settings: DemoSettings) -> Workload:
    """Long reasoning prompts interleaved with short summaries, chat-templated, greedy."""
    items: Workload = []
    for index in range(max(len(REASONING_PROMPTS), len(SUMMARY_PROMPTS))):
        for prompts, max_tokens, kind in ((REASONING_PROMPTS, settings.reasoning_max_tokens, "reasoning"),
                                          (SUMMARY_PROMPTS, settings.summary_max_tokens, "summary")):
            if index < len(prompts):
                ids = chat_token_ids(engine.tokenizer, user_turn(prompts[index]))
                items.append((ids, SamplingParams(max_tokens=max_tokens, temperature=0.0), kind))
    return items


def run_workload(engine: LLMEngine, workload: Workload, label: str, console: Console | None) -> RunResult:
    ids = [engine.add_request(prompt, params, namespace=kind) for prompt, params, kind in workload]
    tracked = {rid: engine.requests[rid] for rid in ids}
    started = time.monotonic()
    decisions: dict[str, int] = {}

    def render() -> Group:
        gauges = engine.manager.gauges()
        done = sum(r.is_finished for r in tracked.values())
        tokens = sum(len(r.output_token_ids) for r in tracked.values())
        elapsed = max(time.monotonic() - started, 1e-9)
        table = Table(title=f"{label}: {done}/{len(tracked)} requests, {tokens} tokens, "
                            f"{tokens / elapsed:.1f} tok/s", expand=False)
        for column in ("pages free", "reserved", "used", "utilization", "allocate", "quantize", "evict",
                       "denied/throttled", "preempt"):
            table.add_column(column, justify="right")
        table.add_row(str(gauges.pages_free), str(gauges.pages_reserved), str(gauges.pages_used),
                      f"{gauges.utilization:.2f}",
                      *(str(decisions.get(k, 0)) for k in ("allocate", "quantize", "evict")),
                      f"{decisions.get('denied', 0)}/{decisions.get('throttled', 0)}", str(decisions.get("preempt", 0)))
        return Group(table)

    def step_all(live: Live | None) -> None:
        last = 0.0
        while engine.has_unfinished_requests():
            engine.step()
            decisions.update(engine.manager.stats.decisions_total)
            if live is not None and time.monotonic() - last > 0.25:
                live.update(render())
                last = time.monotonic()
        if live is not None:
            live.update(render())

    if console is not None:
        with Live(render(), console=console, refresh_per_second=4, transient=False) as live:
            step_all(live)
    else:
        step_all(None)
    wall_s = time.monotonic() - started
    return RunResult(label=label, requests=[tracked[rid] for rid in ids], wall_s=wall_s,
                     stats=engine.manager.make_stats())


def agreement(reference: list[Request], candidate: list[Request]) -> tuple[float, float, float]:
    """(share of identical answers, mean tokens before first divergence, mean matched fraction)."""
    result = token_agreement([r.output_token_ids for r in reference], [c.output_token_ids for c in candidate])
    return result.identical_share, result.mean_prefix_tokens, result.mean_matched_share


def summarize(full: RunResult, growpage: RunResult, console: Console) -> dict:
    same, prefix_tokens, matched = agreement(full.requests, growpage.requests)
    stats = growpage.stats
    p50 = percentile(stats.allocation_latencies_s, 0.5) or 0.0
    p99 = percentile(stats.allocation_latencies_s, 0.99) or 0.0
    tokens = {r.label: sum(len(q.output_token_ids) for q in r.requests) for r in (full, growpage)}
    saved = stats.compress_input_bytes_total - stats.compress_output_bytes_total
    table = Table(title="GrowPage vs full KV, same workload, greedy")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("pages granted (admission + growth)", f"{stats.pages_allocated_total:,}"),
        ("decisions: allocate / quantize / evict",
         " / ".join(str(stats.decisions_total[k]) for k in ("allocate", "quantize", "evict"))),
        ("refused: denied / throttled; preempted",
         f"{stats.decisions_total['denied']} / {stats.decisions_total['throttled']}; "
         f"{stats.decisions_total['preempt']}"),
        ("bytes compressed in -> out",
         f"{stats.compress_input_bytes_total:,} -> {stats.compress_output_bytes_total:,}"),
        ("KV bytes saved by compression", f"{saved / 2**20:.2f} MiB"),
        ("grant latency p50 / p99", f"{p50 * 1e6:.1f} us / {p99 * 1e6:.1f} us"),
        ("throughput full KV / GrowPage",
         f"{tokens[full.label] / full.wall_s:.1f} / {tokens[growpage.label] / growpage.wall_s:.1f} tok/s"),
        ("answers identical to full KV", f"{same:.0%}"),
        ("tokens before first divergence (mean)", f"{prefix_tokens:.1f}"),
        ("share of each answer matched (mean)", f"{matched:.0%}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    return {"identical_share": same, "mean_prefix_tokens": prefix_tokens, "mean_matched_share": matched,
            "pages_allocated_total": stats.pages_allocated_total, "decisions": stats.decisions_total,
            "compress_input_bytes": stats.compress_input_bytes_total,
            "compress_output_bytes": stats.compress_output_bytes_total,
            "grant_latency_p50_s": p50, "grant_latency_p99_s": p99,
            "tokens_per_s_full_kv": tokens[full.label] / full.wall_s,
            "tokens_per_s_growpage": tokens[growpage.label] / growpage.wall_s}


def run_demo(model_dir: str, settings: DemoSettings, console: Console | None = None, live: bool = True) -> dict:
    console = console or Console()

    console.print(f"[bold]GrowPage demo[/bold]: model {model_dir}")
    model = LlamaModel.from_pretrained(model_dir)
    full_config = GrowPageConfig(mode=Mode.OFF, block_size=settings.block_size, base_pages=settings.base_pages,
                                 recent_window_tokens=32, sink_tokens=4)
    grow_config = dataclasses.replace(full_config, mode=Mode.ENFORCE)
    full_engine = LLMEngine(EngineConfig(model_dir=model_dir, kv_cache_mib=settings.kv_cache_mib * 4,
                                         max_num_seqs=settings.max_num_seqs), full_config, model=model)
    workload = build_workload(full_engine, settings)
    console.print(f"workload: {len(workload)} requests ({sum(k == 'reasoning' for *_, k in workload)} "
                  f"step-by-step reasoning, {sum(k == 'summary' for *_, k in workload)} short summaries)")
    full = run_workload(full_engine, workload, "full KV (GrowPage off)", console if live else None)
    grow_engine = LLMEngine(EngineConfig(model_dir=model_dir, kv_cache_mib=settings.kv_cache_mib,
                                         max_num_seqs=settings.max_num_seqs), grow_config, model=model,
                            tokenizer=full_engine.tokenizer)
    grown = run_workload(grow_engine, workload, "GrowPage enforce", console if live else None)
    return summarize(full, grown, console)
