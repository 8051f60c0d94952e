"""Reading a running request's KV from vLLM's scheduler objects: its blocks, the run of them shared
through the prefix cache, and its physical length. One reading for the enforcer, the scheduler
agent and the router's headroom, so they cannot disagree on what a request holds.

Duck-typed over vLLM's ``KVCacheManager``, ``KVCacheBlock`` and ``Request`` (no vLLM import: the
tests drive it with stand-ins).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence

from growpage.core.step_control import holds_everyone
from growpage.vllm_plugin.vllm_types import KVBlock, KVCacheManager, Request, RequestQueue
from growpage.vllm_plugin.wire import DROPPED_ATTRIBUTE


def blocks_by_request(kv_cache_manager: KVCacheManager) -> dict[str, list[KVBlock]]:
    """Each request's block list (the first KV cache group's; GrowPage runs on one-group models)."""
    return kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks


def leading_shared_blocks(blocks: Sequence[KVBlock]) -> int:
    """How many of the request's first blocks are shared through the prefix cache (``ref_cnt > 1``)."""
    count = 0
    for block in blocks:
        if getattr(block, "ref_cnt", 1) <= 1:
            break
        count += 1
    return count


def owns_tail(blocks: Sequence[KVBlock], shared_blocks: int) -> bool:
    """No block after the shared run is shared: compaction rewrites only blocks the request alone holds."""
    return all(getattr(block, "ref_cnt", 1) <= 1 for block in blocks[shared_blocks:])


def physical_tokens(request: Request) -> int:
    """Tokens the request's blocks hold: vLLM's computed tokens less what compaction dropped."""
    return int(request.num_computed_tokens) - int(getattr(request, DROPPED_ATTRIBUTE, 0) or 0)

UNKNOWN_PAGES = 1 << 40  # what a request of unknown length is counted as needing: more than any pool


def pages_to_finish(request: Request, pages_held: int, block_size: int) -> int:
    """Pages ``request`` still takes to reach its ``max_tokens`` with nothing more compressed:
    its full length (prompt and ``max_tokens``, less what compaction dropped) in blocks, less the
    ``pages_held`` (none for a waiting or preempted request, which recomputes from its start).
    A request whose ``max_tokens`` cannot be read counts as needing more than any pool holds."""
    max_tokens = getattr(request, "max_tokens", None)
    if max_tokens is None:
        return UNKNOWN_PAGES
    dropped = int(getattr(request, DROPPED_ATTRIBUTE, 0) or 0) if pages_held else 0
    full_tokens = int(request.num_prompt_tokens) + int(max_tokens) - dropped
    return max(0, -(-full_tokens // block_size) - pages_held)


def room_for_all(free_blocks: int, running: Iterable[Request], waiting: RequestQueue,
                 held: Mapping[str, Sequence[KVBlock]], block_size: int) -> bool:
    """Whether ``free_blocks`` hold every running request to its full length and every waiting one
    whole (:func:`~growpage.core.step_control.holds_everyone`): then no compression can buy a
    preemption avoided or a wider batch until another request arrives. Conservative: a request
    that stops before ``max_tokens``, or shares prefix blocks, is counted at its worst. A queue
    longer than the free blocks is answered without reading it (each waiting request needs one at
    least; vLLM's priority queue copies its heap to iterate)."""
    if len(waiting) > free_blocks:
        return False

    def needed() -> Iterator[int]:
        for request in itertools.chain(running, waiting):
            yield pages_to_finish(request, len(held.get(request.request_id, ())), block_size)

    return holds_everyone(free_blocks, needed())
