"""Chunked observation scoring (``growpage.vllm_plugin.scoring``) and the torch-only GPU checks, on CPU.

The chunks are a memory bound, never a change in result: many tiny chunks equal one chunk, and both
equal dense softmax attention over the same keys.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch

from growpage.bench.gpu_checks import CHECKS
from growpage.core.summaries import summarize_attention
from growpage.tooling.synthetic import LAYOUT_ORDERS, flash_write, layer_caches
from growpage.vllm_plugin import keys as kv_keys
from growpage.vllm_plugin import scoring
from growpage.vllm_plugin.settings import split_settings

ROOT = Path(__file__).resolve().parents[2]
HEADS, BLOCK, HEAD_DIM = 3, 16, 32


def _step(layout_name: str, lengths: list[int], layers: int = 3, dtype=torch.bfloat16):
    """Caches holding each request's random keys, its block rows, dense keys and observed layers."""
    generator = torch.Generator().manual_seed(0)
    blocks = [-(-n // BLOCK) for n in lengths]
    caches = layer_caches(layout_name, layers, sum(blocks) + 3, HEADS, BLOCK, HEAD_DIM, dtype)
    order = torch.randperm(sum(blocks) + 3, generator=generator)
    rows = torch.full((len(lengths), max(blocks)), sum(blocks) + 2)  # padding: a block no request owns
    start = 0
    for request, count in enumerate(blocks):
        rows[request, :count] = order[start:start + count]
        start += count
    dense = []
    for cache in caches:
        per_request = []
        for request, length in enumerate(lengths):
            slots = rows[request, torch.arange(length) // BLOCK] * BLOCK + torch.arange(length) % BLOCK
            k = torch.randn(length, HEADS, HEAD_DIM, generator=generator).to(dtype)
            flash_write(k, torch.randn_like(k), cache, slots)
            per_request.append(k)
        dense.append(per_request)
    kv_heads = torch.tensor([0, 1, 1, 2])
    observed = [scoring.ObservedLayer(cache, torch.randn(len(lengths), 4, HEAD_DIM, generator=generator).to(dtype),
                                      HEAD_DIM ** -0.5, kv_heads) for cache in caches]
    layout = kv_keys.probe_layout(flash_write, caches[0], HEADS, BLOCK, HEAD_DIM)
    assert layout is not None
    return observed, rows, layout, dense


@pytest.mark.parametrize("layout_name", ["LBNHC", "BHLNC"])
def test_many_tiny_chunks_equal_one_chunk_and_dense_attention(layout_name):
    lengths = [70, 5, 33, 48, 16]
    layers, rows, layout, dense = _step(layout_name, lengths)
    summarize = partial(summarize_attention, num_bins=8)
    one = scoring.score_step(layers, rows, lengths, layout, summarize=summarize, token_mass=True)
    many = scoring.score_step(layers, rows, lengths, layout, cap_bytes=1, summarize=summarize, token_mass=True)
    assert one.chunks == 1 and many.chunks == len(lengths)
    for a, b in ((one.token_mass, many.token_mass), (one.entropy, many.entropy), (one.bin_mass, many.bin_mass)):
        assert a is not None and b is not None and torch.allclose(a, b, atol=1e-6)
    mass = torch.zeros(len(lengths), max(lengths))
    for index, (layer, per_request) in enumerate(zip(layers, dense, strict=True)):
        for request, k in enumerate(per_request):
            keys = k.float()[:, layer.kv_heads].permute(1, 0, 2)
            probs = torch.softmax(torch.einsum("hd,hkd->hk", layer.query[request].float(), keys) * layer.scale, -1)
            mass[request, :len(probs[0])] += probs.mean(0)
            entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1).mean()
            assert torch.allclose(many.entropy[index, request], entropy, atol=1e-5)
    assert torch.allclose(many.token_mass, mass, atol=1e-6)


def test_token_mass_per_kv_head_is_each_kv_heads_own_mean_over_the_heads_that_read_it():
    lengths = [40, 7, 21]
    layers, rows, layout, dense = _step("LBNHC", lengths)
    one = scoring.score_step(layers, rows, lengths, layout, token_mass=True, mass_by_kv_head=True)
    many = scoring.score_step(layers, rows, lengths, layout, cap_bytes=1, token_mass=True, mass_by_kv_head=True)
    assert one.token_mass is not None and one.token_mass.shape == (len(lengths), HEADS, max(lengths))
    mass = torch.zeros(len(lengths), HEADS, max(lengths))
    for layer, per_request in zip(layers, dense, strict=True):
        for request, k in enumerate(per_request):
            keys = k.float()[:, layer.kv_heads].permute(1, 0, 2)
            probs = torch.softmax(torch.einsum("hd,hkd->hk", layer.query[request].float(), keys) * layer.scale, -1)
            for kv_head in range(HEADS):  # sampled heads [0, 1, 1, 2]: KV head 1 is read by two of them
                mass[request, kv_head, :probs.shape[1]] += probs[layer.kv_heads == kv_head].mean(0)
    assert torch.allclose(one.token_mass, mass, atol=1e-6) and torch.allclose(many.token_mass, mass, atol=1e-6)
    # the per-head mass sums back to the head mean of the request-level scores, weighted by readers
    request_level = scoring.score_step(layers, rows, lengths, layout, token_mass=True).token_mass
    weights = torch.tensor([1, 2, 1]) / 4
    assert torch.allclose((one.token_mass * weights[None, :, None]).sum(1), request_level, atol=1e-6)


def test_a_kv_head_no_sampled_head_reads_gets_the_mean_over_the_sampled_heads():
    lengths = [30, 12]
    layers, rows, layout, _ = _step("LBNHC", lengths)
    unread = [scoring.ObservedLayer(layer.cache, layer.query, layer.scale, torch.tensor([0, 0, 2, 2]))
              for layer in layers]
    per_head = scoring.score_step(unread, rows, lengths, layout, token_mass=True, mass_by_kv_head=True).token_mass
    mean = scoring.score_step(unread, rows, lengths, layout, token_mass=True).token_mass
    assert per_head is not None and mean is not None
    assert torch.allclose(per_head[:, 1], mean, atol=1e-6)
    assert not torch.allclose(per_head[:, 0], mean, atol=1e-3)


def test_chunks_cover_every_request_once_within_the_cap():
    lengths = [900, 17, 4000, 256, 256, 3100, 1]
    geometry = dict(num_layers=3, num_heads=4, head_dim=128, block_size=16, element_bytes=6)
    for cap in (1, 2 ** 20, 2 ** 24, 2 ** 30):
        for cost in (0, 512, 2 ** 30):
            chunks = scoring.plan_chunks(lengths, cap_bytes=cap, chunk_cost=cost, **geometry)
            assert sorted(row for chunk in chunks for row in chunk.rows) == list(range(len(lengths)))
            for chunk in chunks:
                assert chunk.length == max(lengths[row] for row in chunk.rows)
                single = scoring.chunk_bytes(1, chunk.length, 1, **geometry)
                planned = scoring.chunk_bytes(len(chunk.rows), chunk.length, chunk.blocks_per_gather, **geometry)
                assert planned <= max(cap, single)  # over the cap only when one request and one block exceed it
    assert len(scoring.plan_chunks(lengths, cap_bytes=2 ** 30, chunk_cost=2 ** 30, **geometry)) == 1
    assert len(scoring.plan_chunks(lengths, cap_bytes=2 ** 30, chunk_cost=0, **geometry)) == len(set(lengths))


def _scored_keys(chunks: list[scoring.Chunk]) -> int:
    return sum(len(chunk.rows) * chunk.length for chunk in chunks)


def test_a_long_prompt_among_short_decodes_is_not_padded_into_their_chunk():
    """The mixed trace's observed steps: a 1,100-token prompt ends beside a dozen decodes of 100-300
    keys. One chunk pads every decode to the prompt's length; the plan scores the prompt alone."""
    lengths = [120, 150, 180, 200, 210, 240, 260, 280, 300, 310, 1100, 1090]
    geometry = dict(num_layers=3, num_heads=4, head_dim=64, block_size=32, element_bytes=6)
    cost = scoring.chunk_cost_keys(torch.device("cpu"), 4)
    chunks = scoring.plan_chunks(lengths, cap_bytes=scoring.DEFAULT_CAP_BYTES, chunk_cost=cost, **geometry)
    assert {frozenset(lengths[row] for row in chunk.rows) for chunk in chunks if 1100 in
            {lengths[row] for row in chunk.rows}} == {frozenset({1090, 1100})}
    one = scoring.plan_chunks(lengths, cap_bytes=scoring.DEFAULT_CAP_BYTES, chunk_cost=2 ** 30, **geometry)
    assert len(one) == 1
    # fewer keys scored, by more than the extra chunks cost
    assert _scored_keys(chunks) + cost * len(chunks) < _scored_keys(one) + cost
    assert _scored_keys(chunks) < _scored_keys(one) / 2
    # decodes of one length share a chunk: a cut there saves no padding
    same = scoring.plan_chunks([200] * 12, cap_bytes=scoring.DEFAULT_CAP_BYTES, chunk_cost=cost, **geometry)
    assert len(same) == 1


def test_a_chunk_costs_fewer_keys_the_more_query_heads_score_each_key():
    cpu = torch.device("cpu")
    assert scoring.chunk_cost_keys(cpu, 8) == scoring.chunk_cost_keys(cpu, 4) // 2
    assert scoring.chunk_cost_keys(torch.device("cuda"), 4) > scoring.chunk_cost_keys(cpu, 4)
    assert scoring.chunk_cost_keys(cpu, 10 ** 9) == 1


@pytest.mark.parametrize("layout_name", list(LAYOUT_ORDERS))
def test_keys_are_read_row_by_row_as_written_in_every_layout_duplicate_heads_included(layout_name):
    """Every layout vLLM's backends write is strided, so each (request, head, block) is one copied row
    (heads outer to blocks too); the keys are the ones written, for each head asked."""
    layers, rows, layout, dense = _step(layout_name, [40, 20, 7], layers=1)
    assert layout.key_tiles is not None
    heads = torch.tensor([2, 0, 0])  # a KV head twice: two sampled query heads of one group
    got = kv_keys.gather_key_blocks(layers[0].cache, rows, heads, layout)
    assert got.shape == (3, 3, rows.shape[1], BLOCK, HEAD_DIM)
    for request, keys in enumerate(dense[0]):
        length = keys.shape[0]
        read = got[request].reshape(3, -1, HEAD_DIM)[:, :length]  # [heads, tokens, hd]
        assert torch.equal(read, keys[:, heads].transpose(0, 1)), (layout_name, request)


def test_a_packed_layout_is_read_element_by_element_and_gives_the_same_keys():
    layers, rows, layout, _ = _step("LBHNC", [40, 20], layers=1)
    assert layout.key_tiles is not None
    permutation = torch.randperm(layout.key_index.numel(), generator=torch.Generator().manual_seed(3))
    packed = kv_keys.BlockLayout(layout.key_index.flatten()[permutation].view_as(layout.key_index),
                                 layout.value_index, layout.block_stride)
    assert packed.key_tiles is None
    cache, heads = layers[0].cache, torch.tensor([2, 0])
    got = kv_keys.gather_key_blocks(cache, rows, heads, packed)
    storage = kv_keys.storage_of(cache)[cache.storage_offset():]
    expected = storage[rows[:, None, :, None, None] * packed.block_stride + packed.key_index[heads][None, :, None]]
    assert torch.equal(got, expected)


def test_the_observation_cap_is_a_plugin_setting():
    _, settings = split_settings({}, env={"GROWPAGE_VLLM_OBSERVE_CHUNK_MIB": "64"})
    assert settings.observe_chunk_mib == 64
    assert split_settings({}, env={})[1].observe_chunk_mib == 256
    with pytest.raises(Exception, match="observe_chunk_mib"):
        split_settings({"observe_chunk_mib": 0}, env={})


def test_torch_only_gpu_checks_run_on_cpu_without_vllm_or_growpages_other_dependencies(tmp_path):
    """``scripts/gpu_torch_checks.py --device cpu --quick``: every layout's probe, read, moves (per
    request and per KV head), scoring and redundancy pass, the measurements come back, and neither
    vLLM nor PyYAML, typer or prometheus is imported (a GPU machine with CUDA torch alone can run it)."""
    report_path = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_torch_checks.py"), "--device", "cpu",
                           "--quick", "--output", str(report_path)], capture_output=True, text=True, timeout=1200,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["ok"] and report["forbidden_modules_imported"] == []
    assert len(report["checks"]) == 12 and all(set(c) == set(CHECKS) and all(c.values())
                                               for c in report["checks"].values())
    step = report["observation"][-1]
    assert step["after_chunks"] > 1 and step["after_peak_bytes"] <= step["cap_bytes"]
    assert step["max_abs_diff_token_mass"] < 1e-4 and step["before_ms"] is not None


@pytest.mark.parametrize("layout_name", ["LBNHC", "BHLNC"])
def test_an_observation_window_is_causal_and_a_repeated_newest_query_changes_nothing(layout_name):
    """Three window queries per request: request 0 ends its prompt (offsets 2, 1, 0), request 1
    decodes (its newest query three times). Each query sees only the keys before it; the scores
    are means over heads and window queries, and request 1's equal its one-query scores."""
    lengths = [40, 23]
    layers, rows, layout, dense = _step(layout_name, lengths)
    generator = torch.Generator().manual_seed(1)
    windowed = []
    for layer in layers:
        query = torch.randn(2, 4, 3, HEAD_DIM, generator=generator).to(layer.query.dtype)
        query[1] = layer.query[1][:, None, :]  # request 1: its newest query, repeated
        windowed.append(scoring.ObservedLayer(layer.cache, query, layer.scale, layer.kv_heads))
    offsets = [[2, 1, 0], [0, 0, 0]]
    summarize = partial(summarize_attention, num_bins=8)
    scores = scoring.score_step(windowed, rows, lengths, layout, summarize=summarize, token_mass=True,
                                query_offsets=offsets)
    tiny = scoring.score_step(windowed, rows, lengths, layout, cap_bytes=1, summarize=summarize, token_mass=True,
                              query_offsets=offsets)
    assert torch.allclose(scores.token_mass, tiny.token_mass, atol=1e-6)  # chunking still changes nothing
    one = scoring.score_step(layers, rows, lengths, layout, summarize=summarize, token_mass=True)
    assert torch.allclose(scores.token_mass[1], one.token_mass[1], atol=1e-6)
    assert torch.allclose(scores.entropy[:, 1], one.entropy[:, 1], atol=1e-5)
    mass = torch.zeros(max(lengths))
    for layer, per_request in zip(windowed, dense, strict=True):
        keys = per_request[0].float()[:, layer.kv_heads].permute(1, 0, 2)  # [H, K, hd]
        logits = torch.einsum("hwd,hkd->hwk", layer.query[0].float(), keys) * layer.scale
        visible = torch.tensor([lengths[0] - o for o in offsets[0]])
        logits = logits.masked_fill(torch.arange(lengths[0])[None, None, :] >= visible[None, :, None], float("-inf"))
        mass[:lengths[0]] += torch.softmax(logits, -1).mean((0, 1))
    assert torch.allclose(scores.token_mass[0], mass, atol=1e-6)
    assert scores.token_mass[0, lengths[0] - 2:].sum() > 0  # the newest query sees the last keys


def test_window_offsets_must_match_the_window():
    layers, rows, layout, _ = _step("LBNHC", [20])
    windowed = [scoring.ObservedLayer(layer.cache, layer.query[:, :, None, :].expand(1, 4, 2, HEAD_DIM),
                                      layer.scale, layer.kv_heads) for layer in layers]
    with pytest.raises(ValueError, match="2 offsets per request"):
        scoring.score_step(windowed, rows, [20], layout, query_offsets=[[0]])


def test_a_window_of_skipped_steps_queries_can_leave_the_summaries_to_the_newest_query():
    """The skipped steps' queries feed the token mass; the summaries stay the observed step's own
    (its newest query's), as they were before those queries were kept: same entropy and bins as
    scoring the newest query alone, the token mass still the window's."""
    lengths = [40, 23]
    layers, rows, layout, _ = _step("LBNHC", lengths)
    generator = torch.Generator().manual_seed(2)
    windowed = []
    for layer in layers:
        query = torch.randn(2, 4, 3, HEAD_DIM, generator=generator).to(layer.query.dtype)
        query[:, :, -1] = layer.query  # the newest query last
        windowed.append(scoring.ObservedLayer(layer.cache, query, layer.scale, layer.kv_heads))
    offsets = [[2, 1, 0], [2, 1, 0]]
    summarize = partial(summarize_attention, num_bins=8)
    newest = scoring.score_step(windowed, rows, lengths, layout, summarize=summarize, token_mass=True,
                                query_offsets=offsets, summarize_newest=True)
    whole = scoring.score_step(windowed, rows, lengths, layout, summarize=summarize, token_mass=True,
                               query_offsets=offsets)
    one = scoring.score_step(layers, rows, lengths, layout, summarize=summarize, token_mass=True)
    assert torch.allclose(newest.entropy, one.entropy, atol=1e-5)
    assert torch.allclose(newest.bin_mass, one.bin_mass, atol=1e-5)
    assert not torch.allclose(whole.entropy, one.entropy, atol=1e-3)  # the window's mean differs
    assert torch.allclose(newest.token_mass, whole.token_mass, atol=1e-6)
