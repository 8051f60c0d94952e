"""Whether enforce's decode-time compression is worth what it costs, step by step (pure).

Enforce pays for its decode-time work every step: the workers observe attention on one step in a
few and read the summaries, and boundaries and pressure relief compact. That work buys time in
two ways only (docs/BENCHMARKS.md, "Under pressure the headline trace is a cliff"):

* **a wider batch**: the pages compactions hold free add up to at least one more request, so the
  pool runs one more at once (or keeps one running that vLLM would preempt for good);
* **a dear recompute avoided**: vLLM preempts a request whose recompute (its tokens at the engine's
  measured cost of a prefilled token) is worth more than many steps of that work.

Where neither happens, a compaction only moves a few pages between requests that would run at
the same width anyway, and enforce is vLLM alone less its own cost: on the AMX host 0.94-0.96x
on decode-heavy traces, where vLLM's preemptions of 200-300-token requests cost 50-80 ms each to
recompute against 4.5-5 % of every step (``gpctl calibrate`` said stay in monitor there, rightly).

So :class:`CompressionGate` keeps decode-time compression on for :data:`GATE_WINDOW_STEPS` engine
steps after either is seen, and idle otherwise. While idle, boundaries grow where the pool has a
page and leave the rest to vLLM's own preemption, pressure relief makes no room, and the workers
observe only the steps that end a prompt. A fresh prompt is still compressed for admission while a
request waits that the pool cannot take (that is a wider batch, bought at the prompt's end, where
the observation is paid anyway), where the engine's measured step costs say one more request
speeds decoding by more than the decode-time work its width then switches on (:func:`wider_batch_pays`).
On a CPU whose step grows with every request (the AVX2 host: on mixed work vLLM alone answered as
fast with half the batch, in twice the steps) it pays only at a narrow batch, and the prompt is left
whole beyond it.

The gate judges realized pages, not a forecast: idle, only prompt compressions save pages, so a
queue whose width only decode-time compaction would buy (floors that let one more request run
beside the others) opens it only once the prompts' savings reach one request. Measured on a
24-request queue, that case needs ``attention_coverage`` 0.9; at the shipped 0.95 enforce ran vLLM
alone's steps there (docs/BENCHMARKS.md, "A longer queue").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from growpage.core.admission import StepCosts

GATE_WINDOW_STEPS = 64  # engine steps compression stays on after it last paid (two blocks of 32 tokens decoded)
# enforce's decode-time work beyond the gate's idle state, as a share of an engine step (whose
# seconds the engine measures): 4.6-4.8 % on against 1.7 % idle on the AMX host (seed 39, 12x160)
DECODE_WORK_SHARE = 0.03
# a recompute must be worth this many times the window's decode-time work (the rollout's factor:
# enforce's own seconds ran 1.1-2.1x monitor's, growpage.rollout.ENFORCE_COST_FACTOR)
RECOMPUTE_COST_FACTOR = 2.0


@dataclasses.dataclass(frozen=True)
class GateStep:
    """What one engine step shows the gate.

    Attributes:
        step: the engine step's number (monotonic).
        pages_saved: pages the running requests' compactions hold free now (their dropped tokens).
        pages_per_request: mean pages a running request holds (0: none runs).
        recompute_s: recompute seconds of the requests vLLM preempted since the last step, each
            priced at the engine's measured cost of a prefilled token (0: none, or unpriced).
        step_s: the engine's measured seconds per step (None: not yet measured).
    """

    step: int
    pages_saved: int
    pages_per_request: float
    recompute_s: float = 0.0
    step_s: float | None = None


def gate_step(step: int, *, dropped_tokens: int, pages_held: Sequence[int], block_size: int,
              preempted_tokens: int, costs: StepCosts | None) -> GateStep:
    """One step's :class:`GateStep` from what a home counts: the tokens its compactions dropped from
    the running requests, the pages each holds, and the tokens of the requests vLLM preempted since
    the last step, priced at the engine's measured ``costs`` (None: unmeasured, nothing priced)."""
    saved = dropped_tokens // block_size
    per_request = sum(pages_held) / len(pages_held) if pages_held else 0.0
    if not preempted_tokens or costs is None:
        return GateStep(step, saved, per_request)
    return GateStep(step, saved, per_request, preempted_tokens * costs.per_token_s,
                    costs.fixed_s + costs.per_request_s * len(pages_held))


