"""Goodput inside vLLM: correct answers per second, accuracy and fidelity next to tokens/s.

Used by ``gpctl bench vllm`` (:mod:`growpage.bench.vllm`). Every variant of a comparison runs
``repeats`` times, interleaved (the order reverses each round, so drift over the run does not
always favour the same variant), after a discarded warm-up; results are medians with their range,
every repeat kept in the JSON. Parts:

* ``retrieval``: retrieval tasks (``growpage.bench.tasks``) all at once under KV pressure (a KV
  space for about ``retrieval_kv_share`` of them) with vLLM alone (untuned, and with each
  ``tuned_max_num_seqs``: ``vllm@seqsN``), with GrowPage at the shipped defaults, with GrowPage
  under growth-aware admission (``growpage@projected``, what ``admission: auto`` runs on CPU), with
  each fixed cap at GrowPage's floor under the same machinery (``streaming_llm@N``, ``h2o@N``,
  ``snapkv@N``, ``tova@N``: the plugin's ``method`` setting), and with room for all (the limit):
  accuracy against ground truth per family, correct answers per second, wall time.
  ``retrieval_skip`` leaves variants out. Prompt-heavy work: compression can only cost answers
  here, unless it avoids waiting.
* ``accuracy``: full KV's accuracy on every retrieval family (48 tasks by default), with room for
  all: which families are headlined (full KV >= 80 %).
* on the pressure traces (reasoning, decode-heavy): reasoning accuracy against true results,
  reported apart, and GrowPage's NLL increase over full KV by forced decoding
  (:mod:`growpage.bench.fidelity`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from growpage.bench.fidelity import forced_spec, nll_increase
from growpage.bench.rollout import rollout_check, schedule_changed
from growpage.bench.tasks import RETRIEVAL_MAX_TOKENS, Task, accuracy_by_family, headline_families, is_correct
from growpage.bench.tasks import retrieval_tasks as generate
from growpage.chat import chat_token_ids, user_turn
from growpage.core.methods import VLLM_CAP_NAMES
from growpage.core.quantiles import spread
from growpage.errors import ConfigError, GrowPageError
from growpage.tooling.vllm_runs import run_child

if TYPE_CHECKING:
    from growpage.bench.vllm_settings import VllmBenchSettings

Log = Callable[[str], None] | None
RETRIEVAL_CAPS = VLLM_CAP_NAMES  # fixed caps at GrowPage's floor, same machinery
TUNED_PREFIX = "vllm@seqs"  # vLLM alone with a smaller max_num_seqs (as the headline names it)
NEVER_WORSE_SHARE = 0.98  # GrowPage's correct answers/s at least this share of tuned vLLM alone's
GROWTH_AWARE = "growpage@projected"  # enforce with growth-aware admission (auto on CPU)
RETRIEVAL_ALWAYS_RUN = ("vllm", "growpage")  # what the comparison reads


def spec(model_dir: str, block_size: int, prompts: list[str], max_tokens: int | list[int], kv_blocks: int, variant: str,
         growpage: dict | None, max_model_len: int | None = None) -> dict:
    """One vLLM run (:mod:`growpage.tooling.vllm_child`): ``growpage`` None is vLLM alone."""
    return {"model_dir": model_dir, "prompts": prompts, "variant": variant, "growpage": growpage,
            "block_size": block_size, "kv_blocks": kv_blocks, "max_tokens": max_tokens,
            "max_model_len": max_model_len or min(2048, (kv_blocks - 1) * block_size), "report_interval_s": 5.0}


def prompt_tokens(tokenizer: Any, prompt: str) -> int:
    return len(chat_token_ids(tokenizer, user_turn(prompt)))


def round_order(variants: Sequence[str], repeat: int) -> tuple[str, ...]:
    """The variants' order in round ``repeat``: reversed every other round."""
    return tuple(variants) if repeat % 2 == 0 else tuple(reversed(variants))


def repeated(run: Callable[[str], dict], variants: Sequence[str], repeats: int, log: Log,
             label: str) -> dict[str, list[dict]]:
    """``repeats`` interleaved rounds of every variant; each variant's results in round order."""
    results: dict[str, list[dict]] = {variant: [] for variant in variants}
    for repeat in range(repeats):
        for variant in round_order(variants, repeat):
            if log:
                log(f"vllm bench: {label}, round {repeat + 1}/{repeats}, {variant}")
            results[variant].append(run(variant))
    return results


