"""Tasks with true answers: what "correct" means for the benchmarks, deterministic per seed.

A KV method is judged by the answers it keeps. The packaged 135M model answers retrieval questions
over long notes reliably with full KV and step-by-step arithmetic almost never, so accuracy against
ground truth is measured on retrieval families, and arithmetic is scored against its true result
but reported apart (its quality under compression is measured as fidelity, see ``fidelity``).

Retrieval families (every one: a needle at a chosen depth of ``context_tokens`` of notes, the
question at the end, and an answer that is a number of a fixed number of digits):

* ``passkey``: a 5-digit pass key in repetitive filler (the classic pass-key test);
* ``code``: a 5-digit door code in varied office notes that also mention other, shorter numbers;
* ``room``: one person's 3-digit room number among several people's (the other rooms are
  distractors spread through the notes);
* ``multikey``: one of three labelled 5-digit codes (the other two are distractors).

``retrieval_tasks(seed)`` gives every (family, length, depth) once: 4 x 3 x 4 = 48 tasks.
:func:`is_correct` reads the first number of the answer's shape off a reply: a reply that lists
every candidate is wrong unless the true one comes first.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Iterable, Sequence
from typing import Any

from growpage.bench.workloads import reasoning_tasks as workload_reasoning

FAMILIES = ("passkey", "code", "room", "multikey")
CONTEXT_TOKENS = (512, 1024, 2048)
DEPTHS = (0.1, 0.35, 0.65, 0.9)
CHARS_PER_TOKEN = 4.6  # SmolLM2's tokenizer on the notes below (measured: 4.5-4.8)
FILLER_TOKENS = 25  # SmolLM2's tokenizer: one group of the pass-key filler
RETRIEVAL_MAX_TOKENS = 16

_NUMBER = re.compile(r"(?<![\d.])\d+(?:\.\d+)?(?![\d.]*\d)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3})")

_FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
           "There and back again. ")
_NOTES = (
    "Lunch was served at noon in the kitchen on the second floor.",
    "The printer near the stairs ran out of paper twice this week.",
    "Ana moved the plants by the window so they get more light.",
    "The weekly report was sent to the managers on Friday afternoon.",
    "Someone left a blue umbrella in the meeting room.",
    "The coffee machine was cleaned and works again.",
    "Twelve new chairs arrived and were placed in the hall.",
    "The team agreed to start the planning meeting at 9:30 from now on.",
    "A delivery of 40 boxes of paper is expected next Tuesday.",
    "The heating in the east wing was checked by a technician.",
    "Tom asked everyone to label their food in the fridge.",
    "The fire drill took place in the morning and lasted 15 minutes.",
    "Two laptops were sent for repair because their screens flickered.",
    "The garden outside the entrance was watered in the evening.",
    "The library corner now has 25 more books about travel.",
    "Visitors must sign the guest book at the front desk.",
    "The parking lot will be painted over the weekend.",
    "A new whiteboard was mounted on the wall of the small office.",
    "The quarterly budget review was moved to the end of the month.",
    "Please close the windows before leaving in the evening.",
    "The cleaning staff will come on Wednesdays instead of Thursdays.",
    "Marta brought a cake to celebrate the end of the project.",
    "The internet was slow for an hour but was fixed by noon.",
    "Three new people joined the support team this month.",
    "The old filing cabinets were moved to the basement.",
    "The lights in the corridor are now switched off at 8 pm.",
    "A lost key ring was handed in at reception.",
    "The kitchen sink was repaired after it leaked on Monday.",
    "The team photo will be taken next week in the garden.",
    "Recycling bins for glass were added next to the kitchen.",
    "The training session on the new software lasted 2 hours.",
    "Several people asked for a second coffee machine.",
)
_PEOPLE = ("Maria", "James", "Aisha", "Lukas", "Sofia", "Daniel", "Priya", "Oliver", "Elena", "Hugo",
           "Nadia", "Victor")
_LABELS = ("red", "blue", "green", "yellow", "white", "black")


@dataclasses.dataclass(frozen=True)
class Task:
    """One prompt with its true answer.

    Attributes:
        family: the task family (``passkey``, ``code``, ``room``, ``multikey``, ``reasoning``).
        prompt: the user message (chat-templated by whoever runs it).
        answer: the true answer, as the digits a correct reply contains.
        task_id: stable id, e.g. ``code-1024-35``.
        context_tokens: the notes' target length in tokens (0 for reasoning).
        depth: where the needle sits in the notes, 0 = start, 1 = end.
        max_tokens: new tokens at most.
    """

    family: str
    prompt: str
    answer: str
    task_id: str
    context_tokens: int = 0
    depth: float = 0.0
    max_tokens: int = RETRIEVAL_MAX_TOKENS

    @property
    def kind(self) -> str:
        """``retrieval`` or ``reasoning``: the kinds the benchmark workloads use."""
        return "reasoning" if self.family == "reasoning" else "retrieval"

    @property
    def expected(self) -> str:
        """The workloads' name for the true answer."""
        return self.answer


