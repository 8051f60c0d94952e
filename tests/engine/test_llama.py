"""Our Llama forward pass against transformers' ``LlamaForCausalLM`` on the same float32 weights.

Greedy decoding must agree token for token: that is what a user of the reference engine would see
change if a norm, a RoPE angle or a fused projection were subtly off.
"""

from __future__ import annotations

import json

import pytest
import torch

from growpage.engine.llama import LlamaModel
from growpage.engine.llama_config import LlamaConfig, RopeScaling, rope_inverse_frequencies
from growpage.engine.reference_attention import DenseKVCache, attend_per_request, generate_greedy
from growpage.errors import GrowPageError

transformers = pytest.importorskip("transformers")

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a KV cache is in one sentence.",
    "List three prime numbers.",
]
MAX_NEW_TOKENS = 24


@pytest.fixture(scope="module", autouse=True)
def one_intra_op_thread():
    # The suite shares 2 cores with other processes; OpenMP's spinning barriers then collapse (a
    # 37-token prefill measured 4-6 s with 2 threads vs 0.8 s with 1). Batch-1 decode of a 135M
    # model is memory-bound, so one thread costs little even on an idle machine.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def hf_model(prepared_model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(
        prepared_model_dir, dtype=torch.float32, local_files_only=True).eval()


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> list[list[int]]:
    def chat(prompt: str) -> list[int]:
        encoded = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                tokenize=True, return_dict=True)
        return list(encoded["input_ids"])

    return [chat(prompt) for prompt in PROMPTS]


def _divergence(tokenizer, hf_model, prompt: list[int], expected: list[int], actual: list[int]) -> str:
    # Where the two greedy paths split, and how close transformers' top two logits were there: a
    # margin near float32 round-off means summation order, a large one means a real bug.
    step = next(i for i, (a, b) in enumerate(zip(expected + [-1], actual + [-2], strict=False)) if a != b)
    with torch.inference_mode():
        logits = hf_model(torch.tensor([prompt + expected[:step]])).logits[0, -1]
    top2 = logits.topk(2)
    return (f"diverged at new token {step}: transformers {expected[step:step + 1]} vs ours "
            f"{actual[step:step + 1]} after {tokenizer.decode(expected[:step])!r}; transformers' top-2 "
            f"margin there {float(top2.values[0] - top2.values[1]):.2e}")


def test_config_is_read_from_the_folder(llama_model):
    config = llama_model.config
    assert (config.num_layers, config.num_q_heads, config.num_kv_heads, config.head_dim) == (30, 9, 3, 64)
    assert (config.hidden_size, config.vocab_size, config.rope_theta) == (576, 49152, 100000.0)
    assert config.tie_word_embeddings and config.eos_token_ids == (2,) and config.bos_token_id == 1
    assert llama_model.lm_head.weight is llama_model.embed_tokens.weight


def test_prefill_logits_match_transformers(llama_model, hf_model, prompt_ids):
    prompt = prompt_ids[0]
    with torch.inference_mode():
        expected = hf_model(torch.tensor([prompt])).logits[0]
    actual = llama_model(torch.tensor(prompt), torch.arange(len(prompt)), DenseKVCache(30).attend)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-4)


def test_greedy_generation_matches_transformers_token_for_token(llama_model, hf_model, tokenizer, prompt_ids):
    # Ours decodes the four requests together, flattened into one forward per step (as the engine
    # will); transformers decodes each alone with its own KV cache.
    actual = generate_greedy(llama_model, prompt_ids, MAX_NEW_TOKENS)
    for prompt, ours in zip(prompt_ids, actual, strict=False):
        with torch.inference_mode():
            output = hf_model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                       pad_token_id=tokenizer.pad_token_id)
        expected = output[0, len(prompt):].tolist()
        assert ours == expected, _divergence(tokenizer, hf_model, prompt, expected, ours)
    assert sum(map(len, actual)) > 3 * MAX_NEW_TOKENS, "most prompts should run to the token limit"


