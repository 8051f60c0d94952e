"""A golden trace of the reference engine's greedy answers on the packaged model under every scored
KV method, that a restructuring must leave unchanged: the tokens a user reads, after each method's
compactions chose what to keep.

Three prompts decode together on a tight pool (so every method compresses, and GrowPage's pressure
relief runs), with the deterministic clock the benchmarks use. The golden file
(``golden/method_outputs.json``) holds one trace per CPU kind (``growpage.provenance.cpu_kind``):
torch's CPU kernels round differently with AVX2 and with AVX-512, and a greedy decode follows the
rounding at a near-tie (seen: one of 21 answers differed from its 16th token). Running this file
with ``UPDATE_GOLDEN_TRACE=1`` rewrites this host's kind; a change to it is a change of behaviour,
to be explained in its commit. A host whose kind has no trace skips, saying how to record one.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from growpage.config import GrowPageConfig
from growpage.core.methods import build_method
from growpage.engine.engine import EngineConfig, LLMEngine
from growpage.engine.sampling import SamplingParams
from growpage.provenance import host_facts

GOLDEN = Path(__file__).with_name("golden") / "method_outputs.json"
METHODS = ("growpage", "h2o", "snapkv", "streaming_llm", "tova", "zipage", "uniform_int8")
PROMPTS = ("Count from one to twenty in words, separated by commas.",
           "Name the planets of the solar system in order from the sun.",
           "Spell the word 'elephant' backwards, one letter per line.")
PARAMS = SamplingParams(max_tokens=96, temperature=0.0, ignore_eos=True)


def _ticks():
    """A clock that advances one second per call, fresh per engine: the growth throttle never
    depends on how fast this machine runs."""
    counter = itertools.count()
    return lambda: float(next(counter))


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    def ids(text: str) -> list[int]:
        encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True)
        return list(encoded["input_ids"] if hasattr(encoded, "input_ids") else encoded)

    return [ids(text) for text in PROMPTS]


def _outputs(method: str, llama_model, tokenizer, model_dir, prompt_ids) -> dict:
    growpage = GrowPageConfig(mode="enforce", base_pages=3, block_size=16, recent_window_tokens=16, sink_tokens=4,
                              kv_dtype="float16")
    engine = LLMEngine(EngineConfig(model_dir=str(model_dir), num_pages=20, max_num_seqs=4), growpage,
                       model=llama_model, tokenizer=tokenizer, method=build_method(method),
                       clock=_ticks())
    requests = engine.generate(prompt_ids, PARAMS)
    decisions = engine.manager.make_stats().decisions_total
    return {"tokens": [request.output_token_ids for request in requests],
            "compressions": decisions["evict"] + decisions["quantize"]}


def test_every_methods_greedy_answers_are_unchanged(llama_model, tokenizer, prepared_model_dir, prompt_ids):
    kind = host_facts()["cpu"] or "unknown"
    recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if kind not in recorded and not os.environ.get("UPDATE_GOLDEN_TRACE"):
        pytest.skip(f"no golden answers recorded on a {kind} host (recorded: {', '.join(sorted(recorded))}); "
                    "record them with UPDATE_GOLDEN_TRACE=1 on the code they must match")
    trace = {method: _outputs(method, llama_model, tokenizer, prepared_model_dir, prompt_ids) for method in METHODS}
    if os.environ.get("UPDATE_GOLDEN_TRACE"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({**recorded, kind: trace}, indent=1, sort_keys=True) + "\n")
        recorded = json.loads(GOLDEN.read_text())
    golden = recorded[kind]
    for method in METHODS:
        assert method in golden, f"no golden answers for {method}: rerun with UPDATE_GOLDEN_TRACE=1"
        assert trace[method]["compressions"] > 0, f"{method} never compressed: the trace would test nothing"
        for index, (expected, actual) in enumerate(zip(golden[method]["tokens"], trace[method]["tokens"],
                                                       strict=True)):
            first = next((i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b), None)
            assert expected == actual, f"{method}, prompt {index}: answers differ from token {first} on"
        assert trace[method] == golden[method], method
    # the methods keep different tokens, so a wrong method object would show
    assert len({json.dumps(golden[method]["tokens"]) for method in METHODS}) >= 4