def _notes(rng: random.Random, context_tokens: int, plain: bool) -> list[str]:
    """Sentences adding up to about ``context_tokens`` tokens, in a seeded order (``plain``: the
    repetitive filler, ~25 tokens a group)."""
    if plain:
        return [_FILLER] * max(2, round(context_tokens / FILLER_TOKENS))
    chars = context_tokens * CHARS_PER_TOKEN
    notes: list[str] = []
    total = 0
    while total < chars:
        batch = list(_NOTES)
        rng.shuffle(batch)
        for note in batch:
            notes.append(note + " ")
            total += len(note) + 1
            if total >= chars:
                break
    return notes


def _insert(notes: list[str], depth: float, sentence: str) -> None:
    notes.insert(round(depth * len(notes)), sentence + " ")


def _code(rng: random.Random) -> str:
    return str(rng.randint(10000, 99999))


def _distinct(rng: random.Random, count: int, make: object) -> list[str]:
    values: list[str] = []
    while len(values) < count:
        value = make(rng)  # type: ignore[operator]
        if value not in values:
            values.append(value)
    return values


def _passkey(rng: random.Random, context_tokens: int, depth: float) -> tuple[str, str]:
    key = _code(rng)
    notes = _notes(rng, context_tokens, plain=True)
    _insert(notes, depth, f"The pass key is {key}. Remember it. {key} is the pass key.")
    return ("There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize "
            "it.\n" + "".join(notes) + "\nWhat is the pass key?"), key


def _door_code(rng: random.Random, context_tokens: int, depth: float) -> tuple[str, str]:
    code = _code(rng)
    notes = _notes(rng, context_tokens, plain=False)
    _insert(notes, depth, f"The door code for the storage room is {code}.")
    return ("Below are notes from an office log. One note gives the door code for the storage room.\n\n"
            + "".join(notes) + "\n\nWhat is the door code for the storage room? Answer with the code only."), code


def _room(rng: random.Random, context_tokens: int, depth: float) -> tuple[str, str]:
    people = rng.sample(_PEOPLE, 4)
    rooms = _distinct(rng, len(people), lambda r: str(r.randint(100, 999)))
    notes = _notes(rng, context_tokens, plain=False)
    for person, room in list(zip(people, rooms, strict=True))[1:]:  # distractors, anywhere
        _insert(notes, rng.random(), f"The room number of {person} is {room}.")
    _insert(notes, depth, f"The room number of {people[0]} is {rooms[0]}.")
    return ("Below are notes from an office log. Some notes give the room number of a person.\n\n"
            + "".join(notes) + f"\n\nWhat is the room number of {people[0]}? Answer with the number only."), rooms[0]


def _multikey(rng: random.Random, context_tokens: int, depth: float) -> tuple[str, str]:
    labels = rng.sample(_LABELS, 3)
    codes = _distinct(rng, len(labels), _code)
    notes = _notes(rng, context_tokens, plain=False)
    for label, code in list(zip(labels, codes, strict=True))[1:]:
        _insert(notes, rng.random(), f"The code of the {label} box is {code}.")
    _insert(notes, depth, f"The code of the {labels[0]} box is {codes[0]}.")
    return ("Below are notes from an office log. Some notes give the codes of coloured boxes.\n\n"
            + "".join(notes) + f"\n\nWhat is the code of the {labels[0]} box? Answer with the code only."), codes[0]


_BUILDERS = {"passkey": _passkey, "code": _door_code, "room": _room, "multikey": _multikey}


