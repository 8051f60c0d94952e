"""Deterministic benchmark workloads: generated from a seed, nothing downloaded.

* reasoning: step-by-step arithmetic and multi-step word problems (long generations); the final
  answer is the last number of the output;
* retrieval: a 5-digit pass key hidden at a given depth in 512-2k tokens of filler; the answer is the
  first 5-digit number of the output (kept only when full KV finds the key, see ``quality``);
* summary: one-sentence summaries (short generations); no final answer, token agreement only;
* a mixed serving trace: the tasks above with Poisson arrival times.
"""

from __future__ import annotations

import dataclasses
import random
import re

from growpage.bench.prompts import SUMMARY_PROMPTS

FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
          "There and back again. ")
FILLER_TOKENS = 25  # SmolLM2's tokenizer: one FILLER sentence group is ~25 tokens
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
PASS_KEY = re.compile(r"\b\d{5}\b")


@dataclasses.dataclass(frozen=True)
class Task:
    """One prompt of a workload.

    Attributes:
        task_id: stable id, e.g. ``reasoning-3`` or ``retrieval-1024-50``.
        kind: reasoning | retrieval | summary.
        prompt: the user message (chat-templated by the harness).
        max_tokens: new tokens at most.
        expected: the ground truth where one exists (retrieval; reasoning prompts with a single
            numeric result), else None.
    """

    task_id: str
    kind: str
    prompt: str
    max_tokens: int
    expected: str | None = None


def final_answer(kind: str, text: str) -> str | None:
    """The answer a user would read off ``text``: None for kinds without one (summaries) or when
    the text holds none."""
    if kind == "reasoning":
        numbers = NUMBER.findall(text)
        return numbers[-1].replace(",", "").rstrip(".") if numbers else None
    if kind == "retrieval":
        match = PASS_KEY.search(text)
        return match.group(0) if match else None
    return None


def has_final_answer(kind: str) -> bool:
    return kind in ("reasoning", "retrieval")


_ARITHMETIC = (
    "Compute {a} * {b} + {c} - {d}. Think step by step, show every intermediate result, then give "
    "the final answer on the last line.",
    "Add these numbers one at a time, writing each partial sum: {a}, {b}, {c}, {d}, {e}. Then "
    "state the total.",
)
_WORD_PROBLEMS = (
    "A bakery makes {a} loaves each morning and {b} each afternoon. It sells {c} loaves a day and "
    "gives the rest to a shelter. How many loaves does the shelter get in {d} days? Solve it step "
    "by step.",
    "A tank holds {a} litres. A pump adds {b} litres per minute while a leak loses {c} litres per "
    "minute. Starting empty, how many minutes until the tank is full? Explain each step.",
    "Sara reads {b} pages on weekdays and {c} pages on each weekend day. Her book has {a} pages. "
    "How many full weeks and extra days does she need? Work through it step by step.",
    "A store sells notebooks at ${b} each and pens at ${c} each. Mia buys {d} notebooks and twice as "
    "many pens, and pays with ${a}. How much change does she get? Show every step.",
)


def reasoning_tasks(count: int, max_tokens: int, seed: int = 0) -> list[Task]:
    """``count`` reasoning prompts, alternating arithmetic and word problems, numbers from ``seed``."""
    rng = random.Random(seed)
    templates = [t for pair in zip(_ARITHMETIC * 2, _WORD_PROBLEMS, strict=False) for t in pair]
    tasks = []
    for index in range(count):
        template = templates[index % len(templates)]
        numbers = dict(a=rng.randint(120, 480), b=rng.randint(12, 48), c=rng.randint(3, 11),
                       d=rng.randint(2, 9), e=rng.randint(20, 99))
        tasks.append(Task(f"reasoning-{index}", "reasoning", template.format(**numbers), max_tokens,
                          expected=true_result(template, numbers)))
    return tasks


def true_result(template: str, numbers: dict[str, int]) -> str | None:
    """The true final answer of a reasoning prompt, or None where the question has no single number
    (weeks and days; change a buyer cannot get; minutes that do not divide evenly)."""
    a, b, c, d, e = (numbers[key] for key in "abcde")
    results: dict[str, int | None] = {
        _ARITHMETIC[0]: a * b + c - d,
        _ARITHMETIC[1]: a + b + c + d + e,
        _WORD_PROBLEMS[0]: (a + b - c) * d,
        _WORD_PROBLEMS[1]: a // (b - c) if a % (b - c) == 0 else None,
        _WORD_PROBLEMS[2]: None,
        _WORD_PROBLEMS[3]: a - d * b - 2 * d * c if a >= d * b + 2 * d * c else None,
    }
    result = results[template]
    return None if result is None else str(result)


def passkey_prompt(context_tokens: int, depth: float, key: str) -> str:
    """A pass key at ``depth`` (0 = start, 1 = end) of about ``context_tokens`` tokens of filler."""
    groups = max(context_tokens // FILLER_TOKENS, 2)
    parts = [FILLER] * groups
    parts.insert(round(depth * groups), f"The pass key is {key}. Remember it. {key} is the pass key. ")
    return ("There is an important pass key hidden inside a lot of irrelevant text. Find it and "
            "memorize it.\n" + "".join(parts) + "\nWhat is the pass key?")


def retrieval_tasks(context_tokens: tuple[int, ...], depths: tuple[float, ...], max_tokens: int,
                    seed: int = 0) -> list[Task]:
    """One pass-key task per (context length, depth)."""
    rng = random.Random(seed + 1)
    tasks = []
    for length in context_tokens:
        for depth in depths:
            key = str(rng.randint(10000, 99999))
            tasks.append(Task(f"retrieval-{length}-{round(depth * 100)}", "retrieval",
                              passkey_prompt(length, depth, key), max_tokens, expected=key))
    return tasks


def summary_tasks(count: int, max_tokens: int) -> list[Task]:
    return [Task(f"summary-{i}", "summary", SUMMARY_PROMPTS[i % len(SUMMARY_PROMPTS)], max_tokens)
            for i in range(count)]


@dataclasses.dataclass(frozen=True)
class Arrival:
    """A task entering the serving benchmark ``offset_s`` after the trace starts."""

    offset_s: float
    task: Task


def poisson_trace(tasks: list[Task], rate_per_s: float, seed: int = 0) -> list[Arrival]:
    """Tasks in a seeded shuffled order with exponential inter-arrival times (a Poisson process)."""
    if rate_per_s <= 0:
        raise ValueError(f"arrival rate must be > 0 requests/s, got {rate_per_s}")
    rng = random.Random(seed + 2)
    order = list(tasks)
    rng.shuffle(order)
    arrivals, clock = [], 0.0
    for task in order:
        arrivals.append(Arrival(round(clock, 6), task))
        clock += rng.expovariate(rate_per_s)
    return arrivals