def answer_texts(tokenizer: Any, result: dict, count: int) -> list[str]:
    """Each request's reply as a user reads it: up to its first end of sequence."""
    texts = []
    for index in range(count):
        token_ids = result["outputs"][str(index)]
        ends = [i for i, token in enumerate(token_ids) if token == tokenizer.eos_token_id]
        texts.append(tokenizer.decode(token_ids[:ends[0]] if ends else token_ids, skip_special_tokens=True))
    return texts


def scored(tokenizer: Any, tasks: Sequence[Task | None], runs: list[dict]) -> dict:
    """Accuracy against ground truth of each run (``tasks[i]`` is prompt ``i``'s task, None where it
    has no true answer) and correct answers per second of wall time."""
    answerable = [(index, task) for index, task in enumerate(tasks) if task is not None]
    if not answerable:
        return {"answerable": 0}
    accuracies, per_second, by_family = [], [], []
    for run in runs:
        correct = correct_answers(tokenizer, tasks, run)
        accuracies.append(sum(correct) / len(correct))
        per_second.append(sum(correct) / run["elapsed_s"])
        by_family.append(accuracy_by_family([task for _, task in answerable], correct))
    return {"answerable": len(answerable), "accuracy": spread(accuracies), "correct_per_s": spread(per_second),
            "accuracy_by_family": by_family[0], "accuracy_by_family_every_repeat": by_family}


def correct_answers(tokenizer: Any, tasks: Sequence[Task | None], run: dict) -> list[bool]:
    """Whether each answerable prompt of ``run`` was answered right (``tasks[i]`` None: no true answer)."""
    texts = answer_texts(tokenizer, run, len(tasks))
    return [is_correct(task, texts[index]) for index, task in enumerate(tasks) if task is not None]


def forced_nll(run_spec: dict, reference: dict, log: Log, timeout_s: float) -> dict:
    """``run_spec`` (a compressed variant's run) forced through full KV's continuation
    (``reference``: a run with room for all and raw log-probabilities): the per-token NLL increase.

    Raises:
        GrowPageError: the forced run did not emit the reference tokens.
    """
    if log:
        log(f"vllm bench: {run_spec['variant']} forced through full KV's continuation (fidelity)")
    keys = [str(index) for index in range(len(run_spec["prompts"]))]
    forced = run_child(forced_spec(run_spec, [reference["outputs"][key] for key in keys]), lambda report: None,
                       timeout_s)
    if any(forced["outputs"][key] != reference["outputs"][key] for key in keys):
        raise GrowPageError("the forced run did not emit the reference tokens: the forcing logits processor "
                            "was not applied (vLLM's logits_processors setting)")
    fidelity = nll_increase({key: reference["logprobs"][key] for key in keys},
                            {key: forced["logprobs"][key] for key in keys})
    return {**fidelity, "forced_run": without_outputs(forced)}


def without_outputs(result: dict) -> dict:
    return {key: value for key, value in result.items() if key not in ("outputs", "logprobs")}


def retrieval_tasks(settings: VllmBenchSettings) -> list[Task]:
    return generate(settings.seeds[0], families=settings.retrieval_families,
                    context_tokens=settings.retrieval_context_tokens, depths=settings.retrieval_depths)


def blocks_needed(lengths: Sequence[int], max_tokens: int | Sequence[int], block_size: int) -> list[int]:
    """Each request's blocks at full length (prompt plus ``max_tokens``: one for all, or one each)."""
    limits = [max_tokens] * len(lengths) if isinstance(max_tokens, int) else list(max_tokens)
    return [math.ceil((length + limit) / block_size) for length, limit in zip(lengths, limits, strict=True)]


