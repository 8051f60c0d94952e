"""The worker hooks: each worker's observer, and where it meets the worker and its model runner.

Runner-independent (the worker drives both of vLLM's runners through the same two methods):

- ``Worker.execute_model``: the observer's step (requests in and out; in ``enforce`` the
  scheduler's compaction plans, before the runner updates its states) around the runner's forward;
- ``Worker.sample_tokens``: the observer's :class:`~growpage.vllm_plugin.wire.WorkerReport` rides
  back to the scheduler on the step's ``ModelRunnerOutput`` (with async scheduling, on the output
  the async wrapper resolves to).

Runner-specific, one seam each (:func:`~growpage.vllm_plugin.observer.batch_view` reads the batch):

- V1 ``GPUModelRunner._prepare_inputs`` (the CPU runner inherits it): in ``enforce``, physical
  ``seq_lens`` and ``slot_mapping`` right after the runner built them;
- V2 ``GPUModelRunner.prepare_inputs``: keeps the step's ``InputBatch`` for the observer;
- each runner's CUDA-graph dispatcher: the step the observer is due to watch does not replay a
  full graph (:mod:`~growpage.vllm_plugin.graph_steps`).

Each process builds its observer lazily from the ``VllmConfig`` current while the model is
constructed, keyed by pid so a forked child never shares its parent's. The wrappers never change
arguments or results; their own faults are counted and swallowed.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from growpage.config import Mode
from growpage.vllm_plugin import graph_steps
from growpage.vllm_plugin.patching import WrapTarget, is_wrapped, wrap_methods
from growpage.vllm_plugin.rank_faults import OUTPUT_RANK, RankFaultPublisher, board_for
from growpage.vllm_plugin.support import REMEDIES, UNSUPPORTED_BACKEND, observer_blocker
from growpage.vllm_plugin.wire import REPORT_ATTRIBUTE

if TYPE_CHECKING:  # for annotations only: vLLM's outputs and the observer are imported where they are used
    from typing import TypeAlias

    from vllm.v1.outputs import ModelRunnerOutput

    from growpage.vllm_plugin.keep_board import KeepBoard
    from growpage.vllm_plugin.observer import VllmObserver
    from growpage.vllm_plugin.vllm_types import AsyncModelRunnerOutput, ModelRunner, V2InputBatch, VllmConfig, Worker
    from growpage.vllm_plugin.wire import WorkerReport

    # What Worker.sample_tokens returns: the step's output, or (async scheduling) one resolved later.
    StepOutput: TypeAlias = ModelRunnerOutput | AsyncModelRunnerOutput | None

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format


# pid -> the observer of that process (None: GrowPage is off there).
_OBSERVERS: dict[int, VllmObserver | None] = {}


def current_observer() -> VllmObserver | None:
    """This process's observer, or None (not built yet, or GrowPage off)."""
    return _OBSERVERS.get(os.getpid())


def observer_built() -> bool:
    """Whether this process has decided on its observer (built one, or found GrowPage off)."""
    return os.getpid() in _OBSERVERS


def observer_for(vllm_config: VllmConfig) -> VllmObserver | None:
    """The observer of this process, built on first call; None when GrowPage is off here, its
    settings cannot be honoured, or the observer cannot start (vLLM then runs unobserved)."""
    pid = os.getpid()
    if pid not in _OBSERVERS:
        try:
            _OBSERVERS[pid] = _build_observer(vllm_config)
        except Exception:
            logger.exception("growpage: cannot start the observer in pid %d; vLLM runs unobserved", pid)
            _OBSERVERS[pid] = None
            _publish_start_fault(vllm_config)
    return _OBSERVERS[pid]


def _tensor_parallel_rank() -> int:
    try:
        # deferred: vLLM's modules load when a worker runs the hook, not with the plugin's modules
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # no parallel state (tests): a single worker
        return 0


