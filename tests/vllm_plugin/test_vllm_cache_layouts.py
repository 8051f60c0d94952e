"""Every cache layout GrowPage meets is learned from the backend's own write, then read and moved exactly."""

from __future__ import annotations

import pytest
import torch
from cache_layouts import (
    amx_like_write,
    available_vllm_isas,
    lossy_write,
    probed,
    row_major_write,
    transposed_write,
    vllm_cpu_writer,
)

from growpage.vllm_plugin import keys as kv_keys

BLOCK, HEADS, HEAD_DIM = 32, 3, 64  # the packaged model's geometry (block 32 as the tests run vLLM)

WRITERS = [("vec-layout", transposed_write, torch.float32), ("row-major", row_major_write, torch.float32),
           ("amx-layout", amx_like_write, torch.bfloat16),
           ("fp32-amx-layout", amx_like_write, torch.float32)]  # its pairs read as 8-byte words
WRITERS += [(f"vllm-cpu-{isa}", vllm_cpu_writer(isa), torch.bfloat16)
            for isa in available_vllm_isas(torch.bfloat16, BLOCK, HEAD_DIM)]


def _filled(write, dtype, tokens: int, num_blocks: int, block_row: list[int]):
    """A cache holding ``tokens`` random tokens written by ``write`` into ``block_row``'s blocks."""
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(tokens, HEADS, HEAD_DIM, generator=generator).to(dtype)
    values = torch.randn(tokens, HEADS, HEAD_DIM, generator=generator).to(dtype)
    row = torch.tensor(block_row)
    slots = row[torch.arange(tokens) // BLOCK] * BLOCK + torch.arange(tokens) % BLOCK
    cache = torch.zeros(num_blocks, HEADS, BLOCK, 2 * HEAD_DIM, dtype=dtype)
    write(keys, values, cache, slots)
    return cache, keys, values, row, slots


@pytest.mark.parametrize(("name", "write", "dtype"), WRITERS, ids=[w[0] for w in WRITERS])
def test_keys_read_back_exactly_in_every_layout(name, write, dtype):
    cache, keys, _, row, _ = _filled(write, dtype, 70, 6, [4, 1, 3])
    layout = probed(write, 6, HEADS, BLOCK, HEAD_DIM, dtype)
    heads = torch.tensor([0, 2])
    got = kv_keys.read_keys(cache, row, 70, heads, layout)  # [H, tokens, hd]
    assert torch.equal(got, keys[:, [0, 2]].transpose(0, 1))


@pytest.mark.parametrize(("name", "write", "dtype"), WRITERS, ids=[w[0] for w in WRITERS])
def test_move_tokens_matches_a_dense_copy_in_every_layout(name, write, dtype):
    cache, keys, values, _, slots = _filled(write, dtype, 70, 6, [4, 1, 3])
    layout = probed(write, 6, HEADS, BLOCK, HEAD_DIM, dtype)
    # keep tokens 0, 1, 40, 69 in the first four slots (overlapping sources and destinations)
    keep = torch.tensor([0, 1, 40, 69])
    kv_keys.move_tokens(cache, slots[keep], slots[:4], layout)
    for index, token in enumerate(keep.tolist()):
        assert torch.equal(kv_keys.read_token(cache, int(slots[index]), layout), keys[token])
        assert torch.equal(kv_keys.read_token(cache, int(slots[index]), layout, value=True), values[token])
    for token in range(4, 70):  # nothing else moved
        assert torch.equal(kv_keys.read_token(cache, int(slots[token]), layout), keys[token])


def test_the_real_cpu_kernels_of_this_machine_are_covered():
    isas = available_vllm_isas(torch.bfloat16, BLOCK, HEAD_DIM)
    if not isas:
        pytest.skip("vLLM is not installed")
    # vec16 always runs on x86; vec whenever the block is a multiple of 32
    assert {"vec", "vec16"} <= set(isas)


@pytest.mark.parametrize(("name", "write", "dtype"), WRITERS, ids=[w[0] for w in WRITERS])
def test_every_layout_a_backend_writes_is_strided_so_reads_and_moves_need_no_offsets(name, write, dtype):
    """K and V of every layout, amx's VNNI pairs included, are strides (a slot or dim split in two
    at most), so keys are read and tokens moved through strided views, never element by element."""
    layout = probed(write, 2, HEADS, BLOCK, HEAD_DIM, dtype)
    for tiles, index in ((layout.key_tiles, layout.key_index), (layout.value_tiles, layout.value_index)):
        assert tiles is not None, name
        assert torch.equal(tiles.offsets(HEADS, BLOCK, HEAD_DIM), index)
    splits = {(tiles.slot_split, tiles.dim_split) for tiles in (layout.key_tiles, layout.value_tiles)}
    if name.endswith("amx-layout") or name.endswith("-amx"):
        assert splits == {(16, 2), (2, 16)}  # K: a slot's dims in pairs; V: slots in pairs
    else:
        assert splits == {(1, 1)}  # affine


@pytest.mark.parametrize(("name", "write", "dtype"), WRITERS, ids=[w[0] for w in WRITERS])
def test_a_compaction_writes_whole_rows_where_a_tokens_dims_are_contiguous(name, write, dtype):
    """Row-major K and V, and the vec kernels' V, take one row per (layer, head, slot) on a move's
    write; vec's transposed K and amx's pairs go through the strided view."""
    layout = probed(write, 2, HEADS, BLOCK, HEAD_DIM, dtype)
    cache = torch.zeros(6, HEADS, BLOCK, 2 * HEAD_DIM, dtype=dtype)
    group = kv_keys._cache_groups([cache], layout)[0]
    writes_rows = [kv_keys._token_rows_to_write(group, tiles) is not None for tiles in group.tiles]  # K, V
    expected = {"row-major": [True, True], "amx-layout": [False, False], "fp32-amx-layout": [False, False],
                "vllm-cpu-amx": [False, False]}
    assert writes_rows == expected.get(name, [False, True]), name  # vec, vec16: K transposed, V rows


def test_the_amx_emulation_is_the_layout_the_real_amx_kernel_writes():
    if "amx" not in available_vllm_isas(torch.bfloat16, BLOCK, HEAD_DIM):
        pytest.skip("vLLM's amx kernel does not run on this CPU (no AMX tiles)")
    for heads, block, head_dim in ((HEADS, BLOCK, HEAD_DIM), (2, 64, 128)):
        emulated = probed(amx_like_write, 2, heads, block, head_dim, torch.bfloat16)
        real = probed(vllm_cpu_writer("amx"), 2, heads, block, head_dim, torch.bfloat16)
        assert torch.equal(emulated.key_index, real.key_index)
        assert torch.equal(emulated.value_index, real.value_index)


def test_a_layout_that_does_not_round_trip_is_refused():
    cache = torch.zeros(2, HEADS, BLOCK, 2 * HEAD_DIM)
    assert kv_keys.probe_layout(lossy_write, cache, HEADS, BLOCK, HEAD_DIM) is None
    assert kv_keys.probe_layout(row_major_write, cache.transpose(2, 3), HEADS, BLOCK, HEAD_DIM) is None


@pytest.mark.parametrize(("name", "write", "dtype"), WRITERS, ids=[w[0] for w in WRITERS])
def test_batched_reads_match_one_request_at_a_time(name, write, dtype):
    cache, _, _, _, _ = _filled(write, dtype, 96, 8, [4, 1, 3])
    layout = probed(write, 8, HEADS, BLOCK, HEAD_DIM, dtype)
    rows = torch.tensor([[4, 1, 3], [6, 0, 0], [2, 5, 7]])  # padded rows: callers mask past each length
    heads = torch.tensor([1, 2])
    batched = kv_keys.read_keys_batched(cache, rows, heads, layout)
    for request, length in enumerate((70, 20, 96)):
        single = kv_keys.read_keys(cache, rows[request], length, heads, layout)
        assert torch.equal(batched[request, :, :length], single)
