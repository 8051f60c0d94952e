"""The model-runner hook: one wrapper around ``GPUModelRunner.execute_model``.

``CPUModelRunner`` inherits ``execute_model`` from ``GPUModelRunner``; wrapping it on the class (at
most once per process, when the first observer is built) lets the observer see each step's
``SchedulerOutput`` (new, finished, preempted requests) and keep a handle on the runner, whose
``input_batch.req_ids`` maps attention rows to request ids during the forward. The wrapper never
changes arguments or results; its own faults are counted and swallowed.
"""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format

_WRAPPED_ATTRIBUTE = "__growpage_wrapped__"


def install_runner_hooks() -> bool:
    """Wrap ``GPUModelRunner.execute_model`` once. Returns False when it already was."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner.execute_model
    if getattr(original, _WRAPPED_ATTRIBUTE, False):
        return False

    @functools.wraps(original)
    def execute_model(self, scheduler_output, *args, **kwargs):
        from growpage.vllm_plugin.backend import current_observer

        observer = current_observer()
        if observer is not None:
            observer.guarded("step start", observer.begin_step, self, scheduler_output)
        try:
            return original(self, scheduler_output, *args, **kwargs)
        finally:
            if observer is not None:
                observer.guarded("step end", observer.end_step)

    setattr(execute_model, _WRAPPED_ATTRIBUTE, True)
    GPUModelRunner.execute_model = execute_model
    return True