def _fault_publisher(vllm_config: VllmConfig, rank: int) -> RankFaultPublisher | None:
    """Where a rank other than the output rank publishes its faults (its report never reaches the
    scheduler); None on the output rank or under one rank."""
    if rank == OUTPUT_RANK:
        return None
    try:
        board = board_for(vllm_config)
    except Exception:  # never a reason not to observe: this rank's faults then stay in its log
        logger.warning("growpage: no tensor-parallel fault board on rank %d; its faults are logged, not counted",
                       rank, exc_info=True)
        return None
    return RankFaultPublisher(board, rank) if board is not None else None


def _keep_board(vllm_config: VllmConfig, rank: int) -> KeepBoard | None:
    """Where enforce's ranks share their token rankings (one keep set for every rank); None under
    one rank, or when it cannot open (logged: each rank's own heads then choose)."""
    try:
        # deferred: the board imports torch; this module stays torch-free until a worker builds an observer
        from growpage.vllm_plugin.keep_board import keep_board_for

        return keep_board_for(vllm_config, rank)
    except Exception:  # never a reason not to observe
        logger.warning("growpage: no tensor-parallel keep board on rank %d; its own heads choose its keep sets",
                       rank, exc_info=True)
        return None


def _publish_start_fault(vllm_config: VllmConfig) -> None:
    """An observer that failed to start on a rank other than the output rank: one fault, counted."""
    try:
        publisher = _fault_publisher(vllm_config, _tensor_parallel_rank())
        if publisher is not None:
            publisher()
            publisher.board.close()
    except Exception:  # the fault is already logged; GrowPage must never take the worker down
        logger.debug("growpage: cannot publish the start-up fault", exc_info=True)


def _build_observer(vllm_config: VllmConfig) -> VllmObserver | None:
    # deferred: observer and resolve import torch; this module stays torch-free until a worker builds one
    from growpage.vllm_plugin.observer import VllmObserver
    from growpage.vllm_plugin.resolve import settings_from_vllm_config

    resolved = settings_from_vllm_config(vllm_config)
    config, settings = resolved.config, resolved.settings
    if resolved.problem is not None:  # the scheduler reports it (invalid_config) and logs it, once
        logger.debug("growpage: settings cannot be honoured; attention is not observed in pid %d: %s",
                     os.getpid(), resolved.problem)
        return None
    if config.mode is Mode.OFF:
        logger.info("growpage: mode=off; attention is not observed in pid %d", os.getpid())
        return None
    rank = _tensor_parallel_rank()
    observer = VllmObserver(
        config, settings, num_layers=vllm_config.model_config.get_num_layers(vllm_config.parallel_config),
        max_requests=vllm_config.scheduler_config.max_num_seqs, rank=rank,
        publish_faults=_fault_publisher(vllm_config, rank),
        keep_board=_keep_board(vllm_config, rank) if config.mode is Mode.ENFORCE else None)
    install_worker_hooks()
    blocker = observer_blocker(getattr(vllm_config, "compilation_config", None))
    if blocker is not None:
        observer.disable(blocker, f"every step replays attention from full CUDA graphs, which run no Python; "
                                  f"to observe, {REMEDIES[blocker]}")
    logger.info("growpage: mode=%s, observing layers %s in pid %d", config.mode.value,
                sorted(observer.observed_layers), os.getpid())
    return observer


def _adopt_unobserved_worker(runner: ModelRunner) -> VllmObserver | None:
    """A worker whose attention backend is not one GrowPage wraps built no observer while the model
    loaded. Build one now, off but reporting why (``unsupported_backend``), so the agent is never
    silently inert. Faults here are swallowed: vLLM must run."""
    try:
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


