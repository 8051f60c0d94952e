"""Tasks with true answers: deterministic, answerable from the prompt alone, scored as a reader would."""

from __future__ import annotations

import pytest

from growpage.bench.tasks import (
    FAMILIES,
    Task,
    accuracy_by_family,
    headline_families,
    is_correct,
    predicted_answer,
    reasoning_tasks,
    retrieval_tasks,
)


def test_every_family_length_and_depth_once_at_least_48_tasks():
    tasks = retrieval_tasks(seed=0)
    assert len(tasks) >= 48 and {t.family for t in tasks} == set(FAMILIES)
    assert len({t.task_id for t in tasks}) == len(tasks)
    assert {t.context_tokens for t in tasks} == {512, 1024, 2048}
    assert all(t.kind == "retrieval" and t.expected == t.answer for t in tasks)


def test_a_seed_gives_the_same_tasks_and_another_seed_other_answers():
    assert retrieval_tasks(seed=3) == retrieval_tasks(seed=3)
    assert [t.answer for t in retrieval_tasks(seed=3)] != [t.answer for t in retrieval_tasks(seed=4)]
    # a task does not depend on which others are asked for
    only_room = retrieval_tasks(seed=3, families=("room",), context_tokens=(1024,), depths=(0.35,))
    assert only_room == [t for t in retrieval_tasks(seed=3) if t.task_id == "room-1024-35"]


def test_the_answer_is_in_the_notes_once_at_its_depth_and_distractors_differ():
    for task in retrieval_tasks(seed=1):
        notes = task.prompt[:task.prompt.rindex("\n")]
        position = notes.find(task.answer)
        assert position > 0, task.task_id
        assert abs(position / len(notes) - task.depth) < 0.12, task.task_id
        if task.family in ("room", "multikey"):
            shaped = [n for n in predicted_numbers(notes) if len(n) == len(task.answer)]
            assert len(set(shaped)) >= 3 and shaped.count(task.answer) == 1, task.task_id


def predicted_numbers(text: str) -> list[str]:
    from growpage.bench.tasks import numbers_in

    return numbers_in(text)


def test_prompt_lengths_land_near_their_targets(tokenizer):
    for task in retrieval_tasks(seed=0, depths=(0.5,)):
        tokens = len(tokenizer(task.prompt)["input_ids"])
        assert 0.85 * task.context_tokens <= tokens <= 1.2 * task.context_tokens, (task.task_id, tokens)


def test_bad_families_and_depths_are_refused():
    with pytest.raises(ValueError, match="unknown task families"):
        retrieval_tasks(families=("colour",))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        retrieval_tasks(depths=(1.5,))


def test_is_correct_reads_the_first_number_of_the_answers_shape():
    task = Task("multikey", "prompt", "48213", "multikey-512-10", 512, 0.1)
    assert is_correct(task, "48213")
    assert is_correct(task, "The code of the red box is 48,213.")
    assert is_correct(task, "Sure! 48213 is the code (box 3 of 12).")
    assert not is_correct(task, "The codes are 11111, 48213 and 22222.")  # listing every candidate
    assert not is_correct(task, "482135")
    assert not is_correct(task, "I don't know.")
    assert predicted_answer(task, "room 12, code 99999") == "99999"


def test_reasoning_is_scored_against_its_true_result():
    tasks = reasoning_tasks(12, 192, seed=0)
    assert tasks and all(t.family == "reasoning" and t.kind == "reasoning" for t in tasks)
    first = next(t for t in tasks if t.task_id == "reasoning-0")
    assert "317 * 38 + 3 - 6" in first.prompt and first.answer == "12043"
    assert is_correct(first, "317 * 38 = 12046, then + 3 - 6 gives 12,043.")
    assert not is_correct(first, "The answer is 210.")
    assert is_correct(first, "so 12043.0")


def test_accuracy_by_family_and_what_is_headlined():
    tasks = retrieval_tasks(seed=0, families=("code", "room"), context_tokens=(512,))
    correct = [t.family == "code" or t.depth < 0.5 for t in tasks]
    accuracy = accuracy_by_family(tasks, correct)
    assert accuracy["code"] == {"correct": 4, "total": 4, "accuracy": 1.0}
    assert accuracy["room"]["accuracy"] == 0.5
    assert headline_families(accuracy) == ["code"]
    assert headline_families({"reasoning": {"correct": 1, "total": 1, "accuracy": 1.0}}) == []


def test_workload_tasks_are_scored_where_they_have_a_true_answer():
    from growpage.bench.tasks import with_truth
    from growpage.bench.workloads import reasoning_tasks as workload_reasoning
    from growpage.bench.workloads import retrieval_tasks as workload_retrieval
    from growpage.bench.workloads import summary_tasks

    passkey = workload_retrieval((512,), (0.5,), 16)[0]
    scored = with_truth(passkey)
    assert scored is not None and scored.family == "passkey" and is_correct(scored, f"It is {passkey.expected}.")
    assert with_truth(summary_tasks(1, 8)[0]) is None
    assert [with_truth(t) is None for t in workload_reasoning(4, 8)] == [False, False, False, True]