def buys_width(pages_saved: int, pages_per_request: float) -> bool:
    """The compactions hold at least one more request's pages free: the batch can be one wider."""
    return pages_per_request > 0 and pages_saved >= pages_per_request


def recompute_outweighs(recompute_s: float, step_s: float | None, *, window_steps: int = GATE_WINDOW_STEPS,
                        work_share: float = DECODE_WORK_SHARE, factor: float = RECOMPUTE_COST_FACTOR) -> bool:
    """A preemption's recompute is worth more than ``factor`` windows of decode-time work (never
    before the engine's step time is measured)."""
    return step_s is not None and recompute_s > factor * work_share * step_s * window_steps


def wider_batch_pays(costs: StepCosts | None, width: int, *, work_share: float = DECODE_WORK_SHARE,
                     factor: float = RECOMPUTE_COST_FACTOR) -> bool:
    """Whether one more request beside ``width`` running ones speeds decoding by more than ``factor``
    times the share of a step decode-time compression costs while on (True while the engine's step
    costs are unmeasured, as before they were priced).

    A step takes ``fixed_s + per_request_s * width``, so one more request raises the tokens decoded
    per second by ``fixed_s / (width * (fixed_s + per_request_s * (width + 1)))``: much where the
    step's fixed part dominates (a GPU; the AMX host at a narrow batch, 12 % at 5 running), little
    where every request costs its own time (the AMX host at 10 running, 4.7 %; an AVX2 CPU)."""
    if costs is None or width < 1:
        return True
    step_s = costs.fixed_s + costs.per_request_s * (width + 1)
    if step_s <= 0:
        return True  # an unpriced fit: nothing to weigh
    return costs.fixed_s / (width * step_s) >= factor * work_share


@dataclasses.dataclass
class CompressionGate:
    """Decode-time compression on while it bought width or a dear recompute in the last
    ``window_steps`` engine steps (see the module docstring).

    Attributes:
        window_steps: steps compression stays on after it last paid.
        active_until: the first step it is idle again (starts idle).
        reason: why it is on (``"width"``, ``"recompute"``) or ``"idle"``.
    """

    window_steps: int = GATE_WINDOW_STEPS
    active_until: int = 0
    reason: str = "idle"

    def step(self, seen: GateStep) -> bool:
        """Take one step's view; whether decode-time compression is on for it."""
        if buys_width(seen.pages_saved, seen.pages_per_request):
            self.active_until, self.reason = seen.step + self.window_steps, "width"
        elif recompute_outweighs(seen.recompute_s, seen.step_s, window_steps=self.window_steps):
            self.active_until, self.reason = seen.step + self.window_steps, "recompute"
        if seen.step >= self.active_until:
            self.reason = "idle"
        return seen.step < self.active_until


@dataclasses.dataclass
class StepGate:
    """One home's gate over its engine steps: the gate (None: off), this step's verdict, and the
    tokens of the requests preempted since the last step. The enforcer and monitor's forecast of it
    each own one.

    Attributes:
        gate: the rule (None: compression is never idle).
        idle: decode-time compression is idle this step.
        steps: engine steps seen.
        preempted_tokens: tokens of the requests preempted since the last step, to price.
    """

    gate: CompressionGate | None = None
    idle: bool = False
    steps: int = 0
    preempted_tokens: int = 0

    @property
    def reason(self) -> str:
        """Why decode-time compression runs this step (``width``, ``recompute``), ``idle``, or ``off``
        (no gate: it always runs)."""
        return self.gate.reason if self.gate is not None else "off"

    def note_preemption(self, tokens: int) -> None:
        """A request was preempted with ``tokens`` to recompute when it runs again."""
        self.preempted_tokens += tokens

    def step(self, *, dropped_tokens: int, pages_held: Sequence[int], block_size: int,
             costs: Callable[[], StepCosts | None]) -> bool:
        """Advance one engine step (see :func:`gate_step`; ``costs`` is read only when something
        was preempted, so most steps solve no fit); whether compression is idle in it."""
        self.steps += 1
        tokens, self.preempted_tokens = self.preempted_tokens, 0
        if self.gate is None:
            self.idle = False
            return False
        seen = gate_step(self.steps, dropped_tokens=dropped_tokens, pages_held=pages_held, block_size=block_size,
                         preempted_tokens=tokens, costs=costs() if tokens else None)
        self.idle = not self.gate.step(seen)
        return self.idle
