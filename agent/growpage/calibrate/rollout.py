"""``gpctl calibrate``'s rollout recommendation, from monitor's forecast of enforce (pure).

Monitor exports what enforce would do on the deployment's own traffic
(:mod:`growpage.vllm_plugin.forecast`): pages it would free, compactions, and the preemptions it
would avoid among vLLM's own. Over calibrate's window that answers the operator's question before a
rollout: does enforce buy anything here?

* **enforce** when it would avoid preemptions (each one a request recomputed from scratch): the
  avoidable share says how much of vLLM's thrash it removes; with ``admission: after_preemption``
  among the settings when growth-aware admission would have avoided more than compression (vLLM
  started requests into a batch that then outgrew the pool), with its cost: a narrower batch;
* **stay in monitor** when it would compress but avoid nothing: the freed pages buy throughput only
  if vLLM admits more requests into them (a larger ``max_num_seqs`` or more traffic), and every
  compaction costs fidelity, so enforcing buys nothing measured yet;
* **stay in monitor** when it would do nothing at all: memory is not the constraint here;
* **no forecast** when the window has none (GrowPage older than the forecast, or not in monitor).

Each reason also says what monitor itself cost vLLM over the window (``growpage_vllm_own_seconds_total``
over ``growpage_vllm_step_seconds_total``): a floor of what enforce will cost, to weigh against the
preemptions. It does not change the verdict: a preemption's recompute time is not measured here.
"""

from __future__ import annotations

import dataclasses

ENFORCE = "enforce"
STAY_IN_MONITOR = "stay_in_monitor"
NO_FORECAST = "no_forecast"


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
    if forecast.preemptions_avoidable >= 1:
        share = forecast.preemptions_avoidable / max(forecast.preemptions, 1.0)
        return Rollout(ENFORCE, f"enforce would have avoided {forecast.preemptions_avoidable:g} of vLLM's "
                                f"{forecast.preemptions:g} preemptions ({share:.0%}) and freed "
                                f"{forecast.pages_freed:g} KV pages; enforce the namespaces that preempt first "
                                "(enforce_namespaces) and compare the answers' quality before widening"
                                + (admission[0] if admission else "") + cost, forecast,
                       admission[1] if admission else {})
    if admission:
        return Rollout(ENFORCE, f"enforce's compression would have avoided none of vLLM's {forecast.preemptions:g} "
                                "preemptions" + admission[0] + cost, forecast, admission[1])
    if forecast.pages_freed > 0:
        return Rollout(STAY_IN_MONITOR, f"enforce would have freed {forecast.pages_freed:g} KV pages "
                                        f"({forecast.compactions:g} compactions) but avoided no preemption "
                                        f"(vLLM preempted {forecast.preemptions:g} times): the room buys "
                                        "throughput only if vLLM admits more requests into it (raise "
                                        "max_num_seqs), and every compaction costs fidelity" + cost, forecast)
    return Rollout(STAY_IN_MONITOR, "enforce would have compressed nothing and avoided no preemption in the "
                                    "window: KV memory is not what limits this deployment" + cost, forecast)


def _cost(forecast: ForecastEvidence) -> str:
    """What monitor itself cost vLLM over the window, as a clause of the reason ("" where not exported)."""
    if forecast.own_share is None:
        return ""
    return (f"; meanwhile GrowPage's own code took {forecast.own_share:.1%} of vLLM's step time in monitor "
            "(enforce observes as much and adds its compactions; weigh it against the preemptions)")


def _admission_advice(forecast: ForecastEvidence) -> tuple[str, dict[str, str]] | None:
    """Where growth-aware admission would have avoided more preemptions than compression: the
    setting that buys them, and what it costs (it holds requests back: a narrower batch)."""
    by_admission = forecast.preemptions_avoidable_by_admission
    if by_admission < 1 or by_admission <= forecast.preemptions_avoidable:
        return None
    return (f"; growth-aware admission would have avoided {by_admission:g} (requests vLLM started into a batch "
            "that then outgrew the pool): roll out with admission: after_preemption, which holds such starts "
            "once vLLM preempts, at the cost of a narrower batch and a longer queue (watch time to first token)",
            {"admission": "after_preemption"})
