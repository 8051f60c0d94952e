"""Enforce in the worker: apply the scheduler's compaction plans and keep inputs physical.

The scheduler (:mod:`~growpage.vllm_plugin.scheduler_requests`) has already truncated a compacted request's
block list and returned the tail blocks to the pool; it sends a :class:`CompactionPlan` per request
on ``SchedulerOutput.growpage``. Before ``_update_states`` appends this step's new blocks, the
worker:

1. chooses the survivors (:func:`~growpage.vllm_plugin.compaction.choose_keep`): sinks, the recent
   window, shared-prefix tokens, then the highest attention accumulated by the observer (recency
   when nothing was observed; under tensor parallelism every rank's attention, summed through the
   keep board so that every rank keeps the same tokens), one set per request or one per KV head
   (``keep_sets``; per head, optionally with a common share chosen by the request's ranking:
   ``shared_keep_fraction``), generated tokens optionally discounted by R-KV's redundancy
   (:mod:`~growpage.vllm_plugin.redundancy`);
2. moves their K and V to the front of the request's blocks in every layer (before any write of
   this step, and before a freed block can be reused: the worker runs steps in order);
3. truncates the request's block-table row and its cached ``block_ids`` like the scheduler did.

After ``_prepare_inputs`` it subtracts ``dropped`` from ``seq_lens`` and recomputes ``slot_mapping``
from ``positions - dropped`` for compacted requests; ``positions`` stay logical, so RoPE is exact.

Moves run in chunks whose transient device memory (the gathered K and V of every layer and their
indices) stays under ``max_chunk_bytes`` (the plugin's ``compaction_chunk_mib``), outside vLLM's
profiled KV budget (:mod:`~growpage.vllm_plugin.keys`, which plans the chunks).

What a failed compaction leaves (the scheduler has already cut the blocks and freed the tail, so
the worker always cuts its own the same way):

- a failure before any token moved (scores, the keep set, the redundancy term, a check): the
  request keeps its sinks (or its shared prefix) and its most recent tokens
  (:func:`~growpage.vllm_plugin.compaction.recency_keep`), moved one slot at a time, never the
  first ``keep_tokens``; only when even that cannot move (the layout is unknown, the blocks are
  missing) do the first ``keep_tokens`` stay (``first_tokens``, counted apart);
- a failure during the move: :func:`~growpage.vllm_plugin.keys.move_tokens_chunked` finishes it
  one slot at a time, so exactly the chosen tokens survive (``fallback_moves``); only a fault the
  single-slot copies hit too (a lost device) leaves the destinations undefined (``undefined``,
  logged as an error);
- a failure after the move: the chosen tokens are in place and recorded (``chosen``).

Every failed compaction is counted (``failed_compactions``, by what it kept in ``recoveries``:
``sinks_and_recent``, ``first_tokens``, ``chosen``, ``undefined``) and logged
(the first per path as a warning, every one in the enforce log), ``kept_positions`` records what
the cache holds, the request's scores are forgotten (recency ranks it until it is observed again),
and :meth:`WorkerCompactor.begin_step` raises :class:`CompactionError` once the step's other plans
are applied, which the observer counts in ``growpage_agent_errors_total{component="plugin"}``.
A step whose keep sets may differ between tensor-parallel ranks (a rank's rankings missed the
keep board's wait, or the exchange itself failed) compacts all the same, by the rankings it has,
and is counted the same way (:class:`KeepSetsNotShared`).
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from growpage.config import GrowPageConfig
from growpage.core.methods import build_method
from growpage.vllm_plugin.compaction import (
    TokenScores,
    choose_keep,
    physical_slot_mapping,
    physical_slots,
    recency_keep,
    slot_positions,
    take_slots,
)
from growpage.vllm_plugin.keep_board import KeepBoard, Ranking, Shared, positions_digest, step_key
from growpage.vllm_plugin.keys import BlockLayout, MoveOutcome, move_tokens_chunked, move_tokens_one_by_one, read_keys
from growpage.vllm_plugin.redundancy import key_redundancy, mix_redundancy
from growpage.vllm_plugin.vllm_types import CompactingRunner
from growpage.vllm_plugin.wire import (
    PAYLOAD_ATTRIBUTE,
    PAYLOAD_VERSION,
    CompactionPlan,
    StepPayload,
    append_enforce_log,
    enforce_log_path,
)

logger = logging.getLogger("vllm.growpage")  # under "vllm": shows in vLLM's log format

# what a failed compaction left (see the module docstring), the keys of WorkerCompactor.recoveries;
# UNDEFINED: the move failed past its fallbacks (a lost device), kept_positions records the intent
RECENCY, CHOSEN, TRUNCATED, UNDEFINED = "sinks_and_recent", "chosen", "first_tokens", "undefined"


class CompactionError(RuntimeError):
    """A plan the worker cannot apply (state out of step with the scheduler)."""


class _MoveFault(CompactionError):
    """The move itself raised past its own fallbacks: the destinations are undefined."""


class KeepSetsNotShared(CompactionError):
    """Tensor parallelism: some rank's rankings did not arrive (or ranked other positions), so the
    ranks' keep sets of this step may differ (their slots still agree)."""


