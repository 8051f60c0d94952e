"""Checklist step 6: the agent itself: caught faults, build info, whether it is being read, and what it
costs vLLM (its own code's share of the vLLM calls it hooks, inside vLLM)."""

from __future__ import annotations

from growpage import catalog
from growpage.diagnose.checks.base import Thresholds, evidence, pct
from growpage.diagnose.findings import ScopeFinding, Status, alert_finding
from growpage.diagnose.observations import Scope, Window


def agent_health(scope: Scope, window: Window, t: Thresholds) -> ScopeFinding:
    metric = catalog.AGENT_ERRORS.name
    errors = {component: count for component, count in (scope.agent_errors or {}).items() if count > 0}
    total = sum(errors.values())
    build = [info.to_dict() for info in scope.build_infos]
    inactive = scope.inactive_components or {}
    own_share = _own_share(scope)
    proof = evidence(metric, total, 0, window, errors_by_component=errors, build_info=build,
                     own_share_of_vllm_steps=own_share, own_share_high=t.checklist.own_share_high,
                     response_time_s=scope.response_time_s, sample_age_s=scope.sample_age_s,
                     targets_total=scope.targets_total, targets_down=scope.targets_down,
                     vllm_targets_up=scope.vllm_targets_up,
                     inactive_components=dict(inactive), non_finite=list(scope.non_finite))
    problems: list[str] = []
    steps: list[str] = []
    alerts: list[str] = []
    _scrape_problems(scope, alerts, problems, steps)
    _component_problems(scope, alerts, problems, steps)
    if total > 0:
        alerts.append("GrowPageAgentErrors")
        since = " since start" if window.kind == "lifetime" else ""
        listing = ", ".join(f"{name} {count:,.0f}" for name, count in sorted(errors.items()))
        problems.append(f"{total:,.0f} caught faults{since} ({listing})")
        steps.append("Read the agent's log lines for those components: each fault fell back to vLLM's "
                     "default behaviour (requests were served, GrowPage skipped them).")
    if scope.response_time_s is not None and scope.response_time_s > t.diagnose.endpoint_slow_response_s:
        problems.append(f"{catalog.METRICS_PATH} took {scope.response_time_s:.1f}s")
        steps.append("A slow metrics route risks Prometheus scrape timeouts: check the agent's CPU.")
    if scope.sample_age_s is not None and scope.sample_age_s > t.diagnose.scrape_stale_s:
        problems.append(f"newest sample {scope.sample_age_s:,.0f}s old")
        steps.append(f"The agent stopped being scraped: check Prometheus' targets page (job {catalog.SCRAPE_JOB}).")
    if own_share is not None and own_share > t.checklist.own_share_high:
        problems.append(f"GrowPage's own code took {pct(own_share)} of the vLLM calls it hooks "
                        f"(> {pct(t.checklist.own_share_high)})")
        steps.append("Observe less: raise observe_every_steps, or lower observed_layers, observed_heads or "
                     "observe_max_requests; where calibrate's forecast shows no preemption avoided, the cost buys "
                     "nothing: keep monitor's sampling or roll back to off.")
    if scope.non_finite:
        problems.append(f"NaN/Inf values read as unknown: {', '.join(scope.non_finite)}")
        steps.append("The agent exported NaN or Inf: the checks that need those metrics say unknown; "
                     "report it with a --bundle.")
    if alerts:
        return alert_finding(tuple(alerts), "; ".join(problems), proof, tuple(steps))
    if problems:  # the data path itself is in doubt: no alert covers it, diagnose still warns
        return ScopeFinding(Status.WARNING, "; ".join(problems), proof, tuple(steps))
    reading = ""
    if scope.response_time_s is not None:
        reading = f"; metrics answered in {scope.response_time_s * 1000:.0f} ms"
    elif scope.sample_age_s is not None:
        reading = f"; newest sample {scope.sample_age_s:,.0f}s old"
    return ScopeFinding(Status.OK, f"no caught faults; build info present{reading}", proof)


