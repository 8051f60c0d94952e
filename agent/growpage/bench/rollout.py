"""The forecast before enforce, judged as the operator uses it (pure).

``gpctl calibrate`` turns monitor's forecast of enforce into a rollout recommendation
(:mod:`growpage.rollout`): enforce where the time it would save vLLM (recompute avoided, a
wider batch) outweighs GrowPage's own seconds. Where a benchmark part runs monitor, enforce and vLLM
alone on one trace (``--part headline``, ``--part retrieval``, ``--part mixed``), each monitor run's forecast goes
through that recommendation as if it were a window of the deployment's traffic, and the verdict is
judged against what enforce then did: right when it says enforce exactly where enforce paid.

Enforce paid where it ran faster than vLLM alone at the same engine arguments *and* changed vLLM's
schedule: fewer engine steps or fewer preemptions (:func:`schedule_changed`), the only two ways its
work buys time. Where it ran vLLM alone's steps and preemptions, a faster median is the host's
noise (on the AMX host such runs read 0.957-1.026x vLLM alone from one hour to the next), and the
rule, decided before the runs, judges it as not paid, so the verdict no longer flips with the hour.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from growpage.rollout import ENFORCE, ForecastEvidence, recommend


def run_evidence(monitor: dict) -> ForecastEvidence:
    """One monitor run's forecast as ``gpctl calibrate`` reads it over a window (pure): its counters'
    totals and GrowPage's own seconds (both sides) over the run."""
    forecast = monitor["forecast"]
    own_time = monitor.get("own_time") or {}
    own = sum((own_time.get("own_s") or {}).values()) if own_time.get("own_s") else None
    hooked = sum((own_time.get("step_s") or {}).values()) if own_time.get("step_s") else None
    return ForecastEvidence(
        pages_freed=forecast["pages_freed"], compactions=forecast["compactions"], preemptions=forecast["preemptions"],
        preemptions_avoidable=forecast["preemptions_avoidable"],
        preemptions_avoidable_by_admission=forecast.get("preemptions_avoidable_by_admission", 0),
        own_share=own / hooked if own is not None and hooked else None,
        recompute_seconds_avoidable=forecast.get("recompute_seconds_avoidable"),
        wider_batch_seconds=forecast.get("wider_batch_seconds"), own_seconds=own)


def schedule_changed(alone_runs: Sequence[dict], enforce_runs: Sequence[dict]) -> bool | None:
    """Whether enforce ran fewer engine steps or fewer preemptions than vLLM alone, median against
    median (None where a run lacks either count: runs from before they were recorded)."""
    keys = ("steps", "preemptions")
    if not alone_runs or not enforce_runs or any(run.get(key) is None for run in [*alone_runs, *enforce_runs]
                                                 for key in keys):
        return None
    alone_steps, alone_preemptions, steps, preemptions = (
        statistics.median(float(run[key]) for run in runs) for runs in (alone_runs, enforce_runs) for key in keys)
    return steps < alone_steps or preemptions < alone_preemptions


def rollout_check(monitor_runs: Sequence[dict], enforce_vs_vllm: float, measured_net_s: float | None = None,
                  changed_schedule: bool | None = None) -> dict:
    """``gpctl calibrate``'s recommendation from each monitor run (:func:`run_evidence`) against what
    enforce did (``enforce_vs_vllm``: its median speed, or correct answers per second, over vLLM alone's
    in the same rounds; ``changed_schedule``: :func:`schedule_changed`, None where unknown). The
    verdict is the rounds' most common one; it is right when it says enforce exactly where enforce
    paid: faster than vLLM alone, in a schedule it changed (pure).

    Beside it, the time itself: the forecast's net (saved less GrowPage's own in monitor, the rounds'
    median) against ``measured_net_s``, vLLM alone's median wall time less enforce's (None: not given)."""
    if not monitor_runs:
        raise ValueError("rollout_check needs at least one monitor run")
    evidence = [run_evidence(run) for run in monitor_runs]
    rollouts = [recommend(e, "monitor") for e in evidence]
    verdicts = [rollout.verdict for rollout in rollouts]
    verdict = max(dict.fromkeys(verdicts), key=verdicts.count)  # ties: the first round's
    paid = enforce_vs_vllm > 1.0 and changed_schedule is not False
    return {"verdict": verdict, "verdicts": verdicts, "reason": rollouts[verdicts.index(verdict)].reason,
            "saved_s": [round(e.saved_seconds or 0.0, 3) for e in evidence],
            "own_s": [round(e.own_seconds, 3) if e.own_seconds is not None else None for e in evidence],
            "forecast_net_s": _median_net(evidence),
            "measured_net_s": round(measured_net_s, 3) if measured_net_s is not None else None,
            "enforce_vs_vllm": round(enforce_vs_vllm, 3), "schedule_changed": changed_schedule,
            "enforce_paid": paid, "right": (verdict == ENFORCE) == paid}


def _median_net(evidence: Sequence[ForecastEvidence]) -> float | None:
    """The rounds' median of saved less own seconds (None where a round has neither side)."""
    nets = [e.saved_seconds - e.own_seconds
            for e in evidence if e.saved_seconds is not None and e.own_seconds is not None]
    return round(statistics.median(nets), 3) if len(nets) == len(evidence) else None


def rollout_lines(result: dict) -> list[str]:
    """One line per judged trace of a ``gpctl bench vllm`` result (headline seeds, retrieval, mixed): the
    verdict calibrate gives from monitor's forecast and whether enforce then bore it out (pure)."""
    judged = [(f"headline seed {trace['seed']}", trace["verdict"].get("rollout"))
              for trace in result.get("headlines", [])]
    for part in ("retrieval", "mixed"):
        judged.append((part, (result.get(part) or {}).get("comparison", {}).get("rollout")))
    return [f"{label}: calibrate from monitor's forecast says {rollout['verdict']} (saved {rollout['saved_s']} s "
            f"against GrowPage's own {rollout['own_s']} s); enforce ran {rollout['enforce_vs_vllm']:.3f}x vLLM "
            f"alone{_schedule_note(rollout)}: {'right' if rollout['right'] else 'wrong'}"
            + (f" (net seconds forecast {rollout['forecast_net_s']:+.2f}, measured {rollout['measured_net_s']:+.2f})"
               if rollout.get("forecast_net_s") is not None and rollout.get("measured_net_s") is not None else "")
            for label, rollout in judged if rollout]


def _schedule_note(rollout: dict) -> str:
    """Where enforce ran vLLM alone's schedule, say so: its speed then decides nothing."""
    return " in vLLM alone's engine steps and preemptions" if rollout.get("schedule_changed") is False else ""
