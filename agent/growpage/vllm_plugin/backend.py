"""vLLM's attention backends with GrowPage's observer attached.

The plugin points a backend's name (``CPU_ATTN`` here; ``FLASH_ATTN``, ``FLASHINFER``,
``TRITON_ATTN`` on CUDA) at a subclass whose impl
calls vLLM's own ``do_kv_cache_update`` and ``forward`` first, unchanged, and only then reads:
outputs are the kernel's, bit for bit. The per-process observer is built lazily from the
``VllmConfig`` current while the model is constructed; with ``mode=off`` there is none and the impl
costs one attribute test per call.
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import TYPE_CHECKING

import torch

from growpage.vllm_plugin.support import QUANTIZED_KV_CACHE, REMEDIES
from growpage.vllm_plugin.worker_hooks import observer_for

if TYPE_CHECKING:
    from growpage.vllm_plugin.vllm_types import AttentionBackend

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format


QUANTIZED_KV_DTYPES = ("fp8", "nvfp4", "int8", "int4")  # stored scaled: keys cannot be read as they are


def stores_quantized_kv(impl: object) -> bool:
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

    num_heads: int
    num_kv_heads: int
    head_size: int
    scale: float
    attn_type: str  # vLLM's AttentionType: "decoder", "encoder", ...

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        # deferred: vLLM's config loads when vLLM builds the impl, not when this module loads
        from vllm.config import get_current_vllm_config

        self._growpage = observer_for(get_current_vllm_config())
        # fixed for the impl's life: checked once, not on every forward
        quantized = stores_quantized_kv(self)
        self._growpage_reads = self.attn_type == "decoder" and not quantized
        if quantized and self._growpage is not None and self.attn_type == "decoder":
            # never silent: a cache GrowPage cannot read turns observation (and compaction) off, visibly
            self._growpage.disable(QUANTIZED_KV_CACHE, f"the KV cache stores {getattr(self, 'kv_cache_dtype', '?')}; "
                                                       f"{REMEDIES[QUANTIZED_KV_CACHE]}")

    def do_kv_cache_update(self, layer: object, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)  # type: ignore[misc]
        observer = self._growpage
        if observer is not None and observer.wants_layer(getattr(layer, "layer_name", "")):
            observer.guarded("layout detection", observer.note_kv_write, kv_cache, key, slot_mapping,
                             functools.partial(super().do_kv_cache_update, layer),  # type: ignore[misc]
                             num_kv_heads=self.num_kv_heads, block_size=int(kv_cache.shape[2]),
                             head_dim=self.head_size)

    def forward(self, layer: object, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: object, *args: object, **kwargs: object) -> torch.Tensor:
        result = super().forward(layer, query, key, value, kv_cache, attn_metadata,  # type: ignore[misc]
                                 *args, **kwargs)
        observer = self._growpage
        if (observer is not None and attn_metadata is not None and self._growpage_reads
                and observer.wants_layer(getattr(layer, "layer_name", ""))):
            with torch.no_grad():
                observer.guarded("attention observation", observer.observe_layer, self, query, kv_cache,
                                 attn_metadata)
        return result


def observed_backend(base: type[AttentionBackend], name: str) -> type:
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


def __getattr__(attribute: str) -> type:
    for module_name, class_name, ours in OBSERVED_BACKENDS.values():
        if attribute in (ours, ours.removesuffix("Backend") + "Impl"):
            base = getattr(importlib.import_module(module_name), class_name)
            backend = globals().get(ours) or observed_backend(base, ours)
            globals()[ours] = backend
            return globals()[attribute]
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
