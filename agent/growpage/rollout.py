"""Enforce or stay in monitor, from monitor's forecast of enforce (pure): the one rule ``gpctl calibrate``
writes into its recommendation and ``gpctl diagnose``'s rollout check applies per namespace.

Monitor exports what enforce would do on the deployment's own traffic
(:mod:`growpage.vllm_plugin.forecast`): pages it would free, compactions, and the preemptions it
would avoid among vLLM's own. Over calibrate's window that answers the operator's question before a
rollout: does enforce buy anything here?

What enforce buys is time, and what it costs is time too, so the forecast prices both sides:

* saved: the recompute of each preemption it would avoid (the request's tokens at the engine's
  measured cost of a prefilled token, ``growpage_forecast_recompute_seconds_avoidable_total``) and
  the wider batch of what it would run beside vLLM's (requests it kept from a preemption or admitted
  into pages its compactions spare, each token a share of a step's fixed cost,
  ``growpage_forecast_wider_batch_seconds_total``);
* spent: GrowPage's own seconds in monitor over the window (``growpage_vllm_own_seconds_total``),
  a floor of what enforce costs (it observes as much and adds its compactions), so the saving must
  exceed :data:`ENFORCE_COST_FACTOR` times it.

The verdicts:

* **enforce** when it would save more than enforce would spend, by avoiding preemptions (each one a request
  recomputed from scratch) or by running waiting requests earlier: the avoidable share says how
  much of vLLM's thrash it removes; with ``admission: after_preemption`` among the settings when
  growth-aware admission would have avoided more than compression (vLLM started requests into a
  batch that then outgrew the pool), with its cost: a narrower batch;
* **stay in monitor** when only growth-aware admission would avoid preemptions: its saving is not
  priced, and holding starts narrows the batch; enforce with it ran 0.81-0.89x vLLM alone on every
  decode-heavy trace measured (a recompute there is cheap); the reason names the setting to try
  in one namespace where preemptions recompute long requests;
* **stay in monitor** when it would avoid preemptions but save no more than it spends: enforce
  would run slower than vLLM alone there (a few short requests recomputed against a few per cent
  of every step);
* **stay in monitor** when it would compress but avoid nothing, nor save what it spends: the freed
  pages buy throughput only if vLLM admits more requests into them (a larger ``max_num_seqs`` or
  more traffic), and every compaction costs fidelity;
* **stay in monitor** when it would do nothing at all: memory is not the constraint here;
* **no forecast** when the window has none (GrowPage older than the forecast, or not in monitor).

Each reason also says what monitor itself cost vLLM over the window (``growpage_vllm_own_seconds_total``
over ``growpage_vllm_step_seconds_total``). Where the saving or the cost is not exported (a GrowPage
older than the saving's counters), the verdict stands on the preemptions alone. The preemptions
growth-aware admission alone would avoid are not priced (its advice stands on their count).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from growpage import catalog

ENFORCE = "enforce"
STAY_IN_MONITOR = "stay_in_monitor"
NO_FORECAST = "no_forecast"
# What enforce's own work costs against monitor's: it observes as much and adds its compactions. Measured on
# the packaged model (AMX host, the three traces calibrate's weighing was first judged on): 1.1x on 12
# decode-heavy requests, 1.2x on a 24-request queue, 2.1x on retrieval (prompts compressed for admission). So
# enforce is recommended only where its saving exceeds this many times monitor's own seconds.
ENFORCE_COST_FACTOR = 2.0


@dataclasses.dataclass(frozen=True)
class ForecastEvidence:
    """Monitor's forecast over the window (counter increases, summed over pods)."""

    pages_freed: float
    compactions: float
    preemptions: float
    preemptions_avoidable: float
    preemptions_avoidable_by_admission: float = 0.0  # growth-aware admission's, whatever the setting
    # GrowPage's own seconds over the seconds of the vLLM calls it hooks, in monitor (None: not exported)
    own_share: float | None = None
    # what enforce would save vLLM (the avoidable preemptions' recompute, the wider batch of what it runs
    # beside vLLM's) and GrowPage's own seconds in monitor, over the window (None: not exported)
    recompute_seconds_avoidable: float | None = None
    wider_batch_seconds: float | None = None
    own_seconds: float | None = None

    @property
    def saved_seconds(self) -> float | None:
        """What enforce would save vLLM in all: the recompute and the wider batch (None: not exported)."""
        if self.recompute_seconds_avoidable is None:
            return None
        return self.recompute_seconds_avoidable + (self.wider_batch_seconds or 0.0)


