"""Growth-aware admission: start a waiting request only when the batch's KV can still fit at its end.

vLLM admits a waiting request whenever its prompt fits the free pages now. Decoding requests keep
growing, so a batch admitted on prompts alone outgrows the pool and vLLM preempts (recomputes) the
newest requests, again and again. Admission here looks ahead: each running request is projected to
the pages it must hold when it ends, each waiting request likewise, and waiting requests start in
queue order while the projected total fits the pool.

A request's tokens at its end are its tokens now plus ``output_share`` of what its ``max_tokens``
still allows. What it *must* hold then depends on who manages its KV:

- vLLM alone (a request GrowPage does not compress): every token, full KV;
- GrowPage (enforced): its floor at that length, which pressure relief can always compress it to
  (:func:`~growpage.core.step_control.floor_pages`: ``base_pages``, the protected sinks and recent
  window, and the tokens holding ``attention_coverage`` of its attention), never more than full KV.
  The attention need is projected as the share of its tokens its observed attention needs now, or,
  before it was observed, the share finished requests needed.

So admission holds only what even compression could not fit: the preemptions compression cannot
avoid. GrowPage's wider batch is kept (a GPU decodes a wide batch for the cost of a narrow one), and
under pressure relief compresses requests toward their floors rather than vLLM preempting them.

Both shares are learned from requests that finished (:class:`CompletionHistory`): a high quantile of
recent ones, so a few short answers do not over-admit. Until enough have finished, every request
may use its ``max_tokens``, and a request not observed yet is planned as needy as the neediest
running one (every token when none is observed: :func:`standing_need_share`).

Whether to look ahead at all is a property of the host, measured (:class:`StepCostFit`,
:func:`lookahead_pays`): holding a request keeps the batch narrower, which costs nothing where a
step's time grows with every request in it (an AVX2 CPU) and much where a step's fixed part
dominates (a GPU, an AVX-512 CPU); starting it costs a preemption's recompute, which is dear where
prefill costs about what decode does per token (the AVX2 CPU again) and cheap where it is batched
well. ``admission: auto`` fits a step's cost to what the engine's own steps took and looks ahead
only where a recompute costs more than the width it buys.

Pure arithmetic and small histories; the vLLM home (:mod:`growpage.vllm_plugin.admission`) reads
its scheduler into these records and carries the answer out.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence

from growpage.core.quantiles import percentile
from growpage.core.step_control import floor_pages, protected_tokens

STEP_WINDOW = 512  # engine steps a step-cost fit is made from (the newest: the host's cost now)
# warm steps before a fit is trusted: its answer has a margin of 8-10x either way on the hosts measured
# (a recompute against the width), and the prior stands meanwhile (16 cost 5 more engine steps of 300
# than 8 on the AVX-512 host's decode-heavy traces, where the prior holds and the fit admits)
MIN_FIT_STEPS = 8
# of them, steps that prefilled: one prices a token beside the decode steps that fix the intercept, once
# the engine's cold first step is left out (the vLLM home's StepMeter); a prior that holds starts must
# not wait long for it (make run's second prefill came at step 92 of a held batch)
MIN_PREFILL_STEPS = 1
# once a fit has answered it is solved again after this many more steps, not every step: its answer
# moves little from one step to the next, and solving every step took about 30 us of the scheduler
# side's 0.4 ms a step (AMX host, 24-request queue)
SOLVE_EVERY_STEPS = 8
HISTORY_REQUESTS = 64  # finished requests the shares are learned from (the newest)
MIN_FINISHED = 4  # finished requests before a learned share replaces the prior of 1
SHARE_QUANTILE = 0.9  # a high quantile: an over-admitted batch preempts, an under-admitted one only waits


@dataclasses.dataclass(frozen=True)
class KVDemand:
    """One request's KV as admission projects it.

    Attributes:
        request_id: the request.
        pages_now: pages it holds now (0 for a waiting request that holds none).
        peak_pages: pages it must hold when it ends.
    """

    request_id: str
    pages_now: int
    peak_pages: int


@dataclasses.dataclass(frozen=True)
class Compression:
    """How far GrowPage may compress one request (what its floor is made of).

    Attributes:
        base_pages: its ``base_pages``.
        sink_tokens, recent_window_tokens: the tokens no compaction removes.
        need_share: the share of its tokens its observed attention needs (``attention_coverage``);
            None: not observed yet (the learned share stands in); 0 where the method keeps no
            attention need (a fixed cap).
    """

    base_pages: int
    sink_tokens: int
    recent_window_tokens: int
    need_share: float | None = None


def full_peak_tokens(tokens_now: int, output_tokens: int, max_tokens: int, output_share: float) -> int:
    """Tokens a request will hold under full KV when it ends: its tokens now plus ``output_share``
    of the output its ``max_tokens`` still allows."""
    to_come = max(0, max_tokens - output_tokens) * output_share
    return tokens_now + math.ceil(to_come - 1e-9)


def standing_need_share(learned: float | None, running: Sequence[Compression | None]) -> float:
    """The attention-need share for requests not observed yet: the learned one; before enough
    requests finished, the largest share a running request's observed attention needs now (a
    waiting request is planned like the neediest running one); with none observed, 1 (every token)."""
    if learned is not None:
        return learned
    observed = [c.need_share for c in running if c is not None and c.need_share is not None]
    return max(observed) if observed else 1.0


def projected_demand(request_id: str, *, pages_now: int, peak_tokens: int, block_size: int,
                     compression: Compression | None = None, learned_need_share: float = 1.0) -> KVDemand:
    """A request's demand at its end: full KV's pages, or, where GrowPage compresses it, its floor
    at that length (never more than full KV's)."""
    full_pages = math.ceil(peak_tokens / block_size)
    if compression is None:
        return KVDemand(request_id, pages_now, max(pages_now, full_pages))
    share = learned_need_share if compression.need_share is None else compression.need_share
    protected = protected_tokens(peak_tokens, 0, compression.sink_tokens, compression.recent_window_tokens)
    floor = floor_pages(compression.base_pages, protected, block_size, math.ceil(share * peak_tokens - 1e-9))
    return KVDemand(request_id, pages_now, min(full_pages, floor))


def admissible(running: Sequence[KVDemand], waiting: Sequence[KVDemand], total_pages: int) -> int:
    """How many of ``waiting`` (in queue order) may start now: while the running requests' projected
    peaks and theirs fit ``total_pages``. An empty batch always takes its first request (a request
    larger than the pool is vLLM's to refuse, not admission's to starve)."""
    committed = sum(demand.peak_pages for demand in running)
    admitted = 0
    for demand in waiting:
        if committed + demand.peak_pages > total_pages and (running or admitted):
            break
        committed += demand.peak_pages
        admitted += 1
    return admitted


@dataclasses.dataclass(frozen=True)
class Shares:
    """The learned shares: ``output_share`` 1.0 until :data:`MIN_FINISHED` requests finished;
    ``need_share`` None until as many observed ones did (the caller then stands in for it)."""

    output_share: float = 1.0
    need_share: float | None = None
    finished: int = 0
    output_tokens: float | None = None  # mean tokens the newest finished requests generated (None: none yet)


@dataclasses.dataclass(frozen=True)
class StepCosts:
    """What one engine step costs, fitted: ``fixed_s + per_request_s * requests + per_token_s * extra``,
    where ``extra`` counts the tokens beyond one per request (a prefill's, a recompute's).

    Attributes:
        fixed_s: seconds a step takes whatever it runs (reading the weights, the step's overheads).
        per_request_s: seconds each request in the step adds (a decode token: attention, sampling).
        per_token_s: seconds each further token adds (prefill and recompute).
        steps: steps the fit was made from.
    """

    fixed_s: float
    per_request_s: float
    per_token_s: float
    steps: int


def token_share_prior(token_share: float) -> StepCosts:
    """A device's step costs before any step is timed, in units of a step's fixed part: a prefilled
    token costs ``token_share`` of it, a request in the batch nothing (holding a start is then
    priced at its dearest: the whole step it gives up)."""
    return StepCosts(fixed_s=1.0, per_request_s=0.0, per_token_s=token_share, steps=0)


# the two priors that decide without pricing: a step with no fixed part (a wider batch saves nothing,
# so a recompute always outweighs it: look ahead), and a prefilled token that costs nothing (start
# as vLLM does)
LOOK_AHEAD_PRIOR = StepCosts(fixed_s=0.0, per_request_s=0.0, per_token_s=1.0, steps=0)
ADMIT_PRIOR = token_share_prior(0.0)


class StepCostFit:
    """Least squares of step seconds on (1, requests, extra tokens) over the newest
    :data:`STEP_WINDOW` steps; :meth:`costs` is None until the steps can price a token
    (:data:`MIN_FIT_STEPS` of them, :data:`MIN_PREFILL_STEPS` prefilling).

    Steps at one batch width cannot tell a step's fixed part from its requests' part; the fit then
    takes the whole intercept as fixed (per request 0), the reading under which holding a start
    costs the most, so the answer admits. It must: a prior that looks ahead can hold the batch at
    one width for a whole run (the quick demo's 8 requests ran as two waves of 4, on the prior for
    all 128 steps, when a fit waited for a second width), and admitting is what brings the widths
    that separate the two parts.

    Runs on the scheduler's thread every step, so a step costs O(1): the normal equations' sums
    are kept as steps come and go (rebuilt once a window against drift), and solved only when read.
    """

    def __init__(self, window: int = STEP_WINDOW) -> None:
        self._steps: collections.deque[tuple[int, int, float]] = collections.deque(maxlen=window)
        self._widths: collections.Counter[int] = collections.Counter()
        self._prefills = 0
        self._sums = [0.0] * 9  # sum of x_i * x_j (i <= j, packed) and of x_i * y, x = (1, requests, extra)
        self._since_rebuild = 0
        self._solved: StepCosts | None = None
        self._since_solve = 0  # steps recorded since the fit was last solved (0: the answer is current)

    def record(self, *, requests: int, tokens: int, seconds: float) -> None:
        """One step ran ``requests`` requests and ``tokens`` tokens in all for ``seconds``."""
        if requests <= 0 or seconds <= 0 or not math.isfinite(seconds):
            return  # an empty step, or a clock that went backwards: nothing to learn
        step = (requests, max(0, tokens - requests), seconds)
        if len(self._steps) == self._steps.maxlen:
            self._account(self._steps[0], -1)
        self._steps.append(step)
        self._account(step, 1)
        self._since_rebuild += 1
        if self._since_rebuild >= (self._steps.maxlen or 1):
            self._rebuild()
        self._since_solve += 1

    def __len__(self) -> int:
        return len(self._steps)

    @property
    def short_of_steps(self) -> bool:
        """Whether fewer than :data:`MIN_FIT_STEPS` steps are in (more steps alone may let it answer)."""
        return len(self._steps) < MIN_FIT_STEPS

    @property
    def prices_a_token(self) -> bool:
        """Whether enough of its steps prefilled to price a token (a recompute's cost)."""
        return self._prefills >= MIN_PREFILL_STEPS

    def costs(self) -> StepCosts | None:
        """The fitted costs (None until the steps can price a token): solved again once
        :data:`SOLVE_EVERY_STEPS` steps came in since an answer, at every new step before one."""
        if self._since_solve and (self._solved is None or self._since_solve >= SOLVE_EVERY_STEPS):
            self._solved, self._since_solve = self._solve(), 0
        return self._solved

    def _solve(self) -> StepCosts | None:
        if self.short_of_steps or not self.prices_a_token:
            return None
        n, r, e, rr, re, ee, y, ry, ey = self._sums
        if len(self._widths) < 2:  # one width: the intercept is fixed and per-request in one (see the class)
            line = _solve2(n, e, ee, y, ey)
            if line is None:
                return None
            intercept, per_token = line
            return StepCosts(max(0.0, intercept), 0.0, max(0.0, per_token), len(self._steps))
        solved = _solve3([[n, r, e, y], [r, rr, re, ry], [e, re, ee, ey]])
        if solved is None:
            return None
        fixed, per_request, per_token = (max(0.0, value) for value in solved)  # noise below zero means none
        return StepCosts(fixed, per_request, per_token, len(self._steps))

    def _account(self, step: tuple[int, int, float], sign: int) -> None:
        requests, extra, seconds = step
        for index, value in enumerate((1.0, requests, extra, requests * requests, requests * extra, extra * extra,
                                       seconds, requests * seconds, extra * seconds)):
            self._sums[index] += sign * value
        self._widths[requests] += sign
        if self._widths[requests] <= 0:
            del self._widths[requests]
        self._prefills += sign * (extra > 0)

    def _rebuild(self) -> None:
        self._sums, self._widths, self._prefills, self._since_rebuild = [0.0] * 9, collections.Counter(), 0, 0
        for step in self._steps:
            self._account(step, 1)


def lookahead_pays(costs: StepCosts, *, width: int, output_tokens: float, recompute_tokens: float) -> bool:
    """Whether holding a waiting request that the pool cannot hold at the batch's end pays.

    Holding it keeps the batch one narrower (``width`` running) while its ``output_tokens`` would
    decode: done later, they take ``output_tokens / width`` more steps' fixed part than sharing the
    running requests' steps would (each step's per-request part is paid either way). Starting it
    costs, when the batch outgrows the pool, a preemption: about ``recompute_tokens`` prefilled again
    (its prompt and the answer so far). Hold where the recompute costs at least the width."""
    width_cost = costs.fixed_s * output_tokens / max(1, width)
    recompute_cost = costs.per_token_s * recompute_tokens
    return recompute_cost >= width_cost


def _solve2(n: float, e: float, ee: float, y: float, ey: float) -> tuple[float, float] | None:
    """Least squares of ``y`` on (1, e) from the normal equations' sums; None when ``e`` never varies."""
    determinant = n * ee - e * e
    if abs(determinant) <= 1e-12 * max(n * ee, 1.0):
        return None
    return (y * ee - e * ey) / determinant, (n * ey - e * y) / determinant


def _solve3(matrix: list[list[float]]) -> tuple[float, ...] | None:
    """Solve a 3x3 system (rows ``[a, b, c, rhs]``) by Gaussian elimination with partial
    pivoting; None when singular."""
    size = 3
    scale = max(abs(matrix[i][i]) for i in range(size)) or 1.0
    for column in range(size):
        pivot = max(range(column, size), key=lambda r: abs(matrix[r][column]))
        if abs(matrix[pivot][column]) <= 1e-12 * scale:
            return None
        matrix[column], matrix[pivot] = matrix[pivot], matrix[column]
        for row in range(column + 1, size):
            factor = matrix[row][column] / matrix[column][column]
            for k in range(column, size + 1):
                matrix[row][k] -= factor * matrix[column][k]
    solution = [0.0] * size
    for row in reversed(range(size)):
        known = sum(matrix[row][k] * solution[k] for k in range(row + 1, size))
        solution[row] = (matrix[row][size] - known) / matrix[row][row]
    return tuple(solution)


class CompletionHistory:
    """What finished requests used: output against ``max_tokens``, attention need against their tokens.

    Bounded (the newest :data:`HISTORY_REQUESTS`), so the shares follow the traffic as it changes.
    """

    def __init__(self, history: int = HISTORY_REQUESTS) -> None:
        self._output: collections.deque[float] = collections.deque(maxlen=history)
        self._need: collections.deque[float] = collections.deque(maxlen=history)
        self._output_tokens: collections.deque[int] = collections.deque(maxlen=history)
        self.finished = 0
        self._shares: Shares | None = None  # read every step (twice under measured admission), changed per finish

    def record(self, *, output_tokens: int, max_tokens: int, need_share: float | None = None) -> None:
        """A request finished with ``output_tokens`` of its ``max_tokens``; one whose attention was
        observed under GrowPage also gives the share of its tokens that attention needed."""
        if max_tokens <= 0:
            return
        self.finished += 1
        self._shares = None
        self._output.append(_unit(output_tokens / max_tokens))
        self._output_tokens.append(max(0, output_tokens))
        if need_share is not None:
            self._need.append(_unit(need_share))

    def shares(self) -> Shares:
        if self._shares is None:
            need = _learned(self._need) if len(self._need) >= MIN_FINISHED else None
            mean_output = sum(self._output_tokens) / len(self._output_tokens) if self._output_tokens else None
            self._shares = Shares(_learned(self._output), need, self.finished, mean_output)
        return self._shares


def _unit(value: float) -> float:
    return min(1.0, max(0.0, value))


def _learned(samples: Sequence[float]) -> float:
    if len(samples) < MIN_FINISHED:
        return 1.0
    value = percentile(samples, SHARE_QUANTILE)
    return 1.0 if value is None else value
