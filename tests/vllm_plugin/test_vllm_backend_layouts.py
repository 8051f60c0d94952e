"""Every attention backend GrowPage wraps, in every KV-cache layout vLLM can give it, checked on CPU.

The caches are built exactly as vLLM's worker builds them (one allocation, per-layer strided views
from ``create_kv_cache_views``) for each ``KVCacheLayout``, filled by the backend's own write
(vLLM's CPU kernels; for the CUDA backends, their ``reshape_and_cache_flash`` in torch, which is
the same strided store), and then GrowPage's probe, key reads, token moves and the observer's
attention probabilities are compared with a dense reference.
"""

from __future__ import annotations

import inspect
import types
from pathlib import Path

import pytest
import torch
from cache_layouts import (
    FLASH_WRITE_SOURCE,
    amx_like_write,
    available_vllm_isas,
    cuda_flash_write,
    flash_write,
    vllm_cpu_writer,
    vllm_layer_caches,
)

from growpage.core.methods import Observation
from growpage.tooling import synthetic
from growpage.vllm_plugin import keys as kv_keys
from growpage.vllm_plugin.observer import VllmObserver
from growpage.vllm_plugin.settings import split_settings

pytest.importorskip("vllm.v1.kv_cache_layout", reason="needs vLLM's KV-cache layout module")
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

BLOCK, HEADS, HEAD_DIM, LAYERS, NUM_BLOCKS = 32, 3, 64, 4, 6
ALL_LAYOUTS = list(KVCacheLayout.__members__)
GPU_BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")

# (backend, layout, writer, dtype): the CPU backend takes only LBHNC (its supported_kv_cache_layouts),
# with each of its kernels that runs here; the CUDA backends accept any layout on Hopper/Ampere.
CASES = [("CPU_ATTN", "LBHNC", vllm_cpu_writer(isa), torch.bfloat16, isa)
         for isa in available_vllm_isas(torch.bfloat16, BLOCK, HEAD_DIM)]
CASES += [("CPU_ATTN", "LBHNC", amx_like_write, torch.bfloat16, "amx-like")]  # amx's pairs, on any host
CASES += [(backend, layout, flash_write, dtype, str(dtype).removeprefix("torch."))
          for backend in GPU_BACKENDS for layout in ALL_LAYOUTS for dtype in (torch.float16, torch.bfloat16)]
IDS = [f"{backend}-{layout}-{tag}" for backend, layout, _, _, tag in CASES]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout_name", ALL_LAYOUTS)
def test_the_torch_only_caches_are_vllms_views(layout_name, dtype):
    """The torch-only GPU checks and benchmarks build caches without vLLM; they must be the very
    views vLLM's ``create_kv_cache_views`` gives (same shapes, strides and offsets in one storage)."""
    assert list(synthetic.LAYOUT_ORDERS) == ALL_LAYOUTS
    assert all(synthetic.LAYOUT_ORDERS[name] == KVCacheLayout[name].stride_order for name in ALL_LAYOUTS)
    ours = synthetic.layer_caches(layout_name, LAYERS, NUM_BLOCKS, HEADS, BLOCK, HEAD_DIM, dtype)
    theirs = vllm_layer_caches(layout_name, LAYERS, NUM_BLOCKS, HEADS, BLOCK, HEAD_DIM, dtype)
    for a, b in zip(ours, theirs, strict=True):
        assert (a.shape, a.stride(), a.storage_offset(), a.dtype) == (b.shape, b.stride(), b.storage_offset(), b.dtype)
        assert a.untyped_storage().nbytes() == b.untyped_storage().nbytes()
    assert synthetic.flash_write.__doc__ and FLASH_WRITE_SOURCE in inspect.getsource(synthetic.flash_write)


