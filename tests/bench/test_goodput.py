"""Goodput inside vLLM, without running engines: interleaving, scoring and the table rows."""

from __future__ import annotations

from growpage.bench.goodput import goodput_rows, repeated, round_order, scored
from growpage.bench.tasks import Task


class DigitTokenizer:
    """Token ``i`` decodes to the digit ``i - 1``; 0 ends the sequence."""

    eos_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return "".join(str(i - 1) for i in ids if i)


def digits(text: str) -> list[int]:
    return [int(c) + 1 for c in text]


def test_rounds_alternate_their_order_and_every_variant_runs_every_round():
    calls: list[str] = []
    results = repeated(lambda v: calls.append(v) or {"variant": v}, ("a", "b", "c"), 3, None, "x")
    assert calls == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert {v: len(r) for v, r in results.items()} == {"a": 3, "b": 3, "c": 3}
    assert round_order(("a", "b"), 1) == ("b", "a")


def test_scored_counts_correct_replies_up_to_the_end_of_sequence_per_second():
    tasks = [Task("code", "p", "12345", "code-1"), None, Task("code", "p", "55555", "code-2")]
    runs = [{"elapsed_s": 2.0, "outputs": {"0": digits("12345") + [0] + digits("9"), "1": digits("1"),
                                           "2": digits("55556")}},
            {"elapsed_s": 4.0, "outputs": {"0": digits("12345"), "1": [], "2": digits("55555")}}]
    result = scored(DigitTokenizer(), tasks, runs)
    assert result["answerable"] == 2
    assert result["accuracy"]["values"] == [0.5, 1.0]
    assert result["correct_per_s"]["values"] == [0.5, 0.5]
    assert result["accuracy_by_family"]["code"] == {"correct": 1, "total": 2, "accuracy": 0.5}
    assert scored(DigitTokenizer(), [None], runs[:1]) == {"answerable": 0}


def test_goodput_rows_put_accuracy_and_nll_next_to_tokens_per_second():
    measure = {"median": 2.0, "range": [1.0, 3.0], "values": [1.0, 2.0, 3.0]}
    trace = {"seed": 0, "tokens_per_s": {"vllm": measure, "growpage": measure, "limit": measure},
             "goodput": {"vllm": {"accuracy": {"median": 0.25, "range": [0.25, 0.25]}}, "growpage": {}, "limit": {}},
             "nll_increase": {"growpage": {"mean": 0.1234}}}
    rows = goodput_rows({"traces": [trace]})
    assert rows[0] == ("reasoning seed 0 (apart)", "vllm", "2.0 [1.0-3.0]", "25%", "-", "-")
    assert rows[1][-1] == "+0.1234" and rows[2][-1] == "0 (ref)"