def test_rows_of_several_requests_are_independent(llama_model, prompt_ids):
    # Flattened rows must give every request exactly the logits it gets alone (norms, projections
    # and RoPE are per row; only the callback mixes rows, and it keeps requests apart).
    prompts = [prompt_ids[1], prompt_ids[2]]
    alone_prefill, alone_decode = [], []
    for prompt in prompts:
        cache = DenseKVCache(30)
        alone_prefill.append(llama_model(torch.tensor(prompt), torch.arange(len(prompt)), cache.attend)[-1])
        alone_decode.append(llama_model(alone_prefill[-1].argmax()[None], torch.tensor([len(prompt)]),
                                        cache.attend)[0])
    caches, lengths = [DenseKVCache(30), DenseKVCache(30)], [len(prompt) for prompt in prompts]
    last_rows = torch.tensor([lengths[0] - 1, sum(lengths) - 1])
    prefill = llama_model(torch.tensor(prompts[0] + prompts[1]), torch.cat([torch.arange(n) for n in lengths]),
                          attend_per_request(caches, lengths), logits_rows=last_rows)
    torch.testing.assert_close(prefill, torch.stack(alone_prefill), rtol=1e-5, atol=1e-4)
    decode = llama_model(prefill.argmax(-1), torch.tensor(lengths), attend_per_request(caches, [1, 1]))
    torch.testing.assert_close(decode, torch.stack(alone_decode), rtol=1e-5, atol=1e-4)


def test_logits_rows_selects_rows(llama_model, prompt_ids):
    prompt = torch.tensor(prompt_ids[0])
    every_row = llama_model(prompt, torch.arange(len(prompt)), DenseKVCache(30).attend)
    some_rows = llama_model(prompt, torch.arange(len(prompt)), DenseKVCache(30).attend,
                            logits_rows=torch.tensor([0, len(prompt) - 1]))
    assert every_row.shape == (len(prompt), 49152) and every_row.dtype == torch.float32
    # NOTE: close, not equal: the LM-head GEMM over 2 rows and over 37 picks different MKL kernels,
    # whose float32 sums differ in the last bits (~5e-5 on logits of ~20).
    torch.testing.assert_close(some_rows, every_row[[0, -1]], rtol=1e-5, atol=1e-4)


def test_chunked_prefill_matches_one_prefill(llama_model, prompt_ids):
    prompt = torch.tensor(prompt_ids[3])
    whole = llama_model(prompt, torch.arange(len(prompt)), DenseKVCache(30).attend)
    cache, cut = DenseKVCache(30), len(prompt) // 2
    head = llama_model(prompt[:cut], torch.arange(cut), cache.attend)
    tail = llama_model(prompt[cut:], torch.arange(cut, len(prompt)), cache.attend)
    torch.testing.assert_close(torch.cat([head, tail]), whole, rtol=1e-5, atol=1e-4)


def _tiny_hf_folder(tmp_path, **overrides):
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                      **overrides)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    return model


@pytest.mark.parametrize("rope_parameters", [
    None,
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
])
def test_untied_and_llama3_rope_checkpoints_match_transformers(tmp_path, rope_parameters):
    overrides = {"rope_parameters": rope_parameters} if rope_parameters else {}
    hf_tiny = _tiny_hf_folder(tmp_path, max_position_embeddings=64, **overrides)
    ours = LlamaModel.from_pretrained(tmp_path)
    assert not ours.config.tie_word_embeddings
    assert (ours.config.rope_scaling is None) == (rope_parameters is None)
    token_ids = torch.randint(0, 96, (40,))
    with torch.inference_mode():
        expected = hf_tiny(token_ids[None]).logits[0]
    actual = ours(token_ids, torch.arange(40), DenseKVCache(2).attend)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_transformers_4_config_layout_is_understood(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 100, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        "eos_token_id": [7, 9], "bos_token_id": 5}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [9, 11]}))
    config = LlamaConfig.from_folder(tmp_path)
    assert (config.head_dim, config.rope_theta, config.eos_token_ids) == (8, 500000.0, (7, 9, 11))
    assert config.rope_scaling == RopeScaling("llama3", factor=8.0)
    assert not config.tie_word_embeddings and config.rms_norm_eps == 1e-6


def test_llama3_frequencies_match_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    parameters = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    hf_config = transformers.LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_parameters=parameters)
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
    config = LlamaConfig(num_layers=1, hidden_size=4096, intermediate_size=1, num_q_heads=32, num_kv_heads=8,
                         head_dim=128, vocab_size=1, rope_theta=500000.0,
                         rope_scaling=RopeScaling("llama3", factor=8.0, original_max_position_embeddings=8192))
    torch.testing.assert_close(rope_inverse_frequencies(config), expected, rtol=0, atol=0)


def test_checkpoint_missing_a_tensor_names_the_fix(tmp_path):
    _tiny_hf_folder(tmp_path)
    from safetensors.torch import load_file, save_file

    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(GrowPageError, match=r"lacks model\.layers\.1\.mlp\.up_proj\.weight.*gpctl model prepare"):
        LlamaModel.from_pretrained(tmp_path)


def test_unsupported_rope_scaling_is_refused():
    with pytest.raises(GrowPageError, match="yarn"):
        RopeScaling("yarn", factor=4.0)