def _own_share(scope: Scope) -> float | None:
    """GrowPage's own seconds over the seconds of the vLLM calls it hooks (None: not inside vLLM, or idle)."""
    if scope.own_seconds is None or not scope.hooked_seconds:
        return None
    return scope.own_seconds / scope.hooked_seconds


def _component_problems(scope: Scope, alerts: list[str], problems: list[str], steps: list[str]) -> None:
    """Components that do nothing although their mode asks for it, and an observer that observes nothing,
    as GrowPageAgentInactive and GrowPageObservationStale judge them."""
    mode = scope.build_value("mode")
    # The enforcer idles by design outside enforce; every component idles in mode off, and while vLLM
    # loads the model (starting). Settings GrowPage cannot honour are a fault in any mode (it runs
    # off then, whatever was asked): the rules' GrowPageAgentInactive, condition for condition.
    inactive = {component: reason for component, reason in (scope.inactive_components or {}).items()
                if reason == catalog.AGENT_INVALID_CONFIG_REASON
                or (reason != catalog.AGENT_STARTING_REASON and mode not in ("off", None)
                    and (component != "enforcer" or mode in catalog.MODES_ENFORCING))}
    if inactive:
        alerts.append("GrowPageAgentInactive")
        listing = ", ".join(f"{component} ({reason})" for component, reason in sorted(inactive.items()))
        problems.append(f"inactive while the mode is {mode or 'unknown'}: {listing}")
        steps.append("The pod serves with vLLM's default paging and its GrowPage metrics describe nothing: "
                     "see runbook GrowPageAgentInactive.md for each reason (e.g. full_cudagraph, "
                     "unsupported_backend, async_scheduling).")
    if _observation_stale(scope):
        alerts.append("GrowPageObservationStale")
        problems.append(f"{scope.tracked_steps:,.0f} engine steps ran with tracked requests and none was observed "
                        "while the observer reports active")
        steps.append("GrowPage's decisions rank tokens by recency alone: see runbook GrowPageObservationStale.md "
                     "(an observer fault in the log, or full CUDA graphs with no eager observation step).")


def _observation_stale(scope: Scope) -> bool:
    """GrowPageObservationStale's condition: steps ran, none was observed, and the observer reports
    active (an inactive one is GrowPageAgentInactive's; no step at all is an idle pod)."""
    reported = scope.inactive_components
    return (bool(scope.tracked_steps) and scope.observed_steps == 0 and reported is not None
            and "observer" not in reported)


def _scrape_problems(scope: Scope, alerts: list[str], problems: list[str], steps: list[str]) -> None:
    """Whether Prometheus reads the agent, as GrowPageAgentDown and GrowPageMetricsAbsent judge it:
    only while vLLM's own route answers (a pod loading its model answers neither)."""
    if scope.targets_down:
        alerts.append("GrowPageAgentDown")
        problems.append(f"{scope.targets_down} of {scope.targets_total} scrape targets down while vLLM answers")
        steps.append("vLLM serves but GrowPage's route fails: its exporter is broken or hung, and GrowPage's alerts "
                     "are blind for those pods; see runbook GrowPageAgentDown.md.")
    if not scope.build_infos and scope.vllm_targets_up == 0:
        # As GrowPageMetricsAbsent: no alert while vLLM does not answer either (a pod loading its model).
        problems.append(f"{catalog.BUILD_INFO.name} missing while no vLLM target answers either")
        steps.append("The pod answers neither route: is it still loading its model? Check its readiness.")
    elif not scope.build_infos:
        alerts.append("GrowPageMetricsAbsent")
        problems.append(f"{catalog.BUILD_INFO.name} missing")
        steps.append("Check that the plugin is loaded (VLLM_PLUGINS) and that the scrape reads "
                     f"{catalog.METRICS_PATH}: without build info diagnose cannot read mode, block_size or "
                     "base_pages.")
