"""What crosses between vLLM's scheduler (EngineCore) and its workers, in one place both sides import.

vLLM pickles ``SchedulerOutput`` to the workers and ``ModelRunnerOutput`` back, extra attributes
included, so GrowPage rides on them instead of opening a channel of its own:

- scheduler -> worker, ``SchedulerOutput.growpage``: a :class:`StepPayload` (the compaction plans
  of this step and every compacted request's ``dropped``, with the version that wrote them);
- worker -> scheduler, ``ModelRunnerOutput.growpage_report``: a :class:`WorkerReport` (summary
  readings, whether the worker can move tokens, its observer's state and counts since the last
  report). With tensor parallelism the output of the output rank (rank 0) is the one returned.

Also here: the attribute GrowPage sets on vLLM's ``Request`` and the enforce log used by tests and
benchmarks. This module imports neither vLLM nor torch.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

logger = logging.getLogger("vllm.growpage")

PLUGIN_COMPONENT = "plugin"  # growpage_agent_errors_total{component=...} for faults either side catches
DROPPED_ATTRIBUTE = "growpage_dropped"  # on vLLM's Request: tokens evicted (physical = logical - this)
PAYLOAD_ATTRIBUTE = "growpage"  # on SchedulerOutput: the step's payload for the workers
REPORT_ATTRIBUTE = "growpage_report"  # on ModelRunnerOutput: the worker's report to the scheduler
ENFORCE_LOG_ENV = "GROWPAGE_VLLM_ENFORCE_LOG"  # tests/bench: JSON lines of per-request block peaks


@dataclasses.dataclass(frozen=True)
class CompactionPlan:
    """What the worker does for one request before this step's forward.

    Attributes:
        physical_tokens: tokens in the request's blocks before the compaction.
        keep_tokens: tokens that survive (slots ``[0, keep_tokens)`` afterwards).
        logical_length: the request's ``num_computed_tokens`` (for the recent window).
        shared_prefix_tokens: leading tokens in shared blocks (kept in place).
        dropped: the request's evicted tokens after this compaction.
        prompt_tokens: the request's prompt length (logical positions past it were generated).
    """

    physical_tokens: int
    keep_tokens: int
    logical_length: int
    shared_prefix_tokens: int
    dropped: int
    prompt_tokens: int = 0


PAYLOAD_VERSION = 1  # raise when StepPayload or CompactionPlan change meaning


@dataclasses.dataclass(frozen=True)
class StepPayload:
    """What the scheduler sends the workers with one step (``SchedulerOutput.growpage``).

    Attributes:
        plans: ``{request_id: plan}``: the compactions the workers make before this step's forward.
        dropped: ``{request_id: tokens}``: every compacted running request's evicted tokens
            (physical = logical - dropped); a request missing here was reset (preempted, recomputed).
        version: :data:`PAYLOAD_VERSION` of the scheduler that built it; a worker of another
            version refuses it (a fault, counted) rather than misread it.
        prompts_only: nothing is compressed at this step's decode boundaries, so the workers
            observe only the steps that end a prompt (whose scores a later compaction ranks by):
            the pool holds every request at its full length, or the compression gate is idle
            (:mod:`growpage.core.compression_gate`); False from a scheduler that predates it.
            In monitor the forecast sends it (no plans), from the gate its shadows run, so
            monitor's workers observe as enforce's would.
    """

    plans: dict[str, CompactionPlan]
    dropped: dict[str, int]
    version: int = PAYLOAD_VERSION
    prompts_only: bool = False


def step_payload(plans: dict[str, CompactionPlan], dropped: dict[str, int], prompts_only: bool = False) -> StepPayload:
    """The scheduler's payload for one step (copies: the scheduler keeps editing its own tables)."""
    return StepPayload(dict(plans), dict(dropped), prompts_only=prompts_only)


@dataclasses.dataclass(frozen=True)
class WorkerReport:
    """What one worker tells the scheduler after a step (counts are since its previous report).

    Attributes:
        readings: ``{request_id: (sts_density, lts_entropy)}`` of every request observed so far.
        ready_to_compact: the worker knows the cache layout and can move tokens.
        observer_state: ``active`` or the reason the observer does nothing (``growpage_agent_active``).
        errors: faults the worker caught (``growpage_agent_errors_total{component="plugin"}``).
        steps: engine steps the worker ran with at least one tracked request.
        steps_observed: those of them whose attention was observed (a full CUDA graph replay, or
            ``observe_every_steps``, leaves steps unobserved).
        attention_tokens: ``{request_id: tokens}`` each enforced request's observed attention
            needs (only with ``attention_coverage`` > 0 and GrowPage's methods), sent with its readings.
        own_seconds: seconds of GrowPage's own work in the worker (``growpage_vllm_own_seconds_total``).
        step_seconds: seconds of the worker's steps GrowPage hooks, its own part included
            (``growpage_vllm_step_seconds_total``).
    """

    readings: dict[str, tuple[float, float]]
    ready_to_compact: bool
    observer_state: str
    errors: int = 0
    steps: int = 0
    steps_observed: int = 0
    attention_tokens: dict[str, int] = dataclasses.field(default_factory=dict)
    own_seconds: float = 0.0
    step_seconds: float = 0.0


def enforce_log_path() -> str | None:
    """Where ``$GROWPAGE_VLLM_ENFORCE_LOG`` asks for the enforce log (None: unset or empty)."""
    return os.environ.get(ENFORCE_LOG_ENV) or None


def append_enforce_log(path: str | None, record: dict) -> None:
    """One JSON line in ``$GROWPAGE_VLLM_ENFORCE_LOG`` (tests and benchmarks; no-op when unset)."""
    append_log_line(path, json.dumps(record))


def append_log_line(path: str | None, line: str) -> None:
    """One line in a log file that tests and benchmarks name by environment (no-op when ``path`` is
    unset); a write that fails only warns, since serving must not depend on it."""
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
    except OSError:
        logger.warning("growpage: cannot write %s", path)