def retrieval_tasks(seed: int = 0, families: Sequence[str] = FAMILIES,
                    context_tokens: Sequence[int] = CONTEXT_TOKENS, depths: Sequence[float] = DEPTHS,
                    max_tokens: int = RETRIEVAL_MAX_TOKENS) -> list[Task]:
    """One task per (family, context length, depth), needles and distractors drawn from ``seed``.

    Raises:
        ValueError: an unknown family, or a depth outside [0, 1].
    """
    unknown = sorted(set(families) - set(_BUILDERS))
    if unknown:
        raise ValueError(f"unknown task families {unknown}; choose from {', '.join(FAMILIES)}")
    if any(not 0.0 <= depth <= 1.0 for depth in depths):
        raise ValueError(f"depths must lie in [0, 1] (0 = start of the notes), got {list(depths)}")
    tasks = []
    for family in families:
        for length in context_tokens:
            for depth in depths:
                # one generator per task: a task's text does not depend on which others are asked for
                rng = random.Random(f"{seed}/{family}/{length}/{depth}")
                prompt, answer = _BUILDERS[family](rng, length, depth)
                tasks.append(Task(family, prompt, answer, f"{family}-{length}-{round(depth * 100)}",
                                  length, depth, max_tokens))
    return tasks


def reasoning_tasks(count: int, max_tokens: int, seed: int = 0) -> list[Task]:
    """The benchmark workloads' step-by-step prompts (``workloads.reasoning_tasks``, same seed, same
    text) that have a single true result, with it as the answer: scored against it, reported apart."""
    return [Task("reasoning", task.prompt, task.expected, task.task_id, max_tokens=task.max_tokens)
            for task in workload_reasoning(count, max_tokens, seed) if task.expected is not None]


def with_truth(task: Any) -> Task | None:
    """A benchmark workload's task (``workloads.Task``: ``kind``, ``expected``) as a task to score,
    or None where it has no true answer (summaries, reasoning without a single result)."""
    if isinstance(task, Task):
        return task
    if task.expected is None:
        return None
    family = "reasoning" if task.kind == "reasoning" else "passkey"
    return Task(family, task.prompt, task.expected, task.task_id, max_tokens=task.max_tokens)


def numbers_in(text: str) -> list[str]:
    """The numbers a reader sees in ``text``, thousands separators removed, in order."""
    return _NUMBER.findall(_THOUSANDS.sub("", text))


def predicted_answer(task: Task, text: str) -> str | None:
    """What ``text`` answers to ``task``: the final number for reasoning, else the first number with
    as many digits as the true answer (None when there is none)."""
    numbers = numbers_in(text)
    if task.family == "reasoning":
        return numbers[-1] if numbers else None
    shaped = [n for n in numbers if len(n) == len(task.answer)]
    return shaped[0] if shaped else None


def is_correct(task: Task, text: str) -> bool:
    """Whether ``text`` (a reply, up to its end of sequence) gives ``task``'s true answer: the reply
    normalized (trimmed, lower case, no trailing full stop) equals it, or its predicted answer
    equals it (numerically for reasoning, so 12043.0 counts as 12043)."""
    normalized = _THOUSANDS.sub("", text).strip().lower().rstrip(".").strip()
    if normalized == task.answer.lower():
        return True
    predicted = predicted_answer(task, text)
    if predicted is None:
        return False
    if task.family == "reasoning":
        return abs(float(predicted) - float(task.answer)) < 1e-6
    return predicted == task.answer


def accuracy_by_family(tasks: Iterable[Task], correct: Iterable[bool]) -> dict[str, dict[str, float | int]]:
    """Per family: ``correct``, ``total`` and ``accuracy`` (share correct)."""
    counts: dict[str, list[int]] = {}
    for task, ok in zip(tasks, correct, strict=True):
        tally = counts.setdefault(task.family, [0, 0])
        tally[0] += int(ok)
        tally[1] += 1
    return {family: {"correct": ok, "total": total, "accuracy": round(ok / total, 4)}
            for family, (ok, total) in counts.items()}


HEADLINE_ACCURACY = 0.8  # a family is headlined only where full KV answers at least this share


def headline_families(full_kv_accuracy: dict[str, dict[str, float | int]],
                      threshold: float = HEADLINE_ACCURACY) -> list[str]:
    """The retrieval families full KV answers well enough for a method's accuracy on them to mean
    something (reasoning is never headlined: it is reported apart)."""
    return [family for family, tally in full_kv_accuracy.items()
            if family != "reasoning" and float(tally["accuracy"]) >= threshold]