def retrieval_configs(settings: VllmBenchSettings) -> dict[str, dict[str, Any]]:
    """Every retrieval variant's run settings, in run order: ``growpage`` (None: vLLM alone) and
    ``max_num_seqs`` (None: every request), less ``retrieval_skip``.

    Raises:
        ConfigError: ``retrieval_skip`` names no variant, or one the comparison reads.
    """
    growpage = settings.growpage_config()
    configs: dict[str, dict[str, Any]] = {"vllm": {"growpage": None}}
    for seqs in settings.tuned_max_num_seqs:
        configs[f"{TUNED_PREFIX}{seqs}"] = {"growpage": None, "max_num_seqs": seqs}
    configs["monitor"] = {"growpage": settings.growpage_config("monitor")}  # its forecast: enforce or not
    configs["growpage"] = {"growpage": growpage}
    configs[GROWTH_AWARE] = {"growpage": {**growpage, "admission": "projected"}}
    for cap in RETRIEVAL_CAPS:
        configs[f"{cap}@{settings.floor_pages}"] = {"growpage": {**growpage, "method": cap}}
    configs["limit"] = {"growpage": None}
    unknown = sorted(set(settings.retrieval_skip) - set(configs))
    if unknown:
        raise ConfigError(f"retrieval_skip names no variant: {', '.join(unknown)}; choose among {', '.join(configs)}")
    kept = [name for name in settings.retrieval_skip if name in RETRIEVAL_ALWAYS_RUN]
    if kept:
        raise ConfigError(f"retrieval_skip cannot leave out {', '.join(kept)}: the comparison reads "
                          f"{', '.join(RETRIEVAL_ALWAYS_RUN)}")
    return {name: config for name, config in configs.items() if name not in settings.retrieval_skip}


def retrieval_under_pressure(model_dir: str, settings: VllmBenchSettings, log: Log, timeout_s: float) -> dict:
    """Every retrieval task at once, vLLM alone and GrowPage in a KV space for about
    ``retrieval_kv_share`` of them, the limit with room for all; interleaved repeats."""
    # deferred: transformers takes seconds to import; only a run that tokenizes loads it
    from transformers import AutoTokenizer

    tasks = retrieval_tasks(settings)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pressure = answers_under_pressure(model_dir, settings, tokenizer, tasks, [task.prompt for task in tasks],
                                      [RETRIEVAL_MAX_TOKENS] * len(tasks), "retrieval under KV pressure", log,
                                      timeout_s)
    return {"tasks": [{"task": t.task_id, "family": t.family, "answer": t.answer, "prompt_tokens": n}
                      for t, n in zip(tasks, pressure["prompt_tokens"], strict=True)],
            "variants": pressure["variants"], "comparison": answers_comparison(pressure["variants"])}


def answers_under_pressure(model_dir: str, settings: VllmBenchSettings, tokenizer: Any, tasks: Sequence[Task | None],
                           prompts: list[str], max_tokens: list[int], label: str, log: Log, timeout_s: float, *,
                           fidelity: bool = False) -> dict:
    """``prompts`` all at once (replies end at their end of sequence or ``max_tokens``), every
    :func:`retrieval_configs` variant in a KV space for about ``retrieval_kv_share`` of what they
    need at full length, the limit with room for all; interleaved repeats. Each variant scored
    against ``tasks`` (None: a prompt without a true answer). With ``fidelity`` the limit also
    records log-probabilities and every compressed variant is forced once through its continuation
    (the NLL increase over full KV, ``nll``).

    Returns:
        ``prompt_tokens`` (each prompt's) and ``variants`` (name: scores, spreads, runs).
    """
    lengths = [prompt_tokens(tokenizer, prompt) for prompt in prompts]
    needed = blocks_needed(lengths, max_tokens, settings.block_size)
    tight = max(max(needed) + 1, round(sum(needed) * settings.retrieval_kv_share) + 1)
    configs = retrieval_configs(settings)
    blocks = {variant: tight for variant in configs} | {"limit": sum(needed) + 1}
    max_model_len = max(needed) * settings.block_size

    def run_spec(variant: str) -> dict:
        made = spec(model_dir, settings.block_size, prompts, max_tokens, blocks[variant], variant,
                    configs[variant]["growpage"], max_model_len)
        return {**made, "ignore_eos": False, "max_num_seqs": configs[variant].get("max_num_seqs"),
                "logprobs": fidelity and variant == "limit"}

    results = repeated(lambda variant: run_child(run_spec(variant), lambda report: None, timeout_s), tuple(configs),
                       settings.repeats, log, label)
    variants = {variant: {"kv_blocks": blocks[variant], **scored(tokenizer, tasks, runs),
                          "elapsed_s": spread([r["elapsed_s"] for r in runs]),
                          "tokens_per_s": spread([r["tokens_per_s"] for r in runs]),
                          "preemptions": [r["preemptions"] for r in runs], "decisions": runs[0]["decisions"],
                          "runs": [without_outputs(r) for r in runs]}
                for variant, runs in results.items()}
    if fidelity and "limit" in results:
        for variant, config in configs.items():
            if config["growpage"] is not None:
                nll = forced_nll(run_spec(variant), results["limit"][0], log, timeout_s)
                variants[variant] |= {"nll_increase": nll["mean"], "nll": nll}
    return {"prompt_tokens": lengths, "variants": variants}


