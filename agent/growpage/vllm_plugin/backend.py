"""The CPU attention backend with GrowPage's observer attached (Stage 1).

vLLM's ``CPU_ATTN`` is overridden (on CPU a ``CUSTOM`` backend is rejected) by a subclass whose
impl calls vLLM's own ``do_kv_cache_update`` and ``forward`` first, unchanged, and only then reads:
outputs are the kernel's, bit for bit. The per-process observer is built lazily from the
``VllmConfig`` current while the model is constructed; with ``mode=off`` there is none and the impl
costs one attribute test per call.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import torch

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format



# pid -> the observer of that process (None: GrowPage is off there). Keyed by pid so a forked child
# builds its own instead of sharing its parent's exporter thread and port.
_OBSERVERS: dict[int, Any] = {}


def current_observer() -> Any:
    """This process's observer, or None (not built yet, or GrowPage off)."""
    return _OBSERVERS.get(os.getpid())


def _build_observer(vllm_config: Any) -> Any:
    from growpage.config import Mode
    from growpage.vllm_plugin.observer import VllmObserver
    from growpage.vllm_plugin.runner_hooks import install_runner_hooks
    from growpage.vllm_plugin.settings import settings_from_vllm_config
    from growpage.vllm_plugin.versions import check_vllm_version

    config, settings = settings_from_vllm_config(vllm_config)
    if config.mode is Mode.OFF:
        logger.info("growpage: mode=off; attention is not observed in pid %d", os.getpid())
        return None
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        if get_tensor_model_parallel_rank() != 0:
            return None  # rank 0 samples heads for everyone; ranks see the same requests
    except Exception:  # no parallel state (tests): a single worker
        pass
    model_config = vllm_config.model_config
    observer = VllmObserver(
        config, settings, num_layers=model_config.get_num_layers(vllm_config.parallel_config),
        max_requests=vllm_config.scheduler_config.max_num_seqs,
        model=model_config.served_model_name or model_config.model,
        engine_version=check_vllm_version())
    install_runner_hooks()
    logger.info("growpage: mode=%s, observing layers %s in pid %d", config.mode.value,
                sorted(observer.observed_layers), os.getpid())
    return observer


def observer_for(vllm_config: Any) -> Any:
    """The observer of this process, built on first call (config errors fail start-up loudly)."""
    pid = os.getpid()
    if pid not in _OBSERVERS:
        _OBSERVERS[pid] = _build_observer(vllm_config)
    return _OBSERVERS[pid]


from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl  # noqa: E402


class GrowPageCPUAttentionImpl(CPUAttentionBackendImpl):
    """vLLM's CPU attention, then GrowPage's read-only observation of the sampled layers."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from vllm.config import get_current_vllm_config

        self._growpage = observer_for(get_current_vllm_config())

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
        observer = self._growpage
        if observer is not None and observer.wants_layer(getattr(layer, "layer_name", "")):
            observer.guarded("layout detection", observer.note_kv_write, kv_cache, key, slot_mapping,
                             functools.partial(super().do_kv_cache_update, layer),
                             num_kv_heads=self.num_kv_heads, block_size=int(kv_cache.shape[2]),
                             head_dim=self.head_size)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None) -> torch.Tensor:
        result = super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                 output_scale, output_block_scale)
        observer = self._growpage
        if (observer is not None and attn_metadata is not None and not self.is_fp8_kv_cache
                and self.attn_type == "decoder" and observer.wants_layer(getattr(layer, "layer_name", ""))):
            with torch.no_grad():
                observer.guarded("attention observation", observer.observe_layer, self, query, kv_cache,
                                 attn_metadata)
        return result


class GrowPageCPUAttentionBackend(CPUAttentionBackend):
    """``CPU_ATTN`` with :class:`GrowPageCPUAttentionImpl` (the name stays ``CPU_ATTN``)."""

    @staticmethod
    def get_impl_cls() -> type[GrowPageCPUAttentionImpl]:
        return GrowPageCPUAttentionImpl
