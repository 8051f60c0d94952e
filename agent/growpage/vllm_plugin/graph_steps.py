"""Observation steps that do not replay a full CUDA graph.

Under vLLM's default CUDA-graph mode on GPU, ``FULL_AND_PIECEWISE`` (and under
``FULL_DECODE_ONLY``), a batch of decodes replays a full graph: the attention kernels run without
any Python, so the observer, which reads each observed layer after vLLM's kernel, sees nothing. Only
steps with a prefill would be observed, while the observer reported itself active.

So the step the observer is due to watch (one in ``observe_every_steps``) is dispatched without its
full graph: vLLM's own dispatcher is asked again with ``FULL`` excluded, which gives the piecewise
graph of the same size where one was captured (attention runs eagerly between the graphed pieces,
the rest of the model still replays) and eager execution otherwise. Every other step keeps the
graph vLLM chose. The cost is the difference between a piecewise and a full replay on one step in N:
the launch of each layer's attention and of the graph pieces around it; it is not measured here
(the CPU build captures no CUDA graphs), and ``growpage_vllm_observed_steps_total`` against
``growpage_vllm_steps_total`` shows the share observed in production.

One seam per model runner, the same rule in each:

- V1: ``CudagraphDispatcher.dispatch`` (``invalid_modes`` gains ``FULL``);
- V2: ``CudaGraphManager.dispatch``, whose candidates cannot exclude a mode: a full descriptor is
  swapped for eager execution at the batch's own size.

A wrapper changes nothing outside a due step (capture, profiling and warm-up run outside any step)
and its own faults fall back to vLLM's choice.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING

from growpage.vllm_plugin.patching import WrapTarget, is_wrapped, wrap_methods

if TYPE_CHECKING:  # for annotations only: vLLM's are imported where they are used, the observer is the caller's
    from typing import TypeAlias, Unpack

    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

    from growpage.vllm_plugin.observer import VllmObserver
    from growpage.vllm_plugin.vllm_types import CudagraphDispatchKeywords

    # ``observer_of``: the current process's observer (None: none, or GrowPage off there).
    ObserverOf: TypeAlias = Callable[[], VllmObserver | None]

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format


def _due(observer_of: ObserverOf) -> bool:
    """Whether the current step must run attention eagerly (its faults: no, vLLM decides)."""
    try:
        observer = observer_of()
        return observer is not None and bool(observer.wants_eager_step)
    except Exception:
        logger.debug("growpage: cannot tell whether this step is observed; vLLM's graph choice stands",
                     exc_info=True)
        return False


def without_full(invalid_modes: AbstractSet[CUDAGraphMode] | None, valid_modes: AbstractSet[CUDAGraphMode] | None,
                 full: CUDAGraphMode) -> AbstractSet[CUDAGraphMode] | None:
    """``invalid_modes`` plus ``full``, unless that would leave no allowed mode (a mode agreed
    across data-parallel ranks, ``valid_modes == {FULL}``, stands)."""
    if valid_modes is not None and set(valid_modes) <= {full}:
        return invalid_modes
    return set(invalid_modes or ()) | {full}


def _wrap_v1_dispatch(original: Callable[..., object], observer_of: ObserverOf) -> Callable[..., object]:
    # deferred: vLLM's modules load when the hooks install, not with the plugin's modules
    from vllm.config import CUDAGraphMode

    @functools.wraps(original)
    def dispatch(self: object, num_tokens: int, *args: object, **kwargs: Unpack[CudagraphDispatchKeywords]) -> object:
        if _due(observer_of):
            kwargs["invalid_modes"] = without_full(kwargs.get("invalid_modes"), kwargs.get("valid_modes"),
                                                   CUDAGraphMode.FULL)
        return original(self, num_tokens, *args, **kwargs)

    return dispatch


def _wrap_v2_dispatch(original: Callable[..., BatchExecutionDescriptor],
                      observer_of: ObserverOf) -> Callable[..., BatchExecutionDescriptor]:
    # deferred: vLLM's modules load when the hooks install, not with the plugin's modules
    from vllm.config import CUDAGraphMode

    @functools.wraps(original)
    def dispatch(self: object, num_reqs: int, num_tokens: int, *args: object,
                 **kwargs: object) -> BatchExecutionDescriptor:
        descriptor = original(self, num_reqs, num_tokens, *args, **kwargs)
        if getattr(descriptor, "cg_mode", None) == CUDAGraphMode.FULL and _due(observer_of):
            return dataclasses.replace(descriptor, cg_mode=CUDAGraphMode.NONE, num_tokens=num_tokens,
                                       num_reqs=num_reqs, uniform_token_count=None, max_query_len=None)
        return descriptor

    return dispatch


def install(observer_of: ObserverOf) -> list[str]:
    """Wrap each runner's dispatcher that this vLLM build has; ``observer_of()`` gives the current
    process's observer. Returns what was wrapped (qualified names)."""
    targets: list[WrapTarget] = []
    try:
        # deferred: vLLM's modules load when the hooks install, not with the plugin's modules
        from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

        targets.append((CudagraphDispatcher, "dispatch", functools.partial(_wrap_v1_dispatch, observer_of=observer_of)))
    except Exception:
        logger.debug("growpage: vLLM's V1 graph dispatcher is not importable here", exc_info=True)
    try:
        # deferred: vLLM's modules load when the hooks install, not with the plugin's modules
        from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

        targets.append((CudaGraphManager, "dispatch", functools.partial(_wrap_v2_dispatch, observer_of=observer_of)))
    except Exception:
        logger.debug("growpage: Model Runner V2's graph manager is not importable here", exc_info=True)
    if not targets:  # what GrowPageObservationStale's runbook looks for in the pod's log
        logger.warning("growpage: cannot wrap vLLM's CUDA-graph dispatcher; under full CUDA graphs decode steps "
                       "replay unobserved (start vLLM with cudagraph_mode PIECEWISE to observe them)")
    targets = [target for target in targets if not is_wrapped(getattr(target[0], target[1]))]
    wrap_methods(targets)
    return [f"{cls.__module__}.{cls.__qualname__}.{name}" for cls, name, _ in targets]