def answers_comparison(variants: dict[str, dict]) -> dict:
    """GrowPage against vLLM alone (accuracy share and wall-time ratio, medians) and against the
    most accurate fixed cap (its accuracy and correct answers/s; ties go to the faster cap)."""
    base, grow = variants["vllm"], variants["growpage"]
    base_accuracy = base["accuracy"]["median"]
    caps = [name for name in variants if name.split("@")[0] in RETRIEVAL_CAPS]
    best = max(caps, key=lambda name: (variants[name]["accuracy"]["median"],
                                       variants[name]["correct_per_s"]["median"]), default=None)
    against_cap = {} if best is None else {
        "best_cap": best, "best_cap_accuracy": variants[best]["accuracy"]["median"],
        "growpage_accuracy_minus_best_cap": round(grow["accuracy"]["median"] - variants[best]["accuracy"]["median"], 3),
        "growpage_correct_per_s_vs_best_cap": round(grow["correct_per_s"]["median"]
                                                    / max(variants[best]["correct_per_s"]["median"], 1e-9), 3)}
    return {"growpage_accuracy_share_of_vllm": round(grow["accuracy"]["median"] / base_accuracy, 3)
            if base_accuracy else None, **against_cap,
            "growpage_wall_vs_vllm": round(grow["elapsed_s"]["median"] / base["elapsed_s"]["median"], 3),
            "growpage_correct_per_s_vs_vllm": round(grow["correct_per_s"]["median"]
                                                    / max(base["correct_per_s"]["median"], 1e-9), 3),
            **_against_tuned(variants),
            # the forecast before enforce: calibrate's recommendation from monitor's runs against what
            # enforce then did (correct answers/s against vLLM alone's at the same engine arguments)
            "rollout": (rollout_check(variants["monitor"]["runs"], grow["correct_per_s"]["median"]
                                      / max(base["correct_per_s"]["median"], 1e-9),
                                      base["elapsed_s"]["median"] - grow["elapsed_s"]["median"],
                                      schedule_changed(base["runs"], grow["runs"]))
                        if "monitor" in variants else None),
            "targets": {"accuracy_share_of_vllm": 0.95, "wall_vs_vllm": 1.05,
                        "correct_per_s_vs_tuned_vllm": NEVER_WORSE_SHARE}}


def _against_tuned(variants: dict[str, dict]) -> dict:
    """Each GrowPage variant against *tuned vLLM alone* (whichever of ``vllm`` and ``vllm@seqsN``
    answers the most per second): its correct answers/s ratio, its accuracy share, and whether it
    is never worse (at least ``NEVER_WORSE_SHARE`` of the answers/s at >= 95 % of the accuracy)."""
    alone = [name for name in variants if name == "vllm" or name.startswith(TUNED_PREFIX)]
    tuned = max(alone, key=lambda name: variants[name]["correct_per_s"]["median"])
    reference = variants[tuned]
    verdicts = {}
    for name in (name for name in ("growpage", GROWTH_AWARE) if name in variants):
        ratio = round(variants[name]["correct_per_s"]["median"] / max(reference["correct_per_s"]["median"], 1e-9), 3)
        share = (round(variants[name]["accuracy"]["median"] / reference["accuracy"]["median"], 3)
                 if reference["accuracy"]["median"] else None)
        verdicts[name] = {"correct_per_s_vs_tuned": ratio, "accuracy_share_of_tuned": share,
                          "never_worse": ratio >= NEVER_WORSE_SHARE and (share is None or share >= 0.95)}
    return {"tuned_vllm": tuned, "against_tuned_vllm": verdicts}