@dataclasses.dataclass(frozen=True)
class _Ranked:
    """One planned request read and ranked on this rank (reads only: nothing has moved)."""

    positions: torch.Tensor  # [P] or [kv_heads, P]: the logical position of each physical slot
    block_row: torch.Tensor  # the blocks holding its physical tokens
    scores: torch.Tensor | None  # this rank's ranking (None: not observed, recency)
    redundancy: bool  # R-KV's term was mixed in


@dataclasses.dataclass(frozen=True)
class _Choice:
    """One compaction, chosen but not applied yet (nothing has moved)."""

    positions: torch.Tensor  # [P] or [kv_heads, P]: the logical position of each physical slot
    keep_index: torch.Tensor  # [keep] or [kv_heads, keep]: the survivors' slots, ascending
    src: torch.Tensor  # the moving survivors' cache slots ([N] or [kv_heads, N])
    dst: torch.Tensor  # where they land
    scored: int  # slots the scores covered (0: recency)
    redundancy: bool


class WorkerCompactor:
    """Per-request physical state in one worker (see the module docstring).

    With tensor parallelism every rank holds a compactor and applies the same plans to its own KV
    heads: the number of survivors and their slots are the plan's, so every rank's block table and
    ``slot_mapping`` agree; which tokens survive is ranked by every rank's heads, summed through the
    keep board (:mod:`~growpage.vllm_plugin.keep_board`), so every rank keeps the same ones.

    Args:
        config: GrowPage's config (``block_size``, ``sink_tokens``, ``recent_window_tokens``).
        rank: this worker's tensor-parallel rank (for the enforce log).
        scores: what compactions rank tokens by (:class:`~growpage.vllm_plugin.compaction.TokenScores`);
            the default sums attention (H2O); a method that observes nothing keeps the newest
            (StreamingLLM). Scores with a KV-head axis give per-head keep sets.
        redundancy_weight: R-KV's ``1 - lambda`` for the request's generated tokens (0: off); needs
            :attr:`key_caches`, which the observer fills with its observed layers' caches.
        shared_keep_fraction: with per-head scores, the share of each head's survivors kept in
            common by the request's ranking (:func:`~growpage.vllm_plugin.compaction.choose_keep`).
        max_chunk_bytes: transient device memory one chunk of a move may hold
            (``compaction_chunk_mib``); None: each move is one chunk.
        keep_board: under tensor parallelism, where the ranks share their rankings so that every
            rank keeps the same tokens (:mod:`~growpage.vllm_plugin.keep_board`); None: this
            rank's own heads choose.
    """

    def __init__(self, config: GrowPageConfig, rank: int = 0, scores: TokenScores | None = None,
                 redundancy_weight: float = 0.0, shared_keep_fraction: float = 0.0,
                 max_chunk_bytes: int | None = None, keep_board: KeepBoard | None = None):
        self.config = config
        self.rank = rank
        self.scores = scores if scores is not None else TokenScores(build_method("h2o"))
        self.redundancy_weight = redundancy_weight
        self.shared_keep_fraction = shared_keep_fraction
        self.key_caches: list[torch.Tensor] = []  # the observed layers' cache views (redundancy's keys)
        self.log_path = enforce_log_path()
        self.block_size = config.block_size
        self.dropped: dict[str, int] = {}
        self.kept_positions: dict[str, torch.Tensor] = {}
        self.max_chunk_bytes = max_chunk_bytes
        self.keep_board = keep_board
        self.compactions = 0
        self.tokens_moved = 0
        self.bytes_moved = 0
        self.move_chunks = 0  # gather-then-scatter chunks run
        self.fallback_moves = 0  # moves that finished one slot at a time (a chunk failed)
        self.tokens_copied_one_by_one = 0
        self.failed_compactions = 0
        self.recoveries: dict[str, int] = {}  # failed compactions by what they left (RECENCY, CHOSEN, TRUNCATED)

    # ---- scores (from the observer) ----------------------------------------------------------------
    def add_scores(self, request_id: str, attention: torch.Tensor, steps: int = 1) -> None:
        """Fold one observation in: ``[P]`` attention mass per physical slot (mean over heads; or
        ``[kv_heads, P]``, each KV head's), kept on the attention's device (no host copy per step);
        a request's first is its prompt's; ``steps``: decode steps it stands for (:meth:`TokenScores.add`)."""
        self.scores.add(request_id, attention, steps)

    def forget(self, request_id: str) -> None:
        self.dropped.pop(request_id, None)
        self.kept_positions.pop(request_id, None)
        self.scores.forget(request_id)

    # ---- before _update_states -----------------------------------------------------------------
    def begin_step(self, runner: CompactingRunner, scheduler_output: object, layout: BlockLayout | None) -> None:
        """Forget restarted requests, apply this step's plans, adopt the scheduler's ``dropped``."""
        payload = getattr(scheduler_output, PAYLOAD_ATTRIBUTE, None)
        restarted = set(getattr(scheduler_output, "finished_req_ids", ()) or ())
        restarted |= set(getattr(scheduler_output, "preempted_req_ids", None) or ())
        restarted |= {new.req_id for new in getattr(scheduler_output, "scheduled_new_reqs", ()) or ()}
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        restarted |= set(getattr(cached, "resumed_req_ids", None) or ())
        for request_id in restarted:
            self.forget(request_id)
        if payload is None:
            return
        if not isinstance(payload, StepPayload) or payload.version != PAYLOAD_VERSION:
            raise CompactionError(f"the scheduler's step payload is {type(payload).__name__} version "
                                  f"{getattr(payload, 'version', None)}, this worker reads version {PAYLOAD_VERSION}: "
                                  "scheduler and workers must run the same GrowPage")
        dropped = payload.dropped
        for request_id in [r for r in self.dropped if r not in dropped]:
            self.forget(request_id)  # the scheduler reset it (preempted, recomputed)
        ranked = {request_id: self._ranked(runner, request_id, plan, layout)
                  for request_id, plan in payload.plans.items()}
        shared = self._share(payload.plans, ranked)
        failed: dict[str, str] = {}
        for request_id, plan in payload.plans.items():
            failed_path = self._compact_or_recover(runner, request_id, plan, layout, ranked[request_id], shared)
            if failed_path is not None:
                failed[request_id] = failed_path
        self.dropped = {k: int(v) for k, v in dropped.items()}
        if failed:
            raise CompactionError(f"compaction failed for {failed} (request: what it kept); their blocks were "
                                  f"cut like the scheduler's")
        if isinstance(shared, Exception) or (shared is not None and (shared.late or shared.unaligned)):
            why = (repr(shared) if isinstance(shared, Exception) else
                   f"late ranks {list(shared.late)}, requests ranked over other positions {list(shared.unaligned)}")
            raise KeepSetsNotShared(f"rank {self.rank}: the ranks' keep sets of this step may differ ({why})")

    def _ranked(self, runner: CompactingRunner, request_id: str, plan: CompactionPlan,
                layout: BlockLayout | None) -> _Ranked | Exception:
        """The request read and ranked, or what failed (its compaction then recovers: nothing moved)."""
        try:
            return self._rank(runner, request_id, plan, layout)
        except Exception as error:
            return error

    def _share(self, plans: dict[str, CompactionPlan],
               ranked: dict[str, _Ranked | Exception]) -> Shared | Exception | None:
        """Every rank's rankings of this step's requests, summed (None: no board, or a method that
        ranks by recency; an exception: the exchange failed, each rank keeps its own)."""
        if self.keep_board is None or not self.scores.scored:
            return None
        # per-KV-head sets stay per head (their scores have a head axis, even at a request's first
        # compaction, where its positions are still one row)
        shareable = {request_id: r for request_id, r in ranked.items() if isinstance(r, _Ranked)
                     and r.positions.dim() == 1 and (r.scores is None or r.scores.dim() == 1)}
        try:
            digests = {request_id: positions_digest(r.positions) for request_id, r in shareable.items()}
            return self.keep_board.exchange(
                step_key(plans), {request_id: Ranking(digests[request_id], r.scores)
                                  for request_id, r in shareable.items() if r.scores is not None}, digests)
        except Exception as error:  # never a reason not to compact: this rank's own heads choose
            return error

    def _compact_or_recover(self, runner: CompactingRunner, request_id: str, plan: CompactionPlan,
                            layout: BlockLayout | None, ranked: _Ranked | Exception,
                            shared: Shared | Exception | None) -> str | None:
        """Apply one plan; on a failure, leave the request what the module docstring says.

        Returns:
            None when the compaction succeeded, else what the request kept (a ``recoveries`` key).
        """
        try:
            if isinstance(ranked, Exception):
                raise ranked
            scores = ranked.scores
            if isinstance(shared, Shared) and request_id in shared.scores:
                scores = shared.scores[request_id]
            choice = self._choose(request_id, plan, ranked, scores)
        except Exception as error:  # nothing moved yet
            return self._recover_unmoved(runner, request_id, plan, layout, error)
        try:
            self._apply(runner, request_id, plan, choice, layout)
        except Exception as error:  # the chosen tokens are in place, unless the move itself was lost
            self.kept_positions[request_id] = take_slots(choice.positions, choice.keep_index)
            return self._recovered(runner, request_id, plan, UNDEFINED if isinstance(error, _MoveFault) else CHOSEN,
                                   error)
        return None

    def _rank(self, runner: CompactingRunner, request_id: str,
              plan: CompactionPlan, layout: BlockLayout | None) -> _Ranked:
        """The request's slots and this rank's ranking of them (reads only: a failure here moved nothing)."""
        if layout is None:
            raise CompactionError("the KV cache layout is unknown; cannot move tokens")
        physical, keep = plan.physical_tokens, plan.keep_tokens
        previous = self.dropped.get(request_id, 0)
        if previous + physical - keep != plan.dropped:
            raise CompactionError(f"request {request_id}: worker dropped {previous} + {physical - keep} != "
                                  f"scheduler's {plan.dropped}")
        block_row = self._block_row(runner, request_id, physical)
        positions = slot_positions(self.kept_positions.get(request_id), physical, previous)
        scores = self.scores.ranking(request_id, positions)  # on the host: compactions are rare
        redundancy = False
        if scores is not None and self.redundancy_weight > 0 and self.key_caches:
            scores, redundancy = self._discount_redundant(scores, positions, block_row, plan, layout), True
        return _Ranked(positions, block_row, scores, redundancy)

    def _choose(self, request_id: str, plan: CompactionPlan, ranked: _Ranked,
                scores: torch.Tensor | None) -> _Choice:
        """The survivors (ranked by ``scores``: this rank's, or every rank's summed) and the slot
        moves of one plan (reads only: a failure here moved nothing)."""
        keep = plan.keep_tokens
        keep_index = choose_keep(ranked.positions, scores, keep, plan.logical_length,
                                 plan.shared_prefix_tokens, self.config.sink_tokens,
                                 self.config.recent_window_tokens, self.shared_keep_fraction, self.scores.method)
        if keep_index is None:
            raise CompactionError(f"request {request_id}: protected tokens exceed {keep}")
        src, dst = self._moves(ranked.block_row, keep_index, keep)
        return _Choice(ranked.positions, keep_index, src, dst, 0 if scores is None else int(scores.shape[-1]),
                       ranked.redundancy)

    def _block_row(self, runner: CompactingRunner, request_id: str, physical: int) -> torch.Tensor:
        """The block ids holding the request's ``physical`` tokens, in order."""
        block_ids = runner.requests[request_id].block_ids[0]
        held_blocks = -(-physical // self.block_size)
        if len(block_ids) < held_blocks:
            raise CompactionError(f"request {request_id}: {len(block_ids)} blocks for {physical} tokens")
        return torch.tensor(block_ids[:held_blocks], dtype=torch.long)

    def _moves(self, block_row: torch.Tensor, keep_index: torch.Tensor, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(src, dst)`` cache slots of the survivors that move: survivor ``j`` into physical slot
        ``j``, in order, as :func:`~growpage.vllm_plugin.keys.move_tokens_chunked` needs."""
        src = physical_slots(block_row, keep_index, self.block_size)
        dst = physical_slots(block_row, torch.arange(keep), self.block_size).expand_as(src)
        moving = src != dst
        if src.dim() == 2:  # per KV head: a slot moves where some head's survivor is elsewhere (a suffix)
            moving = moving.any(0)
            return src[:, moving], dst[:, moving]
        return src[moving], dst[moving]

    def _apply(self, runner: CompactingRunner, request_id: str, plan: CompactionPlan, choice: _Choice,
               layout: BlockLayout | None) -> None:
        """Move the survivors (in chunks), record them, then cut the request's blocks."""
        assert layout is not None  # _rank checked
        try:
            outcome = move_tokens_chunked(_unique_caches(runner), choice.src, choice.dst, layout,
                                          self.max_chunk_bytes)
        except Exception as error:
            raise _MoveFault(f"request {request_id}: the move failed past its fallbacks") from error
        self.kept_positions[request_id] = take_slots(choice.positions, choice.keep_index)
        self._count_move(outcome, int(choice.src.shape[-1]))
        self.compactions += 1
        keep, physical = plan.keep_tokens, plan.physical_tokens
        if self.log_path:  # the kept positions are a list of up to thousands: only when someone reads them
            append_enforce_log(self.log_path, {"worker_compaction": request_id, "rank": self.rank, "kept": keep,
                                               "moved": int(choice.src.shape[-1]), "physical": physical,
                                               "scored": choice.scored, "chunks": outcome.chunks,
                                               "one_by_one": outcome.tokens_copied_one_by_one,
                                               "logical": plan.logical_length,
                                               "redundancy": choice.redundancy,
                                               "kept_positions": self.kept_positions[request_id].tolist()})
        self.scores.keep(request_id, choice.keep_index, physical)
        self._truncate(runner, request_id, keep)

    def _count_move(self, outcome: MoveOutcome, tokens: int) -> None:
        self.bytes_moved += outcome.bytes_moved
        self.tokens_moved += tokens
        self.move_chunks += outcome.chunks
        self.tokens_copied_one_by_one += outcome.tokens_copied_one_by_one
        self.fallback_moves += outcome.tokens_copied_one_by_one > 0

    # ---- failed compactions (see the module docstring) -----------------------------------------------
    def _recover_unmoved(self, runner: CompactingRunner, request_id: str,
                         plan: CompactionPlan, layout: BlockLayout | None,
                         error: Exception) -> str:
        """After a failure before any move: keep sinks and recent tokens, or, when those cannot
        move, record the first ``keep_tokens`` (what the cut leaves)."""
        physical, keep = plan.physical_tokens, plan.keep_tokens
        try:
            positions = slot_positions(self.kept_positions.get(request_id), physical, self.dropped.get(request_id, 0))
        except Exception:  # the worker's own record is broken: the best left is the logical order
            positions = torch.arange(physical, dtype=torch.long)
        try:
            keep_index = self._move_recent(runner, request_id, plan, layout)
            path = RECENCY
        except Exception as second:
            logger.debug("growpage: the fallback of %s's compaction failed too: %r", request_id, second)
            keep_index, path = torch.arange(keep, dtype=torch.long), TRUNCATED
        self.kept_positions[request_id] = take_slots(positions, keep_index)
        return self._recovered(runner, request_id, plan, path, error)

    def _move_recent(self, runner: CompactingRunner, request_id: str, plan: CompactionPlan,
                     layout: BlockLayout | None) -> torch.Tensor:
        """Move the leading (sinks, shared prefix) and newest slots into place one slot at a time
        (nothing large allocated, no scores used); returns their slot indices."""
        if layout is None:
            raise CompactionError("the KV cache layout is unknown; cannot move tokens")
        physical, keep = plan.physical_tokens, plan.keep_tokens
        leading = max(self.config.sink_tokens, plan.shared_prefix_tokens)
        keep_index = recency_keep(physical, keep, leading)
        src, dst = self._moves(self._block_row(runner, request_id, physical), keep_index, keep)
        outcome = move_tokens_one_by_one(_unique_caches(runner), src, dst, layout)
        self._count_move(outcome, int(src.shape[-1]))
        return keep_index

    def _recovered(self, runner: CompactingRunner, request_id: str,
                   plan: CompactionPlan, path: str, error: Exception) -> str:
        """Count and log a failed compaction, forget its scores, and cut its blocks like the scheduler's."""
        self.failed_compactions += 1
        self.recoveries[path] = self.recoveries.get(path, 0) + 1
        if isinstance(error, _MoveFault):
            logger.error("growpage: moving %s's survivors failed past every fallback (%r): its cached K and V "
                         "are undefined", request_id, error.__cause__)
        elif self.recoveries[path] == 1:
            logger.warning("growpage: a compaction of %s failed (%r); it kept %s (further ones are counted)",
                           request_id, error, path)
        self.scores.forget(request_id)
        self._truncate(runner, request_id, plan.keep_tokens)
        if self.log_path:
            append_enforce_log(self.log_path, {"worker_compaction_failed": request_id, "rank": self.rank,
                                               "kept": path, "error": repr(error),
                                               "kept_positions": self.kept_positions[request_id].tolist()})
        return path

    def _discount_redundant(self, scores: torch.Tensor, positions: torch.Tensor, block_row: torch.Tensor,
                            plan: CompactionPlan, layout: BlockLayout) -> torch.Tensor:
        """``scores`` with the candidate generated tokens re-ranked by R-KV's mix (see
        :mod:`~growpage.vllm_plugin.redundancy`): past the prompt, before the recent window, per KV
        head when the scores are, with keys read from the observed layers (this rank's heads)."""
        physical = positions.shape[-1]
        first, last = plan.prompt_tokens, plan.logical_length - self.config.recent_window_tokens
        candidates = ((positions >= first) & (positions < last)).expand(*scores.shape[:-1], physical)
        device = self.key_caches[0].device
        device_layout = layout if layout.key_index.device == device else layout.to(device)
        heads, row = torch.arange(self.key_caches[0].shape[1], device=device), block_row.to(device)
        # [L, G, P, hd] on the cache's device; only the redundancy ([G, D]) comes back to the host
        keys = torch.stack([read_keys(cache, row, physical, heads, device_layout) for cache in self.key_caches])
        mixed = scores.clone()
        if scores.dim() == 1:
            index = candidates.nonzero().flatten()
            redundancy = key_redundancy(keys[:, :, index.to(device)]).mean(0).cpu()
            mixed[index] = mix_redundancy(scores[index], redundancy, self.redundancy_weight)
            return mixed
        for head in range(scores.shape[0]):
            index = candidates[head].nonzero().flatten()
            redundancy = key_redundancy(keys[:, head:head + 1, index.to(device)])[0].cpu()
            mixed[head, index] = mix_redundancy(scores[head, index], redundancy, self.redundancy_weight)
        return mixed

    def _truncate(self, runner: CompactingRunner, request_id: str, keep_tokens: int) -> None:
        """Cut the request's cached ``block_ids`` and block-table row to ``keep_tokens`` (as the scheduler did)."""
        keep_blocks = -(-keep_tokens // self.block_size)
        for group_block_ids in runner.requests[request_id].block_ids:
            del group_block_ids[keep_blocks:]
        row = runner.input_batch.req_id_to_index.get(request_id)
        if row is not None:
            for table in runner.input_batch.block_table.block_tables:
                table.num_blocks_per_row[row] = min(int(table.num_blocks_per_row[row]), keep_blocks)

    # ---- after _prepare_inputs -----------------------------------------------------------------
    def adjust_inputs(self, runner: CompactingRunner) -> None:
        """``seq_lens -= dropped`` and slots from ``positions - dropped`` for compacted requests."""
        if not self.dropped:
            return
        batch = runner.input_batch
        num_reqs = batch.num_reqs
        starts = runner.query_start_loc.cpu[:num_reqs + 1].tolist()
        for row, request_id in enumerate(batch.req_ids[:num_reqs]):
            dropped = self.dropped.get(request_id, 0)
            if not dropped:
                continue
            runner.seq_lens[row] -= dropped
            runner.optimistic_seq_lens_cpu[row] -= dropped
            start, end = starts[row], starts[row + 1]
            # the runner's positions for this row, from host state (reading them back from the device
            # would stall the step on a GPU): computed tokens, then this step's
            positions = int(batch.num_computed_tokens_cpu[row]) + torch.arange(end - start, dtype=torch.long)
            for table in batch.block_table.block_tables:
                num_blocks = int(table.num_blocks_per_row[row])
                block_row = table.block_table.cpu[row, :num_blocks]
                slots = physical_slot_mapping(positions, dropped, block_row, self.block_size)
                table.slot_mapping.gpu[start:end] = slots.to(table.slot_mapping.gpu.dtype).to(
                    table.slot_mapping.gpu.device)

    def physical_length(self, request_id: str, logical_length: int) -> int:
        return logical_length - self.dropped.get(request_id, 0)


def _unique_caches(runner: CompactingRunner) -> list[torch.Tensor]:
    seen: set[int] = set()
    caches = []
    for cache in runner.kv_caches:
        if isinstance(cache, torch.Tensor) and cache.data_ptr() not in seen:
            seen.add(cache.data_ptr())
            caches.append(cache)
    return caches