@dataclasses.dataclass(frozen=True)
class Rollout:
    """The recommendation and its reason, in one line each."""

    verdict: str
    reason: str
    forecast: ForecastEvidence | None = None
    settings: dict[str, str] = dataclasses.field(default_factory=dict)  # plugin settings to roll out with

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "reason": self.reason, "settings": dict(self.settings),
                "forecast": dataclasses.asdict(self.forecast) if self.forecast is not None else None}


def recommend(forecast: ForecastEvidence | None, mode: str | None) -> Rollout:
    """The rollout recommendation for one model from its forecast (``mode``: its build info's, for messages)."""
    if forecast is None:
        where = f"the deployment runs {mode}" if mode else "no growpage_forecast_* series in the window"
        return Rollout(NO_FORECAST, f"no forecast of enforce ({where}): run monitor (mode: monitor) under real "
                                    "traffic for a window, then calibrate again")
    admission = _admission_advice(forecast)
    cost = _cost(forecast)
    weighed = _weighed(forecast)
    if forecast.preemptions_avoidable >= 1 or (weighed is not None and weighed.pays):
        share = forecast.preemptions_avoidable / max(forecast.preemptions, 1.0)
        avoided = (f"enforce would have avoided {forecast.preemptions_avoidable:g} of vLLM's "
                   f"{forecast.preemptions:g} preemptions ({share:.0%}) and freed {forecast.pages_freed:g} KV pages"
                   if forecast.preemptions_avoidable >= 1 else
                   f"enforce would have avoided none of vLLM's {forecast.preemptions:g} preemptions, but freed "
                   f"{forecast.pages_freed:g} KV pages that would have run waiting requests beside vLLM's batch")
        if weighed is not None and not weighed.pays:
            return Rollout(STAY_IN_MONITOR, f"{avoided}, but {weighed.clause}: enforce would run slower than vLLM "
                                            "alone here; it pays where preemptions recompute long requests or come "
                                            "often, or its spare pages run waiting requests" + cost, forecast)
        return Rollout(ENFORCE, avoided + (f", and {weighed.clause}" if weighed is not None else "")
                                + "; enforce the namespaces that preempt first "
                                "(enforce_namespaces) and compare the answers' quality before widening"
                                + (admission[0] if admission else "") + cost, forecast,
                       admission[1] if admission else {})
    if admission:
        return Rollout(STAY_IN_MONITOR, f"enforce's compression would have avoided none of vLLM's "
                                        f"{forecast.preemptions:g} preemptions; {_admission_count(forecast)}, but "
                                        "holding those starts narrows the batch, which runs slower than vLLM alone "
                                        "where a recompute is cheap: try admission: after_preemption in one "
                                        "namespace only where preemptions recompute long requests, and compare"
                                        + cost, forecast)
    if forecast.pages_freed > 0:
        return Rollout(STAY_IN_MONITOR, f"enforce would have freed {forecast.pages_freed:g} KV pages "
                                        f"({forecast.compactions:g} compactions) but avoided no preemption "
                                        f"(vLLM preempted {forecast.preemptions:g} times)"
                                        + (f", and {weighed.clause}" if weighed is not None else "")
                                        + ": the room buys throughput only if vLLM admits more requests into it "
                                        "(raise max_num_seqs), and every compaction costs fidelity" + cost, forecast)
    return Rollout(STAY_IN_MONITOR, "enforce would have compressed nothing and avoided no preemption in the "
                                    "window: KV memory is not what limits this deployment" + cost, forecast)


@dataclasses.dataclass(frozen=True)
class Weighed:
    """What enforce would save in time against what GrowPage's own code costs, over the window."""

    clause: str  # the two sides, for a reason
    pays: bool  # the saving exceeds ENFORCE_COST_FACTOR times GrowPage's own seconds in monitor


