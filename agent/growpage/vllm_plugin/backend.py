"""vLLM's attention backends with GrowPage's observer attached (Stage 1).

The plugin points a backend's name (``CPU_ATTN`` here; ``FLASH_ATTN``, ``FLASHINFER``,
``TRITON_ATTN`` on CUDA, see :mod:`~growpage.vllm_plugin.gpu_backends`) at a subclass whose impl
calls vLLM's own ``do_kv_cache_update`` and ``forward`` first, unchanged, and only then reads:
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
    from growpage.vllm_plugin.support import REMEDIES, cudagraph_conflict
    from growpage.vllm_plugin.versions import check_vllm_version

    config, settings = settings_from_vllm_config(vllm_config)
    if config.mode is Mode.OFF:
        logger.info("growpage: mode=off; attention is not observed in pid %d", os.getpid())
        return None
    rank = 0
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        rank = get_tensor_model_parallel_rank()
    except Exception:  # no parallel state (tests): a single worker
        pass
    model_config = vllm_config.model_config
    observer = VllmObserver(
        config, settings, num_layers=model_config.get_num_layers(vllm_config.parallel_config),
        max_requests=vllm_config.scheduler_config.max_num_seqs,
        model=model_config.served_model_name or model_config.model,
        engine_version=check_vllm_version(), rank=rank)
    install_runner_hooks()
    conflict = cudagraph_conflict(getattr(vllm_config, "compilation_config", None))
    if conflict is not None:
        observer.disable(conflict, f"decode attention replays from full CUDA graphs, which run no Python; "
                                   f"to observe, {REMEDIES[conflict]}")
    logger.info("growpage: mode=%s, observing layers %s in pid %d", config.mode.value,
                sorted(observer.observed_layers), os.getpid())
    return observer


def observer_built() -> bool:
    """Whether this process has decided on its observer (built one, or found GrowPage off)."""
    return os.getpid() in _OBSERVERS


def observer_for(vllm_config: Any) -> Any:
    """The observer of this process, built on first call (config errors fail start-up loudly)."""
    pid = os.getpid()
    if pid not in _OBSERVERS:
        _OBSERVERS[pid] = _build_observer(vllm_config)
    return _OBSERVERS[pid]


QUANTIZED_KV_DTYPES = ("fp8", "nvfp4", "int8", "int4")  # stored scaled: keys cannot be read as they are


def stores_quantized_kv(impl: Any) -> bool:
    """Whether ``impl``'s cache holds quantized K/V (the observer then stays off in that layer)."""
    if getattr(impl, "is_fp8_kv_cache", False):
        return True
    dtype = str(getattr(impl, "kv_cache_dtype", "auto")).lower()
    return any(dtype.startswith(prefix) for prefix in QUANTIZED_KV_DTYPES)


class ObservedAttentionImpl:
    """Mixin over a vLLM attention impl: the backend's own cache write and attention run first,
    unchanged, then GrowPage reads (outputs are the kernel's, bit for bit).

    The same three hooks serve every backend whose logical per-layer cache is
    ``[blocks, kv_heads, slots, content]`` (all of vLLM's paged backends since the KV-cache layout
    RFC): the cache write teaches the observer the layout (:mod:`~growpage.vllm_plugin.keys`), and
    after ``forward`` the observer reads the newest queries against the keys gathered from the cache.
    """

    num_kv_heads: int
    head_size: int
    attn_type: Any

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from vllm.config import get_current_vllm_config

        self._growpage = observer_for(get_current_vllm_config())
        # fixed for the impl's life: checked once, not on every forward
        self._growpage_reads = self.attn_type == "decoder" and not stores_quantized_kv(self)

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)  # type: ignore[misc]
        observer = self._growpage
        if observer is not None and observer.wants_layer(getattr(layer, "layer_name", "")):
            observer.guarded("layout detection", observer.note_kv_write, kv_cache, key, slot_mapping,
                             functools.partial(super().do_kv_cache_update, layer),  # type: ignore[misc]
                             num_kv_heads=self.num_kv_heads, block_size=int(kv_cache.shape[2]),
                             head_dim=self.head_size)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs) -> torch.Tensor:
        result = super().forward(layer, query, key, value, kv_cache, attn_metadata,  # type: ignore[misc]
                                 *args, **kwargs)
        observer = self._growpage
        if (observer is not None and attn_metadata is not None and self._growpage_reads
                and observer.wants_layer(getattr(layer, "layer_name", ""))):
            with torch.no_grad():
                observer.guarded("attention observation", observer.observe_layer, self, query, kv_cache,
                                 attn_metadata)
        return result


def observed_backend(base: type, name: str) -> type:
    """``base`` (a vLLM attention backend class) whose impl is wrapped by :class:`ObservedAttentionImpl`.

    The subclass keeps ``base``'s name, metadata builder, cache layouts and capabilities, so vLLM
    selects and drives it exactly as it would ``base``. Both classes are named after ``name``
    (``...Backend`` and ``...Impl``) and are attributes of this module, so they pickle by name.
    """
    base_impl = base.get_impl_cls()
    impl_name = name.removesuffix("Backend") + "Impl"
    impl = type(impl_name, (ObservedAttentionImpl, base_impl),
                {"__module__": __name__, "__doc__": f"{base_impl.__name__}, then GrowPage's observation."})
    backend = type(name, (base,), {"__module__": __name__, "get_impl_cls": staticmethod(lambda: impl),
                                   "__doc__": f"{base.__name__} with GrowPage's observer (same name, same kernels)."})
    globals()[impl_name] = impl
    return backend


# vLLM backend name -> (vLLM's module, its backend class, GrowPage's subclass). Each subclass is built
# on first access (module ``__getattr__``), so a build without a backend's library (FlashInfer on a
# machine without it, the CUDA backends in the CPU build) imports this module all the same.
OBSERVED_BACKENDS: dict[str, tuple[str, str, str]] = {
    "CPU_ATTN": ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackend", "GrowPageCPUAttentionBackend"),
    "FLASH_ATTN": ("vllm.v1.attention.backends.flash_attn", "FlashAttentionBackend",
                   "GrowPageFlashAttentionBackend"),
    "FLASHINFER": ("vllm.v1.attention.backends.flashinfer", "FlashInferBackend", "GrowPageFlashInferBackend"),
    "TRITON_ATTN": ("vllm.v1.attention.backends.triton_attn", "TritonAttentionBackend",
                    "GrowPageTritonAttentionBackend"),
}
CUDA_BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")


def class_path(backend_name: str) -> str:
    """The qualified name vLLM's registry resolves for ``backend_name``'s observed subclass."""
    return f"{__name__}.{OBSERVED_BACKENDS[backend_name][2]}"


def __getattr__(attribute: str) -> Any:
    import importlib

    for module_name, class_name, ours in OBSERVED_BACKENDS.values():
        if attribute in (ours, ours.removesuffix("Backend") + "Impl"):
            base = getattr(importlib.import_module(module_name), class_name)
            backend = globals().get(ours) or observed_backend(base, ours)
            globals()[ours] = backend
            return globals()[attribute]
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
