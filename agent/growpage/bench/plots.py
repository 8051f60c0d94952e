"""PNG plots of the quality and serving benchmarks (matplotlib, no display needed)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

FAMILY_MARKERS = {"full": "*", "fixed_budget": "o", "quantization": "s", "growpage": "D", "ablation": "x"}


def _pyplot() -> Any:
    # deferred: matplotlib (the bench extra) loads only when a plot is drawn
    import matplotlib

    matplotlib.use("Agg")
    # deferred: pyplot only after the Agg backend is chosen
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _family(method: str) -> str:
    # deferred: growpage.core.methods imports torch; plotting saved results needs none
    from growpage.core.methods import build_method

    return build_method(method).family


def quality_pareto(result: dict, path: Path) -> Path:
    """Final-answer agreement (and prefix agreement) vs mean KV bytes per request, per method and
    budget; the Pareto frontier is drawn as a line."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    points = result["results"]
    for ax, metric, title in ((axes[0], "answer_agreement", "final-answer agreement with full KV"),
                              (axes[1], "agree_prefix_fraction", "greedy tokens agreeing before first divergence")):
        for p in points:
            if p[metric] is None:
                continue
            ax.scatter(p["kv_bytes_mean"] / 2**20, p[metric], marker=FAMILY_MARKERS[_family(p["method"])], s=60,
                       label=p["label"])
            ax.annotate(p["label"], (p["kv_bytes_mean"] / 2**20, p[metric]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
        front = sorted((p for p in points if p["label"] in result["pareto_front"] and p[metric] is not None),
                       key=lambda p: p["kv_bytes_mean"])
        if metric == "answer_agreement" and front:
            ax.plot([p["kv_bytes_mean"] / 2**20 for p in front], [p[metric] for p in front], "k--", lw=1,
                    label="Pareto frontier")
        ax.set_xlabel("mean KV bytes held per request (MiB)")
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
    axes[0].set_title("Quality vs KV bytes (higher-left is better)")
    return _save(plt, fig, path)


def serving_throughput_latency(result: dict, path: Path) -> Path:
    """Tokens/s vs p99 inter-token latency, one point per (method, pool size)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 5))
    for method in dict.fromkeys(r["method"] for r in result["runs"]):
        runs = [r for r in result["runs"] if r["method"] == method]
        ax.plot([r["itl_p99_ms"] for r in runs], [r["tokens_per_s"] for r in runs],
                marker=FAMILY_MARKERS[_family(method)], label=method)
        for r in runs:
            ax.annotate(f"{r['pool_pages']}p", (r["itl_p99_ms"], r["tokens_per_s"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("p99 inter-token latency (ms)")
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput vs p99 ITL (labels: pool pages)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def serving_throughput_pool(result: dict, path: Path) -> Path:
    """Tokens/s (and preemptions) vs pool size: where compression starts to pay."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    for method in dict.fromkeys(r["method"] for r in result["runs"]):
        runs = sorted((r for r in result["runs"] if r["method"] == method), key=lambda r: r["pool_pages"])
        pools = [r["pool_pages"] for r in runs]
        top.plot(pools, [r["tokens_per_s"] for r in runs], marker=FAMILY_MARKERS[_family(method)], label=method)
        bottom.plot(pools, [r["preemptions"] for r in runs], marker=FAMILY_MARKERS[_family(method)], label=method)
    top.set_ylabel("output tokens/s")
    top.set_title(f"Throughput vs pool size (full-KV demand: {result['full_kv_demand_pages']} pages)")
    bottom.set_ylabel("preemptions")
    bottom.set_xlabel("KV pool (pages)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend(fontsize=8)
    return _save(plt, fig, path)


def decision_timeline(timeline: dict, path: Path) -> Path:
    """One request's STS density and LTS entropy over its steps, its pages, and its decisions."""
    plt = _pyplot()
    fig, (signals, pages) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    rows = timeline["signals"]
    tokens = [r["tokens"] for r in rows]
    signals.plot(tokens, [r["sts_density"] for r in rows], label="STS density")
    signals.plot(tokens, [r["lts_entropy"] for r in rows], label="LTS entropy (nats)")
    signals.set_ylabel("signal")
    signals.legend(fontsize=8)
    pages.step(tokens, [r["pages_held"] for r in rows], where="post", color="grey", label="pages held")
    colours = {"allocate": "tab:green", "quantize": "tab:blue", "evict": "tab:red", "defer": "tab:orange",
               "preempt": "black", "denied": "tab:purple", "throttled": "tab:brown"}
    tokens_at_step = {r["step"]: r["tokens"] for r in rows}
    for event in timeline["decisions"]:
        if event["step"] in tokens_at_step:
            pages.scatter(tokens_at_step[event["step"]], event["pages_after"],
                          color=colours.get(event["kind"], "black"), label=event["kind"], zorder=3)
    handles, labels = pages.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    pages.legend(unique.values(), unique.keys(), fontsize=8)
    pages.set_ylabel("pages")
    pages.set_xlabel("tokens in the request (prompt + generated)")
    signals.set_title(f"{timeline['method']} at {timeline['budget_pages']} pages: {timeline['task']}")
    for ax in (signals, pages):
        ax.grid(alpha=0.3)
    return _save(plt, fig, path)


SWEEP_MARKERS = {"growpage": "D", "streaming_llm": "o", "h2o": "s", "snapkv": "^", "tova": "v"}  # others: "x"


def sweep_tradeoff(result: dict, path: Path) -> Path:
    """``gpctl bench vllm --part sweep``: tokens/s (median, range as error bars) against NLL increase
    over full KV, one line per method through its floors or budgets; vLLM alone and the limit as
    points. One panel per trace seed."""
    # deferred: growpage.bench.sweep imports torch; plotting saved results needs none
    from growpage.bench.sweep import COVERAGE_AXIS

    plt = _pyplot()
    sweeps = result["sweeps"]
    fig, axes = plt.subplots(1, len(sweeps), figsize=(7 * len(sweeps), 5), squeeze=False)
    for ax, sweep in zip(axes[0], sweeps, strict=True):
        points = sweep["points"]
        labels = sorted({p.get("variant", "") for p in points.values()})
        for (method, marker), label in itertools.product(SWEEP_MARKERS.items(), labels):
            budgets = [p for p in points.values() if p["method"] == method and p.get("axis") != COVERAGE_AXIS
                       and p.get("variant", "") == label]
            _sweep_line(ax, sorted(budgets, key=lambda p: p["base_pages"]), marker,
                        f"{method}/{label}" if label else method, lambda p: f"{p['base_pages']}b")
        for label in labels:
            coverage = sorted((p for p in points.values() if p.get("axis") == COVERAGE_AXIS
                               and p.get("variant", "") == label), key=lambda p: p["attention_coverage"])
            if coverage:
                name = f"growpage@{coverage[0]['base_pages']}b{'/' + label if label else ''}, attention_coverage"
                _sweep_line(ax, coverage, "P", name, lambda p: f"c{p['attention_coverage']:g}")
        for name, marker in (("vllm", "X"), ("limit", "*")):
            ax.scatter([0.0], [points[name]["tokens_per_s"]["median"]], marker=marker, s=90, color="black",
                       label=f"{name} ({'vLLM alone' if name == 'vllm' else 'room for all'})", zorder=3)
        ax.set_xlabel("NLL increase over full KV (nats/token, lower is better)")
        ax.set_ylabel("output tokens/s (median, range of the repeats)")
        ax.set_title(f"Decode-heavy pressure trace, seed {sweep['seed']} (labels: blocks, c: attention_coverage)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(plt, fig, path)


def _sweep_line(ax: Any, line: list[dict], marker: str, label: str, annotation: Callable[[dict], str]) -> None:
    """One method's points through the sweep: median tokens/s (range as error bars) against NLL."""
    if not line:
        return
    speeds = [p["tokens_per_s"]["median"] for p in line]
    errors = [[s - p["tokens_per_s"]["range"][0] for s, p in zip(speeds, line, strict=True)],
              [p["tokens_per_s"]["range"][1] - s for s, p in zip(speeds, line, strict=True)]]
    ax.errorbar([p["nll_increase"] for p in line], speeds, yerr=errors, marker=marker, capsize=3, label=label)
    for p, speed in zip(line, speeds, strict=True):
        ax.annotate(annotation(p), (p["nll_increase"], speed), fontsize=7, xytext=(3, 3), textcoords="offset points")


def write_all(result: dict, directory: Path) -> list[Path]:
    """Every plot the result supports, into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    quality = result.get("quality")
    serving = result.get("serving")
    if quality:
        written.append(quality_pareto(quality, directory / "quality_pareto.png"))
        if quality.get("timeline"):
            written.append(decision_timeline(quality["timeline"], directory / "decision_timeline.png"))
    if serving:
        written.append(serving_throughput_latency(serving, directory / "serving_throughput_latency.png"))
        written.append(serving_throughput_pool(serving, directory / "serving_throughput_pool.png"))
    return written
