"""Reading a running request's KV from vLLM's scheduler objects: its blocks, the run of them shared
through the prefix cache, and its physical length. One reading for the enforcer, the scheduler
agent and the router's headroom, so they cannot disagree on what a request holds.

Duck-typed over vLLM's ``KVCacheManager``, ``KVCacheBlock`` and ``Request`` (no vLLM import: the
tests drive it with stand-ins).
"""

from __future__ import annotations

from collections.abc import Sequence

from growpage.vllm_plugin.vllm_types import KVBlock, KVCacheManager, Request
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
