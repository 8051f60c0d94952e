"""``growpage.vllm_plugin.keys``: how a compaction's moves are cut into chunks (pure arithmetic, so a
GPU-sized cap can be checked here)."""

from __future__ import annotations

import pytest

from growpage.vllm_plugin.keys import MIB, MoveOutcome, move_bytes_per_token, plan_move_chunks


@pytest.mark.parametrize("num_tokens", [1, 2, 7, 64, 1000])
@pytest.mark.parametrize("cap_tokens", [1, 3, 64, 5000])
def test_chunks_cover_every_moved_slot_once_in_order_under_the_cap(num_tokens, cap_tokens):
    per_token = 1000
    chunks = plan_move_chunks(num_tokens, per_token, cap_tokens * per_token + per_token // 2)
    starts = [start for start, _ in chunks.bounds]
    stops = [stop for _, stop in chunks.bounds]
    assert starts[0] == 0 and stops[-1] == num_tokens
    assert starts[1:] == stops[:-1], "chunks must be contiguous so that, in order, they are exact in place"
    assert all(stop > start for start, stop in chunks.bounds)
    assert chunks.tokens_per_chunk == min(cap_tokens, num_tokens)
    assert chunks.peak_bytes <= chunks.cap_bytes
    assert len(chunks.bounds) == -(-num_tokens // cap_tokens)


def test_a_token_over_the_cap_still_moves_alone():
    chunks = plan_move_chunks(5, bytes_per_token=4096, cap_bytes=100)
    assert chunks.bounds == ((0, 1), (1, 2), (2, 3), (3, 4), (4, 5))
    assert chunks.peak_bytes == 4096 > chunks.cap_bytes  # the one-token floor, said by peak_bytes


def test_nothing_to_move_is_no_chunk():
    chunks = plan_move_chunks(0, 10, 10)
    assert chunks.bounds == () and chunks.tokens_per_chunk == 0 and chunks.peak_bytes == 0


@pytest.mark.parametrize(("num_tokens", "per_token", "cap"), [(-1, 10, 10), (3, 0, 10), (3, 10, 0), (3, -5, 10)])
def test_bad_input_raises(num_tokens, per_token, cap):
    with pytest.raises(ValueError):
        plan_move_chunks(num_tokens, per_token, cap)


def test_bytes_per_token_counts_k_and_v_of_every_layer_and_the_indices():
    # an 8B model's geometry, bf16: 32 layers x 8 KV heads x 128 dims, K and V
    strided = move_bytes_per_token(32, 8, 128, 2, per_head=False, strided=True)
    assert strided == 32 * 2 * 8 * 128 * 2 + 6 * 8  # the tokens themselves plus six longs of indices
    assert 128 * 1024 <= strided < 129 * 1024  # the module docstring's "about 128 KiB per moved token"
    per_head = move_bytes_per_token(32, 8, 128, 2, per_head=True, strided=True)
    assert per_head == strided + 6 * 8 * 7  # the indices per KV head
    packed = move_bytes_per_token(32, 8, 128, 2, per_head=False, strided=False)
    assert packed > 8 * strided  # two long offsets per element on top of each 2-byte element
    # the default cap moves a few hundred such tokens per chunk
    assert plan_move_chunks(4096, strided, 64 * MIB).tokens_per_chunk == 64 * MIB // strided


def test_outcomes_add_up_and_keep_the_largest_peak():
    total = MoveOutcome(10, 2, 500, 0).plus(MoveOutcome(5, 1, 700, 3))
    assert total == MoveOutcome(15, 3, 700, 3)
