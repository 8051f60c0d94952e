"""The model-runner hooks: ``execute_model``, ``_prepare_inputs`` and ``sample_tokens``.

``CPUModelRunner`` inherits all three from ``GPUModelRunner``; wrapping them on the class (at most
once per process, when the first observer is built) lets the observer

- see each step's ``SchedulerOutput`` (new, finished, preempted requests) and keep a handle on the
  runner, whose ``input_batch.req_ids`` maps attention rows to request ids during the forward;
- (enforce) apply the scheduler's compaction plans before ``_update_states`` appends this step's
  blocks, and make ``seq_lens``/``slot_mapping`` physical right after ``_prepare_inputs``;
- (enforce) hand its summary readings back to the scheduler on ``ModelRunnerOutput``.

The wrappers never change arguments; their own faults are counted and swallowed.
"""

from __future__ import annotations

import functools
import logging

from growpage.vllm_plugin.enforcer import READINGS_ATTRIBUTE, READY_ATTRIBUTE

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format

_WRAPPED_ATTRIBUTE = "__growpage_wrapped__"


def _adopt_unobserved_worker(runner) -> object | None:
    """A worker whose attention backend is not one GrowPage wraps built no observer while the model
    loaded. Build one now, off but exporting why (``unsupported_backend``), so the agent is never
    silently inert. Faults here are swallowed: vLLM must run."""
    try:
        from growpage.vllm_plugin.backend import observer_for
        from growpage.vllm_plugin.support import REMEDIES, UNSUPPORTED_BACKEND

        observer = observer_for(runner.vllm_config)
        if observer is not None:
            backends = sorted({group.backend.get_name() for groups in getattr(runner, "attn_groups", ())
                               for group in groups if hasattr(getattr(group, "backend", None), "get_name")})
            observer.disable(UNSUPPORTED_BACKEND, f"vLLM runs attention backend(s) {backends or 'unknown'}, "
                                                  f"which GrowPage does not wrap; {REMEDIES[UNSUPPORTED_BACKEND]}")
        return observer
    except Exception:
        logger.exception("growpage: cannot start the observer of an unobserved worker; vLLM carries on")
        return None


def install_runner_hooks() -> bool:
    """Wrap the runner's methods once. Returns False when they already were."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner.execute_model
    if getattr(original, _WRAPPED_ATTRIBUTE, False):
        return False
    original_prepare = GPUModelRunner._prepare_inputs
    original_sample = GPUModelRunner.sample_tokens

    @functools.wraps(original)
    def execute_model(self, scheduler_output, *args, **kwargs):
        from growpage.vllm_plugin.backend import current_observer, observer_built

        observer = current_observer()
        if observer is None and not observer_built():
            observer = _adopt_unobserved_worker(self)
        if observer is not None:
            observer.guarded("step start", observer.begin_step, self, scheduler_output)
            if observer.compactor is not None:
                observer.guarded("compaction", observer.begin_compaction, self, scheduler_output)
        try:
            return original(self, scheduler_output, *args, **kwargs)
        finally:
            if observer is not None:
                observer.guarded("step end", observer.end_step)

    @functools.wraps(original_prepare)
    def _prepare_inputs(self, *args, **kwargs):
        result = original_prepare(self, *args, **kwargs)
        from growpage.vllm_plugin.backend import current_observer

        observer = current_observer()
        if observer is not None and observer.compactor is not None:
            observer.guarded("physical inputs", observer.adjust_inputs, self)
        return result

    @functools.wraps(original_sample)
    def sample_tokens(self, *args, **kwargs):
        output = original_sample(self, *args, **kwargs)
        from growpage.vllm_plugin.backend import current_observer

        observer = current_observer()
        if observer is not None and observer.compactor is not None and output is not None:
            try:
                setattr(output, READINGS_ATTRIBUTE, observer.take_readings())
                setattr(output, READY_ATTRIBUTE, observer.ready_to_compact)
            except Exception:
                observer.fault("readings")
        return output

    for wrapper in (execute_model, _prepare_inputs, sample_tokens):
        setattr(wrapper, _WRAPPED_ATTRIBUTE, True)
    GPUModelRunner.execute_model = execute_model
    GPUModelRunner._prepare_inputs = _prepare_inputs
    GPUModelRunner.sample_tokens = sample_tokens
    return True