def full_kv_accuracy(model_dir: str, settings: VllmBenchSettings, log: Log, timeout_s: float) -> dict:
    """Full KV (vLLM alone, room for all, greedy) on every retrieval family at every length and
    depth (``growpage.bench.tasks`` defaults, seed ``seeds[0]``): accuracy per family, and the
    families a benchmark may headline."""
    # deferred: transformers takes seconds to import; only a run that tokenizes loads it
    from transformers import AutoTokenizer

    tasks = generate(settings.seeds[0])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    needed = blocks_needed([prompt_tokens(tokenizer, task.prompt) for task in tasks], RETRIEVAL_MAX_TOKENS,
                     settings.block_size)
    if log:
        log(f"vllm bench: full-KV accuracy on {len(tasks)} retrieval tasks")
    run_spec = spec(model_dir, settings.block_size, [task.prompt for task in tasks], RETRIEVAL_MAX_TOKENS,
                    sum(needed) + 1, "vllm", None, max(needed) * settings.block_size)
    result = run_child({**run_spec, "ignore_eos": False}, lambda report: None, timeout_s)
    texts = answer_texts(tokenizer, result, len(tasks))
    correct = [is_correct(task, text) for task, text in zip(tasks, texts, strict=True)]
    by_family = accuracy_by_family(tasks, correct)
    return {"tasks": len(tasks), "accuracy_by_family": by_family, "headlined": headline_families(by_family),
            "replies": {task.task_id: {"answer": task.answer, "reply": text, "correct": ok}
                        for task, text, ok in zip(tasks, texts, correct, strict=True)},
            "elapsed_s": round(result["elapsed_s"], 1)}


def summary(traces: list[dict], retrieval: dict, accuracy: dict) -> dict:
    """The goodput lines of ``gpctl bench vllm``'s summary."""
    return {"nll_increase_by_seed": {t["seed"]: t["nll_increase"]["growpage"]["mean"] for t in traces},
            "reasoning_accuracy_by_seed": {t["seed"]: {v: g.get("accuracy", {}).get("median")
                                                       for v, g in t["goodput"].items()} for t in traces},
            "retrieval": retrieval.get("comparison"),
            "full_kv_accuracy_by_family": {family: tally["accuracy"] for family, tally
                                           in accuracy.get("accuracy_by_family", {}).items()},
            "headlined_families": accuracy.get("headlined")}


def _cell(measure: dict | None, digits: int, percent: bool = False) -> str:
    """``median [min-max]`` of a :func:`spread`, a dash where there is none."""
    if not measure:
        return "-"
    scale, suffix = (100, "%") if percent else (1, "")
    low, high = (value * scale for value in measure["range"])
    median = measure["median"] * scale
    if low == high:
        return f"{median:.{digits}f}{suffix}"
    return f"{median:.{digits}f}{suffix} [{low:.{digits}f}-{high:.{digits}f}]"


def goodput_rows(result: dict) -> list[tuple[str, ...]]:
    """Table rows of ``gpctl bench vllm``'s JSON: one per workload and variant."""
    rows: list[tuple[str, ...]] = []
    for trace in result.get("traces", []):
        for variant in trace["tokens_per_s"]:
            scores = trace["goodput"].get(variant, {})
            nll = trace["nll_increase"].get(variant)
            rows.append((f"reasoning seed {trace['seed']} (apart)", variant, _cell(trace["tokens_per_s"][variant], 1),
                         _cell(scores.get("accuracy"), 0, percent=True), _cell(scores.get("correct_per_s"), 3),
                         "0 (ref)" if variant == "limit" else f"{nll['mean']:+.4f}" if nll else "-"))
    for part, workload in (("retrieval", "retrieval under KV pressure"), ("mixed", "mixed under KV pressure")):
        for variant, scores in result.get(part, {}).get("variants", {}).items():
            nll = scores.get("nll_increase")
            rows.append((workload, variant, _cell(scores["tokens_per_s"], 1),
                         _cell(scores.get("accuracy"), 0, percent=True), _cell(scores.get("correct_per_s"), 3),
                         f"{nll:+.4f}" if nll is not None else "0 (ref)" if part == "mixed" and variant == "limit"
                         else "-"))
    return rows