def attach_report(output: StepOutput, report: WorkerReport) -> None:
    """Put ``report`` on the step's ``ModelRunnerOutput``.

    With async scheduling the runner returns a wrapper whose ``get_output()`` resolves to the output
    later (in this process, before it is sent): the report is attached to what it resolves to.
    vLLM's shared empty output is never written.
    """
    # deferred: vLLM's modules load when a worker runs the hook, not with the plugin's modules
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

    if output is None or output is EMPTY_MODEL_RUNNER_OUTPUT:
        return
    if isinstance(output, ModelRunnerOutput) or not callable(getattr(output, "get_output", None)):
        setattr(output, REPORT_ATTRIBUTE, report)
        return
    resolve = output.get_output

    def get_output() -> object:
        resolved = resolve()
        if resolved is not None and resolved is not EMPTY_MODEL_RUNNER_OUTPUT:
            setattr(resolved, REPORT_ATTRIBUTE, report)
        return resolved

    output.get_output = get_output


def install_worker_hooks() -> bool:
    """Wrap the worker's and the runners' methods once. Returns False when they already were."""
    # deferred: vLLM's modules load when the hooks install, not with the plugin's modules
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker

    if is_wrapped(Worker.execute_model):
        return False
    targets: list[WrapTarget] = [
        (Worker, "execute_model", _wrap_execute), (Worker, "sample_tokens", _wrap_sample),
        (GPUModelRunner, "_prepare_inputs", _wrap_v1_prepare)]
    try:
        # deferred: vLLM's modules load when the hooks install, not with the plugin's modules
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner as ModelRunnerV2

        targets.append((ModelRunnerV2, "prepare_inputs", _wrap_v2_prepare))
    except Exception:  # a build where V2 cannot even be imported cannot run it either
        logger.debug("growpage: Model Runner V2 is not importable here; only V1 is hooked", exc_info=True)
    wrap_methods(targets)
    graph_steps.install(current_observer)  # the observed step never replays a full CUDA graph
    return True


# Each wrapper below calls vLLM's method with the arguments vLLM passed and hands its result back as it
# came: those it does not read are ``object``, the original and the wrapper ``Callable[..., object]``.
def _wrap_execute(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def execute_model(self: Worker, scheduler_output: object, *args: object, **kwargs: object) -> object:
        runner = self.model_runner
        observer = current_observer()
        if observer is None and not observer_built():
            observer = _adopt_unobserved_worker(runner)
        if observer is None:
            return original(self, scheduler_output, *args, **kwargs)
        with observer.own_time.step():
            observer.guarded("step start", observer.begin_step, runner, scheduler_output)
            if observer.compactor is not None:
                observer.guarded("compaction", observer.begin_compaction, runner, scheduler_output)
            try:
                return original(self, scheduler_output, *args, **kwargs)
            finally:
                observer.guarded("step end", observer.end_step)

    return execute_model


def _wrap_sample(original: Callable[..., StepOutput]) -> Callable[..., StepOutput]:
    @functools.wraps(original)
    def sample_tokens(self: object, *args: object, **kwargs: object) -> StepOutput:
        observer = current_observer()
        if observer is None:
            return original(self, *args, **kwargs)
        with observer.own_time.step():
            output = original(self, *args, **kwargs)
            observer.guarded("report", lambda: attach_report(output, observer.take_report()))
        return output

    return sample_tokens


def _wrap_v1_prepare(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def _prepare_inputs(self: ModelRunner, *args: object, **kwargs: object) -> object:
        result = original(self, *args, **kwargs)
        observer = current_observer()
        if observer is not None and observer.compactor is not None:
            observer.guarded("physical inputs", observer.adjust_inputs, self)
        return result

    return _prepare_inputs


def _wrap_v2_prepare(original: Callable[..., V2InputBatch]) -> Callable[..., V2InputBatch]:
    @functools.wraps(original)
    def prepare_inputs(self: ModelRunner, *args: object, **kwargs: object) -> V2InputBatch:
        # deferred: the observer imports torch; this module stays torch-free until a worker steps
        from growpage.vllm_plugin.observer import remember_v2_batch

        input_batch = original(self, *args, **kwargs)
        if current_observer() is not None:
            remember_v2_batch(self, input_batch)
        return input_batch

    return prepare_inputs
