"""``gpctl bench vllm --part mixed``: retrieval questions and long step-by-step generations at once,
under one KV space.

The retrieval part measures prompt-heavy work (long notes, short answers) and the pressure and
headline parts decode-heavy work (short prompts, long generations), each alone. Here they compete:
the retrieval part's questions interleaved with ``mixed_reasoning`` reasoning prompts of the
pressure trace (``max_tokens`` new tokens each, seed ``seeds[0]``), all sent at once. Replies end
at their end of sequence, as a user's would.

Variants, KV space and rounds as the retrieval part (:func:`~growpage.bench.goodput.retrieval_configs`:
vLLM alone untuned and with each ``tuned_max_num_seqs``, GrowPage at the shipped defaults and with
growth-aware admission, each fixed cap at GrowPage's floor, the limit; a space for about
``retrieval_kv_share`` of what every request needs at full length; ``retrieval_skip`` leaves
variants out). Reported per variant: accuracy against ground truth (the questions; each reasoning
prompt's true result where it has one, which the packaged model seldom reaches, so per family
too), correct answers per second, tokens/s, preemptions, and, for every compressed variant, the
NLL increase over full KV (forced once through the limit's continuation): a compressed long
generation shows there, not in answers. GrowPage is judged against tuned vLLM alone as in the
retrieval part.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from growpage.bench import goodput
from growpage.bench.tasks import RETRIEVAL_MAX_TOKENS, Task, with_truth
from growpage.bench.workloads import reasoning_tasks

if TYPE_CHECKING:
    from growpage.bench.vllm_settings import VllmBenchSettings

Log = Callable[[str], None] | None


def mixed_trace(settings: VllmBenchSettings) -> tuple[list[str], list[Task | None], list[int]]:
    """The prompts in send order, each one's task (None: no true answer) and its ``max_tokens``: a
    question, then a reasoning prompt, alternating while both last, then the rest."""
    questions = [(task.prompt, task, RETRIEVAL_MAX_TOKENS) for task in goodput.retrieval_tasks(settings)]
    reasoning = [(task.prompt, with_truth(task), settings.max_tokens)
                 for task in reasoning_tasks(settings.mixed_reasoning, settings.max_tokens, seed=settings.seeds[0])]
    order = [item for pair in zip(questions, reasoning, strict=False) for item in pair]
    shorter = min(len(questions), len(reasoning))
    order += questions[shorter:] + reasoning[shorter:]
    return [prompt for prompt, _, _ in order], [task for _, task, _ in order], [limit for _, _, limit in order]


def mixed_under_pressure(model_dir: str, settings: VllmBenchSettings, log: Log, timeout_s: float) -> dict:
    """The mixed trace under every variant (interleaved repeats), scored, with each compressed
    variant's NLL increase over full KV and the comparison against tuned vLLM alone."""
    # deferred: transformers takes seconds to import; only a run that tokenizes loads it
    from transformers import AutoTokenizer

    prompts, tasks, max_tokens = mixed_trace(settings)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pressure = goodput.answers_under_pressure(model_dir, settings, tokenizer, tasks, prompts, max_tokens,
                                              "mixed under KV pressure", log, timeout_s, fidelity=True)
    variants = pressure["variants"]
    return {"requests": [{"task": task.task_id if task else None, "family": task.family if task else "reasoning",
                          "max_tokens": limit, "prompt_tokens": length}
                         for task, limit, length in zip(tasks, max_tokens, pressure["prompt_tokens"], strict=True)],
            "variants": variants,
            "comparison": goodput.answers_comparison(variants)
            | {"nll_increase": {name: scores["nll_increase"] for name, scores in variants.items()
                                if "nll_increase" in scores}}}
