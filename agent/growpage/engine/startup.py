"""Start-up checks of a serving configuration against the pool, the model and the machine.

``gpctl serve`` runs :func:`check_serving` after reading the model's geometry (``config.json``,
no weights) and before allocating anything, so a configuration that could only fail later (every
request refused, a request silently cut short, an allocation that cannot succeed) stops the
server with one line and exit 2. The engine itself stays permissive: benchmarks and tests build
deliberately tight pools.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from growpage.config import GrowPageConfig
from growpage.errors import ConfigError

KV_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclasses.dataclass(frozen=True)
class PoolPlan:
    """What the KV pool will be.

    Attributes:
        page_bytes: bytes of one page (every layer's K and V for ``block_size`` tokens).
        num_pages: pages in the pool.
        max_model_len: the context one request may use.
    """

    page_bytes: int
    num_pages: int
    max_model_len: int


def page_bytes(num_layers: int, num_kv_heads: int, head_dim: int, growpage: GrowPageConfig) -> int:
    """Bytes of one KV page at the configured dtype."""
    return num_layers * growpage.block_size * 2 * num_kv_heads * head_dim * KV_DTYPE_BYTES[growpage.kv_dtype]


def pages_for_memory(kv_cache_mib: int, one_page_bytes: int) -> int:
    """Pages that fit ``kv_cache_mib`` (0 when not even one does)."""
    return kv_cache_mib * 2**20 // one_page_bytes


def available_memory_mib(device: str) -> int | None:
    """Memory a new allocation can use on ``device`` (None when unknown)."""
    if device.startswith("cuda"):
        try:
            # deferred: gpctl serve imports this module at start-up; torch loads only to ask CUDA
            import torch

            free, _ = torch.cuda.mem_get_info(torch.device(device))
            return free // 2**20
        except Exception:
            return None
    try:
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError):
        return None
    return None


def check_serving(growpage: GrowPageConfig, *, num_layers: int, num_kv_heads: int, head_dim: int,
                  model_context: int, kv_cache_mib: int, num_pages: int | None = None,
                  max_model_len: int | None = None, available_mib: int | None = None) -> PoolPlan:
    """The pool a server would get, or one line saying why it cannot serve.

    Args:
        growpage: GrowPage's settings (block size, base pages, KV dtype).
        num_layers, num_kv_heads, head_dim, model_context: the model's geometry.
        kv_cache_mib: memory for KV pages (ignored for sizing when ``num_pages`` is set).
        num_pages: an explicit page count.
        max_model_len: the context a request may use (default: the model's).
        available_mib: memory the pool may take (None: not checked).

    Raises:
        ConfigError: the pool cannot exist on this machine, cannot hold one request of the full
            context, or is smaller than one admission grant.
    """
    context = max_model_len or model_context
    if context < 1 or context > model_context:
        raise ConfigError(f"max_model_len={context} must be in [1, {model_context}] (this model's context); "
                          f"try {model_context}")
    if growpage.block_size > context:
        raise ConfigError(f"block_size={growpage.block_size} is longer than the context ({context} tokens); "
                          "try --block-size 16")
    one_page = page_bytes(num_layers, num_kv_heads, head_dim, growpage)
    pages = num_pages if num_pages is not None else pages_for_memory(kv_cache_mib, one_page)
    pool_mib = math.ceil(pages * one_page / 2**20)
    if available_mib is not None and pool_mib > available_mib:
        raise ConfigError(f"the KV pool needs {pool_mib} MiB but only {available_mib} MiB are available; "
                          f"lower --kv-cache-mib (e.g. {max(1, available_mib // 2)})")
    needed = -(-context // growpage.block_size)
    if pages < needed:
        fits = pages * growpage.block_size
        need_mib = math.ceil(needed * one_page / 2**20)
        raise ConfigError(f"the KV pool ({pages} pages of {growpage.block_size} tokens) cannot hold one request "
                          f"of the full context ({context} tokens), which would be cut short; raise "
                          f"--kv-cache-mib to at least {need_mib} or lower --max-model-len to at most {fits}")
    if growpage.base_pages > pages:
        raise ConfigError(f"base_pages={growpage.base_pages} is larger than the KV pool ({pages} pages), so no "
                          f"request could be admitted; lower --base-pages to at most {pages} or raise --kv-cache-mib")
    return PoolPlan(page_bytes=one_page, num_pages=pages, max_model_len=context)
