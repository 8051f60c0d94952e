"""R-KV's redundancy term (``growpage.vllm_plugin.redundancy``): what a compaction of a long decode drops.

Pure torch, no vLLM needed.
"""

from __future__ import annotations

import pytest
import torch

from growpage.vllm_plugin.redundancy import SIMILARITY_THRESHOLD, key_redundancy, mix_redundancy


def _reference(keys: torch.Tensor) -> torch.Tensor:
    """R-KV's redundancy written out densely, one layer and head at a time."""
    num_layers, num_heads, count, _ = keys.shape
    out = torch.zeros(num_heads, count)
    for head in range(num_heads):
        total = torch.zeros(count)
        for layer in range(num_layers):
            k = torch.nn.functional.normalize(keys[layer, head].float(), dim=-1)
            similarity = k @ k.T
            similarity.fill_diagonal_(0.0)
            for row in range(count):
                similar = [j for j in range(count) if j != row and similarity[row, j] > SIMILARITY_THRESHOLD]
                if similar:
                    similarity[row, max(similar)] = 0.0
            total += similarity.mean(0)
        out[head] = (total / num_layers).softmax(-1)
    return out


def test_redundancy_matches_r_kv_written_out_and_does_not_depend_on_the_chunking():
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(2, 3, 40, 8, generator=generator)
    keys[:, :, 20:30] = keys[:, :, 5:6] + 0.1 * torch.randn(2, 3, 10, 8, generator=generator)  # a repeated phrase
    whole = key_redundancy(keys)
    assert torch.allclose(whole, _reference(keys), atol=1e-6)
    assert torch.allclose(key_redundancy(keys, cap_bytes=1), whole, atol=1e-6)  # one row at a time
    assert torch.allclose(whole.sum(-1), torch.ones(3))


def test_copies_are_more_redundant_than_unique_keys_and_the_newest_copy_least_of_them():
    keys = torch.eye(6)[None, None].clone()  # six unlike keys
    keys[0, 0, 3] = keys[0, 0, 1]
    keys[0, 0, 5] = keys[0, 0, 1]  # 1, 3 and 5 are one key
    redundancy = key_redundancy(keys)[0]
    unique = redundancy[[0, 2, 4]]
    assert redundancy[1] > redundancy[3] > unique.max() - 1e-7  # the older copies weigh most
    assert redundancy[5] <= unique.max() + 1e-7  # the newest copy is as cheap to keep as a unique key


@pytest.mark.parametrize("weight", [0.5, 0.9])
def test_mixing_keeps_the_candidates_mass_and_orders_them_as_r_kv(weight):
    generator = torch.Generator().manual_seed(1)
    importance = torch.rand(30, generator=generator)
    redundancy = torch.rand(30, generator=generator).softmax(-1)
    mixed = mix_redundancy(importance, redundancy, weight)
    assert mixed.sum().item() == pytest.approx(importance.sum().item(), rel=1e-5)
    r_kv = (1 - weight) * importance / importance.sum() - weight * redundancy
    assert torch.equal(mixed.argsort(), r_kv.argsort())


def test_no_weight_or_no_attention_is_handled():
    importance, redundancy = torch.tensor([0.3, 0.1, 0.6]), torch.tensor([0.2, 0.5, 0.3])
    assert torch.equal(mix_redundancy(importance, redundancy, 0.0), importance)
    assert torch.equal(mix_redundancy(torch.zeros(3), redundancy, 0.9), -redundancy)  # redundancy alone decides
    assert torch.equal(mix_redundancy(importance[:1], redundancy[:1], 0.9), importance[:1])