def _weighed(forecast: ForecastEvidence) -> Weighed | None:
    """The recompute of the avoidable preemptions and the wider batch of what enforce would run
    beside vLLM's, against GrowPage's own seconds in monitor (None: either side is not exported, so
    nothing is weighed)."""
    recompute, wider, own = forecast.recompute_seconds_avoidable, forecast.wider_batch_seconds, forecast.own_seconds
    saved = forecast.saved_seconds
    if recompute is None or saved is None or own is None:
        return None
    pays = saved > ENFORCE_COST_FACTOR * own
    relation = "more than" if pays else "no more than"
    return Weighed(f"the time it would save vLLM ({recompute:.3g} s of recompute, {wider or 0.0:.3g} s of a wider "
                   f"batch) is {relation} {ENFORCE_COST_FACTOR:g}x the {own:.3g} s GrowPage's own code took in "
                   "monitor over the window (enforce's own work adds its compactions)", pays)


def _cost(forecast: ForecastEvidence) -> str:
    """What monitor itself cost vLLM over the window, as a clause of the reason ("" where not exported)."""
    if forecast.own_share is None:
        return ""
    suffix = ("" if forecast.recompute_seconds_avoidable is not None else
              " (enforce observes as much and adds its compactions; weigh it against the preemptions)")
    return f"; meanwhile GrowPage's own code took {forecast.own_share:.1%} of vLLM's step time in monitor{suffix}"


def _admission_advice(forecast: ForecastEvidence) -> tuple[str, dict[str, str]] | None:
    """Where growth-aware admission would have avoided more preemptions than compression: the
    setting that buys them, and what it costs (it holds requests back: a narrower batch)."""
    by_admission = forecast.preemptions_avoidable_by_admission
    if by_admission < 1 or by_admission <= forecast.preemptions_avoidable:
        return None
    return (f"; {_admission_count(forecast)}: roll out with admission: after_preemption, which holds such starts "
            "once vLLM preempts, at the cost of a narrower batch and a longer queue (watch time to first token)",
            {"admission": "after_preemption"})


def _admission_count(forecast: ForecastEvidence) -> str:
    """What growth-aware admission would have avoided, as a clause of a reason."""
    return (f"growth-aware admission would have avoided {forecast.preemptions_avoidable_by_admission:g} "
            "(requests vLLM started into a batch that then outgrew the pool)")


# The forecast's counters calibrate and diagnose read, in ForecastEvidence's field order,
# then what enforce would save in time (absent from a GrowPage older than it: nothing is weighed), then
# what monitor itself cost vLLM meanwhile (own seconds over the hooked calls' seconds, both sides).
FORECAST_COUNTERS = (catalog.FORECAST_PAGES_FREED, catalog.FORECAST_COMPACTIONS, catalog.FORECAST_PREEMPTIONS,
                     catalog.FORECAST_PREEMPTIONS_AVOIDABLE, catalog.FORECAST_PREEMPTIONS_AVOIDABLE_BY_ADMISSION,
                     catalog.FORECAST_RECOMPUTE_SECONDS_AVOIDABLE, catalog.FORECAST_WIDER_BATCH_SECONDS)
COST_COUNTERS = (catalog.VLLM_OWN_SECONDS, catalog.VLLM_STEP_SECONDS)


def forecast_evidence(increases: Mapping[str, float | None]) -> ForecastEvidence | None:
    """The forecast's counter increases by series name (None: absent) as evidence, with GrowPage's own
    seconds and share of vLLM's step time where its cost counters are present; None when no forecast
    counter is."""
    if all(increases.get(spec.name) is None for spec in FORECAST_COUNTERS):
        return None
    own, hooked = (increases.get(spec.name) for spec in COST_COUNTERS)
    freed, compactions, preemptions, avoidable, by_admission = (float(increases.get(spec.name) or 0.0)
                                                                for spec in FORECAST_COUNTERS[:-2])
    recompute, wider = (increases.get(spec.name) for spec in FORECAST_COUNTERS[-2:])
    return ForecastEvidence(freed, compactions, preemptions, avoidable, by_admission,
                            own_share=own / hooked if own is not None and hooked else None,
                            recompute_seconds_avoidable=float(recompute) if recompute is not None else None,
                            wider_batch_seconds=float(wider) if wider is not None else None,
                            own_seconds=float(own) if own is not None else None)