def _request(write, layout_name: str, dtype: torch.dtype, tokens: int = 70, block_row=(4, 1, 3)):
    """Every layer of a vLLM-built cache holding its own random K/V for one request."""
    caches = vllm_layer_caches(layout_name, LAYERS, NUM_BLOCKS, HEADS, BLOCK, HEAD_DIM, dtype)
    generator = torch.Generator().manual_seed(0)
    row = torch.tensor(block_row)
    slots = row[torch.arange(tokens) // BLOCK] * BLOCK + torch.arange(tokens) % BLOCK
    keys, values = [], []
    for cache in caches:
        k = torch.randn(tokens, HEADS, HEAD_DIM, generator=generator).to(dtype)
        v = torch.randn(tokens, HEADS, HEAD_DIM, generator=generator).to(dtype)
        write(k, v, cache, slots)
        keys.append(k)
        values.append(v)
    return caches, keys, values, row, slots


def test_the_cuda_backends_write_the_cache_the_way_the_emulation_does():
    import vllm

    root = Path(vllm.__file__).parent / "v1" / "attention" / "backends"
    for module in ("flash_attn.py", "flashinfer.py", "triton_attn.py"):
        assert FLASH_WRITE_SOURCE in (root / module).read_text(), \
            f"{module} no longer writes through kv_cache.transpose(1, 2).split(...): update flash_write"


@pytest.mark.parametrize(("backend", "layout_name", "write", "dtype", "tag"), CASES, ids=IDS)
def test_probe_reads_and_moves_match_a_dense_reference(backend, layout_name, write, dtype, tag):
    caches, keys, values, row, slots = _request(write, layout_name, dtype)
    layout = kv_keys.probe_layout(write, caches[0], HEADS, BLOCK, HEAD_DIM)
    assert layout is not None, f"{backend} {layout_name}: the probe did not round-trip"
    heads = torch.tensor([0, 2])
    for cache, k in zip(caches, keys, strict=True):
        got = kv_keys.read_keys_batched(cache, row[None], heads, layout)[0, :, :70]
        assert torch.equal(got, k[:, [0, 2]].transpose(0, 1))
    storage_before = kv_keys.storage_of(caches[0]).clone()
    keep = torch.tensor([0, 1, 40, 69])  # into the first four slots: sources and destinations overlap
    moved = kv_keys.move_tokens_in_layers(caches, slots[keep], slots[:4], layout)
    assert moved == LAYERS * len(keep) * 2 * HEADS * HEAD_DIM * caches[0].element_size()  # K and V, every layer
    changed = set()
    for cache, k, v in zip(caches, keys, values, strict=True):
        for index, token in enumerate(keep.tolist()):
            assert torch.equal(kv_keys.read_token(cache, int(slots[index]), layout), k[token])
            assert torch.equal(kv_keys.read_token(cache, int(slots[index]), layout, value=True), v[token])
        for token in range(4, 70):
            assert torch.equal(kv_keys.read_token(cache, int(slots[token]), layout), k[token])
        base = cache.storage_offset()
        for slot in slots[:4].tolist():
            block, offset = divmod(slot, BLOCK)
            for index in (layout.key_index, layout.value_index):
                changed |= set((base + block * layout.block_stride + index[:, offset]).flatten().tolist())
    storage_after = kv_keys.storage_of(caches[0])
    untouched = torch.ones(storage_after.numel(), dtype=torch.bool)
    untouched[list(changed)] = False
    assert torch.equal(storage_after[untouched], storage_before[untouched]), "a move wrote outside its slots"


def _compaction_scores(observer: VllmObserver, request_id: str) -> torch.Tensor:
    """The scores a compaction of ``request_id`` would rank its tokens by (its one observation, the
    prompt's, unweighted)."""
    assert observer.compactor is not None
    scores = observer.compactor.scores
    observed = scores._requests[request_id].folded
    weight = scores.method.observation_weight(Observation.PROMPT_END)
    return scores.ranking(request_id, torch.arange(observed.numel())) / weight


def _observer() -> VllmObserver:
    # every step observed: these steps are driven by hand, without the scheduler output that says a
    # prompt ends (the step that ends one is observed whatever the stride)
    config, plugin = split_settings({"mode": "enforce", "base_pages": 2, "recent_window_tokens": 8,
                                     "observed_layers": 1, "observed_heads": 9, "exporter_port": -1,
                                     "observe_every_steps": 1},
                                    env={}, block_size=BLOCK)
    return VllmObserver(config, plugin, num_layers=1, max_requests=4)


@pytest.mark.parametrize("metadata_kind", ["flash", "flashinfer"])
@pytest.mark.parametrize("layout_name", ALL_LAYOUTS)
def test_observer_probabilities_match_dense_attention(layout_name, metadata_kind):
    """Two decoding requests in a CUDA backend's layout: the observer's per-token attention (the
    compaction scores) and entropy equal dense softmax attention over the same keys.

    ``flash``: FLASH_ATTN / TRITON_ATTN metadata (``query_start_loc``, ``seq_lens``,
    ``block_table``). ``flashinfer``: FlashInfer's metadata has no block table or lengths; the
    observer takes them from the runner's host mirrors and its block table.
    """
    torch.manual_seed(0)
    dtype, num_heads = torch.float16, 9
    lengths, block_rows = [70, 33], [[4, 1, 3], [0, 5, 2]]
    caches = vllm_layer_caches(layout_name, 1, NUM_BLOCKS, HEADS, BLOCK, HEAD_DIM, dtype)
    cache = caches[0]
    keys = []
    for length, block_row in zip(lengths, block_rows, strict=True):
        row = torch.tensor(block_row)
        slots = row[torch.arange(length) // BLOCK] * BLOCK + torch.arange(length) % BLOCK
        k = torch.randn(length, HEADS, HEAD_DIM).to(dtype)
        flash_write(k, torch.randn_like(k), cache, slots)
        keys.append(k)

    observer = _observer()
    new = [types.SimpleNamespace(req_id=f"r{i}", prompt_token_ids=list(range(length - 1)), num_computed_tokens=0,
                                 sampling_params=types.SimpleNamespace(extra_args={}))
           for i, length in enumerate(lengths)]
    table = torch.tensor(block_rows)
    block_table = types.SimpleNamespace(block_tables=[types.SimpleNamespace(get_device_tensor=lambda n: table[:n])])
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(req_ids=["r0", "r1"], block_table=block_table))
    starts = torch.tensor([0, 1, 2], dtype=torch.int32)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    if metadata_kind == "flash":
        metadata = types.SimpleNamespace(query_start_loc=starts, seq_lens=seq_lens, block_table=table)
    else:
        runner.query_start_loc = types.SimpleNamespace(cpu=starts)
        runner.optimistic_seq_lens_cpu = seq_lens
        metadata = types.SimpleNamespace(slot_mapping=None)  # FlashInferMetadata carries neither
    observer.begin_step(runner, types.SimpleNamespace(finished_req_ids=set(), scheduled_new_reqs=new))
    observer.note_kv_write(cache, keys[1][-1:], torch.tensor([5 * BLOCK]), flash_write, num_kv_heads=HEADS,
                           block_size=BLOCK, head_dim=HEAD_DIM)
    assert observer.ready_to_compact, observer.state
    query = torch.randn(2, num_heads, HEAD_DIM).to(dtype)
    impl = types.SimpleNamespace(num_heads=num_heads, num_kv_heads=HEADS, scale=HEAD_DIM ** -0.5)
    observer.observe_layer(impl, query, cache, metadata)

    dense = []
    for request, k in enumerate(keys):
        kv_of_head = torch.arange(num_heads) // (num_heads // HEADS)
        logits = torch.einsum("hd,hkd->hk", query[request].float(), k.float().permute(1, 0, 2)[kv_of_head])
        dense.append(torch.softmax(logits * impl.scale, dim=-1))  # [heads, tokens]
    entropies = [-(probs * probs.clamp_min(1e-30).log()).sum(-1).mean() for probs in dense]
    observer.flush_observations()  # the step's observed layers are scored together
    assert torch.allclose(observer.step.layers[0].entropy, torch.stack(entropies), atol=1e-4)
    observer.end_step()  # the step's per-token attention becomes each enforced request's scores
    for request, probs in enumerate(dense):
        assert torch.allclose(_compaction_scores(observer, f"r{request}"), probs.mean(0), atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("layout_name", ALL_LAYOUTS)
def test_the_real_cuda_kernel_writes_what_the_emulation_writes(layout_name):
    """On a CUDA machine with vLLM's CUDA build: the layout tests above hold for the real kernel."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    caches = [vllm_layer_caches(layout_name, 2, NUM_BLOCKS, HEADS, BLOCK, HEAD_DIM, torch.float16, "cuda")[1]
              for _ in range(2)]
    keys = torch.randn(70, HEADS, HEAD_DIM, device="cuda").half()
    values = torch.randn_like(keys)
    row = torch.tensor([4, 1, 3], device="cuda")
    slots = row[torch.arange(70, device="cuda") // BLOCK] * BLOCK + torch.arange(70, device="cuda") % BLOCK
    cuda_flash_write(keys, values, caches[0], slots)
    flash_write(keys, values, caches[1], slots)
    assert torch.equal(kv_keys.storage_of(caches[0]), kv_keys.storage_of(caches[1]))
    layout = kv_keys.probe_layout(cuda_flash_write, caches[0], HEADS, BLOCK, HEAD_DIM)
    assert layout is not None and layout.key_index.is_cuda
    got = kv_keys.read_keys_batched(caches[0], row[None], torch.arange(HEADS), layout)[0, :, :70]
    assert torch.equal(got, keys.transpose(0, 1))


@pytest.mark.parametrize("layout_name", ["LBNHC", "BLHNC"])
def test_layers_scored_together_at_the_end_of_the_step_match_each_layer_alone(layout_name):
    """The observer scores every observed layer of a step in one gather over the shared allocation;
    each layer's entropy and the summed compaction scores equal dense attention layer by layer."""
    torch.manual_seed(1)
    dtype, num_heads, length, block_row = torch.float16, 9, 45, [3, 0]
    caches = vllm_layer_caches(layout_name, LAYERS, NUM_BLOCKS, HEADS, BLOCK, HEAD_DIM, dtype)
    row = torch.tensor(block_row)
    slots = row[torch.arange(length) // BLOCK] * BLOCK + torch.arange(length) % BLOCK
    keys = []
    for cache in caches:
        k = torch.randn(length, HEADS, HEAD_DIM).to(dtype)
        flash_write(k, torch.randn_like(k), cache, slots)
        keys.append(k)
    observer = _observer()
    new = [types.SimpleNamespace(req_id="r", prompt_token_ids=list(range(length - 1)), num_computed_tokens=0,
                                 sampling_params=types.SimpleNamespace(extra_args={}))]
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(req_ids=["r"]))
    metadata = types.SimpleNamespace(query_start_loc=torch.tensor([0, 1]), seq_lens=torch.tensor([length]),
                                     block_table=row[None])
    observer.begin_step(runner, types.SimpleNamespace(finished_req_ids=set(), scheduled_new_reqs=new))
    observer.note_kv_write(caches[0], keys[0][-1:], slots[-1:], flash_write, num_kv_heads=HEADS, block_size=BLOCK,
                           head_dim=HEAD_DIM)
    impl = types.SimpleNamespace(num_heads=num_heads, num_kv_heads=HEADS, scale=HEAD_DIM ** -0.5)
    queries = [torch.randn(1, num_heads, HEAD_DIM).to(dtype) for _ in (1, 2, 3)]
    for layer, query in zip((1, 2, 3), queries, strict=True):
        observer.observe_layer(impl, query, caches[layer], metadata)
    observer.flush_observations()
    mass = torch.zeros(length)
    for position, (layer, query) in enumerate(zip((1, 2, 3), queries, strict=True)):
        kv_of_head = torch.arange(num_heads) // (num_heads // HEADS)
        logits = torch.einsum("hd,hkd->hk", query[0].float(), keys[layer].float().permute(1, 0, 2)[kv_of_head])
        probs = torch.softmax(logits * impl.scale, dim=-1)
        entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1).mean()
        assert torch.allclose(observer.step.layers[position].entropy, entropy[None], atol=1e-4)
        mass += probs.mean(0)
    observer.end_step()
    assert torch.allclose(_compaction_scores(observer, "r"), mass, atol=1e-5)
