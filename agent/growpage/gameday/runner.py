"""The game day: a real vLLM pod with GrowPage, a real Prometheus with the shipped rules, a real
Alertmanager with the shipped routing, and a webhook receiver that records what pages.

The rules are the shipped ones with every window and ``for`` scaled (:attr:`MixinConfig.time_scale`,
1/60 by default: an hour reads a minute), so the scenarios of :data:`SCENARIOS` run in minutes:

1. ``slow-start``: Prometheus scrapes the pod while it loads its model (nothing answers).
2. ``exporter-failing``: the pod serves, but GrowPage's exporter port is held by a hung process; then
   the port frees and the exporter binds it.
3. ``idle-monitor``: healthy and idle in monitor mode.
4. ``kv-storm``: more long requests than the KV cache holds.
5. ``rollback-to-off``: mid-storm the pod is replaced by one in mode off, the storm goes on.
6. ``idle-off``: the storm ends.

After each, the deliveries made while it ran are judged (:func:`growpage.gameday.scenarios.judge`)
and ``gpctl diagnose`` runs against Prometheus or the pod itself. Everything listens on loopback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from growpage import catalog
from growpage.diagnose import DiagnoseRequest
from growpage.diagnose import diagnose as run_diagnosis
from growpage.diagnose.errors import DiagnoseError
from growpage.engine.model_prep import resolve_model_dir
from growpage.errors import GrowPageError
from growpage.gameday.pod import HungListener, PodSpec, VllmPod, scrape_configs
from growpage.gameday.promstack import Prometheus, free_port, run_alertmanager, run_prometheus
from growpage.gameday.receiver import Notification, WebhookReceiver, run_receiver
from growpage.gameday.scenarios import (
    SCENARIOS_BY_NAME,
    TTFT_FAST,
    TTFT_SLOW,
    DiagnoseOutcome,
    GamedaySummary,
    Scenario,
    Verdict,
    judge,
    summarize,
)
from growpage.gameday.storm import PILOT_S, Storm, concurrency_for
from growpage.monitoring.alertmanager import PAGER_RECEIVER, TICKET_RECEIVER, RouteTiming, alertmanager_config
from growpage.monitoring.mixin import MixinConfig
from growpage.monitoring.promql import duration_seconds
from growpage.monitoring.recording_rules import SLO_BASE_WINDOW, vllm_error_ratio_name
from growpage.monitoring.rules_file import rules_yaml
from growpage.provenance import host_facts
from growpage.tooling.fleet import http_ok

NAMESPACE = "gameday"
# Alertmanager batches for seconds, not minutes: a game day waits on it at every step.
TIMING = RouteTiming(group_wait="1s", group_interval="1s", page_repeat_interval="1h", ticket_repeat_interval="1h")

STORM_MAX_REQUESTS = 5000  # the count bound; the storm's time limit (900 s) comes first on these hosts
DIAGNOSE_TIMEOUT_S = 30.0  # per query of the game day's diagnose runs (see GameDay.diagnose)


@dataclasses.dataclass(frozen=True)
class GamedaySettings:
    """Everything a game day run depends on; recorded in its result.

    Attributes:
        time_scale: the rules' windows and ``for`` times this (1/60: an hour-long window reads a minute).
        startup_timeout_s: how long a pod may take to load its model (a hung start fails the run).
        alert_timeout_s: how long a required delivery is waited for, once its cause is in place.
        idle_s: how long an idle scenario watches for deliveries that must not come.
        storm_concurrency, storm_max_tokens: the storm's clients at the least (more on a host fast
            enough that these would not queue past the TTFT threshold:
            :func:`~growpage.gameday.storm.concurrency_for`) and each request's length.
        kv_blocks: the pods' KV cache in 32-token blocks (12: two of the storm's requests overflow it).
    """

    time_scale: float = 1 / 60
    startup_timeout_s: float = 600.0
    alert_timeout_s: float = 240.0
    idle_s: float = 15.0
    storm_concurrency: int = 6
    storm_max_tokens: int = 48
    kv_blocks: int = 12

    @property
    def mixin(self) -> MixinConfig:
        return MixinConfig(time_scale=self.time_scale)


@dataclasses.dataclass(frozen=True)
class GamedayResult:
    verdicts: tuple[Verdict, ...]
    summary: GamedaySummary
    settings: GamedaySettings
    timeline: tuple[tuple[float, str], ...]
    host: dict[str, str]

    @property
    def passed(self) -> bool:
        return all(verdict.passed for verdict in self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "summary": {**dataclasses.asdict(self.summary),
                                                   "diagnose_agreement": self.summary.diagnose_agreement},
                "verdicts": [{**dataclasses.asdict(v), "passed": v.passed} for v in self.verdicts],
                "settings": dataclasses.asdict(self.settings), "host": self.host,
                "timeline": [{"t_s": round(t, 1), "event": event} for t, event in self.timeline]}


class _Day:
    """The running systems and what has happened so far."""

    def __init__(self, settings: GamedaySettings, workdir: Path, prometheus: Prometheus,
                 receiver: WebhookReceiver, model_dir: Path, log: Callable[[str], None]):
        self.settings, self.workdir, self.prometheus, self.receiver = settings, workdir, prometheus, receiver
        self.model_dir, self._log = model_dir, log
        self.started = time.time()
        self.timeline: list[tuple[float, str]] = []
        self.verdicts: list[Verdict] = []

    def note(self, event: str) -> None:
        self.timeline.append((time.time() - self.started, event))
        self._log(f"[{time.time() - self.started:6.1f}s] {event}")

    def start_pod(self, spec: PodSpec) -> VllmPod:
        self.prometheus.rescrape(scrape_configs(spec, NAMESPACE))
        self.note(f"pod {spec.name} starting (mode {spec.mode})")
        return VllmPod(spec, self.model_dir, self.workdir / f"{spec.name}.log")

    def delivered(self, alertname: str, status: str, since_s: float) -> Notification | None:
        return next((n for n in self.receiver.notifications(since_s)
                     if n.alertname == alertname and n.status == status), None)

    def wait_delivery(self, alertname: str, status: str, since_s: float) -> bool:
        """Wait for ``alertname`` to be delivered ``status`` (resolved: every rule of it resolved)."""
        deadline = time.monotonic() + self.settings.alert_timeout_s
        while time.monotonic() < deadline:
            done = self.delivered(alertname, status, since_s)
            if done and (status == "firing" or alertname not in self.receiver.firing()):
                self.note(f"{alertname} delivered {status}")
                return True
            time.sleep(0.5)
        self.note(f"{alertname} NOT delivered {status} within {self.settings.alert_timeout_s:g} s")
        return False

    def wait_paging(self, alertname: str, since_s: float, slo: catalog.LatencySLO) -> str:
        """Wait until ``alertname``, a burn of ``slo``, pages on what happened since ``since_s``
        alone. Returns:

        - ``"delivered"``: delivered firing since ``since_s``;
        - ``"held"``: still open on the pager (delivered firing before, never delivered resolved)
          while one of its window pairs fires in Prometheus once everything before ``since_s`` has
          left that pair's short window (and the recorded base rate it sums);
        - ``""``: neither within the alert timeout.

        A pair whose short window outlasts the gap (the 30m one is 30 s at 1/60 against a pod
        replaced in about 25 s) never resolves through it: Alertmanager sends nothing new for a page
        still open, and the on-call's page is what a re-delivery would have given. Every 60 s, and
        on a miss, the timeline notes each pair's state and error ratios, so a miss says whether the
        ratios were under their limits or missing (scrapes failing on a loaded host).
        """
        deadline = time.monotonic() + self.settings.alert_timeout_s
        next_view = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            if self.delivered(alertname, "firing", since_s):
                self.note(f"{alertname} delivered firing")
                return "delivered"
            held = self._pair_firing_on_data_since(alertname, since_s) if alertname in self.receiver.firing() else ""
            if held:
                self.note(f"{alertname} still paging since before (never resolved): its {held} pair fires "
                          "on what happened since alone")
                return "held"
            if time.monotonic() > next_view:
                self.note(self._burn_view(alertname, slo))
                next_view += 60.0
            time.sleep(0.5)
        self.note(f"{alertname} NOT paging within {self.settings.alert_timeout_s:g} s; "
                  f"{self._burn_view(alertname, slo)}")
        return ""

    def _pair_firing_on_data_since(self, alertname: str, since_s: float) -> str:
        return pair_firing_on_data_since(self.firing_rules(alertname), since_s, time.time(), self.settings.time_scale)

    def _burn_view(self, alertname: str, slo: catalog.LatencySLO) -> str:
        """Each window pair's state in Prometheus and its two error ratios, and the vLLM scrapes; a
        note, so a Prometheus that does not answer is said, never raised (the verdict stands)."""
        try:
            return self._read_burn_view(alertname, slo)
        except (OSError, AssertionError, ValueError) as error:
            return f"{alertname}: Prometheus did not answer the view ({error})"

    def _read_burn_view(self, alertname: str, slo: catalog.LatencySLO) -> str:
        budget = 1 - slo.objective
        states = {(a["metric"].get("long_window"), a["metric"].get("short_window")): a["metric"]["alertstate"]
                  for a in self.prometheus.query(f'ALERTS{{alertname="{alertname}"}}')}

        def ratio(window: str) -> str:
            value = self.prometheus.query_value(vllm_error_ratio_name(slo.name, window))
            return "none" if value is None else f"{value:.2f}"

        pairs = [f"{burn.long_window}/{burn.short_window} "
                 f"{states.get((burn.long_window, burn.short_window), 'inactive')} "
                 f"(ratios {ratio(burn.long_window)}/{ratio(burn.short_window)}, limit {burn.factor * budget:.3f})"
                 for alert in self.settings.mixin.thresholds.burn_rate_alerts
                 if alertname.endswith(f"{alert.speed.title()}Burn") for burn in alert.windows]
        up = self.prometheus.query(f'avg_over_time(up{{job="{catalog.VLLM_SCRAPE_JOB}"}}[1m])')
        scrapes = ", ".join(f"{a['metric'].get('pod')} {float(a['value'][1]):.0%}" for a in up) or "none"
        return f"{alertname}: {'; '.join(pairs)}; vLLM scrapes up over the last minute: {scrapes}"

    def wait_resolved(self, alertname: str, since_s: float) -> bool:
        """Wait until every rule of ``alertname`` is over: none firing or pending in Prometheus (a
        window pair may still reach its ``for`` after another resolved), and the resolution delivered."""
        def over() -> bool:
            return (not self.prometheus.query(f'ALERTS{{alertname="{alertname}"}}')
                    and alertname not in self.receiver.firing()
                    and self.delivered(alertname, "resolved", since_s) is not None)

        done = _wait_until(over, self.settings.alert_timeout_s)
        self.note(f"{alertname} {'resolved, every rule of it' if done else 'NOT resolved'} "
                  f"within {self.settings.alert_timeout_s:g} s")
        return done

    def firing_rules(self, alertname: str) -> list[dict[str, str]]:
        """The label sets of ``alertname``'s rules firing in Prometheus (one per window pair)."""
        return [alert["metric"] for alert in
                self.prometheus.query(f'ALERTS{{alertname="{alertname}", alertstate="firing"}}')]

    def firing_in_prometheus(self, alertname: str) -> bool:
        return bool(self.firing_rules(alertname))

    def diagnose(self, scenario: Scenario, pod: VllmPod) -> DiagnoseOutcome | None:
        if not scenario.diagnose_source:
            return None
        # The storm loads the one host that also runs Prometheus and the pod: a query can take longer than
        # diagnose's default 10 s there (a full test run saw it), so the game day waits as an on-call
        # passing --timeout would.
        if scenario.diagnose_source == "endpoint":
            request = DiagnoseRequest(endpoint=f"{pod.spec.url}{catalog.METRICS_PATH}", duration_s=5.0,
                                      timeout_s=DIAGNOSE_TIMEOUT_S)
        else:  # the window an on-call would pass, at the game day's scale
            request = DiagnoseRequest(prometheus=self.prometheus.url, namespace=NAMESPACE,
                                      since_s=max(60.0, 1800 * self.settings.time_scale),
                                      config=self.settings.mixin, timeout_s=DIAGNOSE_TIMEOUT_S)
        try:
            report, _ = run_diagnosis(request)
        except DiagnoseError as error:
            self.note(f"diagnose could not run: {error}")
            return DiagnoseOutcome("unknown", 3, ())
        named = {alert for finding in report.findings for alert in finding.alerts}
        named |= {alert for finding in report.findings for scope in finding.breakdown.values()
                  for alert in scope.alerts}
        outcome = DiagnoseOutcome(report.status.value, report.exit_code, tuple(sorted(named)))
        self.note(f"diagnose --{scenario.diagnose_source}: {outcome.status} (exit {outcome.exit_code}), "
                  f"names {', '.join(outcome.alerts) or 'no alert'}")
        return outcome

    def judge(self, scenario: Scenario, since_s: float, pod: VllmPod, checks: dict[str, bool] | None = None,
              diagnose: DiagnoseOutcome | None = None, held: frozenset[str] = frozenset()) -> Verdict:
        if diagnose is None:
            diagnose = self.diagnose(scenario, pod)
        verdict = judge(scenario, self.receiver.notifications(since_s), diagnose, checks,
                        frozenset(self.receiver.firing()), held)
        self.verdicts.append(verdict)
        self.note(f"scenario {scenario.name}: {'passed' if verdict.passed else 'FAILED'} "
                  f"(false {list(verdict.false_pages)}, missed {list(verdict.missed)}, "
                  f"unresolved {list(verdict.unresolved)})")
        return verdict


def pair_firing_on_data_since(firing: list[dict[str, str]], since_s: float, now_s: float, time_scale: float) -> str:
    """Of the firing window pairs ``firing`` (ALERTS label sets), the first whose short window, plus
    the base rate it sums, starts after ``since_s`` at ``now_s`` (windows times ``time_scale``): the
    pair fires on what happened since alone. ``long/short``, or empty if none does."""
    base_s = duration_seconds(SLO_BASE_WINDOW) * time_scale
    for labels in firing:
        short = labels.get("short_window")
        if short and now_s - since_s >= duration_seconds(short) * time_scale + base_s:
            return f"{labels.get('long_window')}/{short}"
    return ""


def _watch_idle(day: _Day, seconds: float) -> None:
    day.note(f"watching {seconds:g} s for deliveries that must not come")
    time.sleep(seconds)


def _exporter_failing_and_start(day: _Day, spec: PodSpec) -> VllmPod:
    """Scenarios 1 and 2: a slow start, then a hung exporter port that frees."""
    squatter = HungListener(spec.exporter_port)
    pod = day.start_pod(spec)
    slow_start = time.time()
    try:
        ready_s = pod.wait_ready(day.settings.startup_timeout_s)
        day.note(f"pod {spec.name} serves after {ready_s - pod.started_s:.0f} s")
        day.judge(SCENARIOS_BY_NAME["slow-start"], slow_start, pod)
        failing = time.time()
        fired = day.wait_delivery("GrowPageAgentDown", "firing", failing)
        outcome = day.diagnose(SCENARIOS_BY_NAME["exporter-failing"], pod) if fired else None
    finally:
        squatter.close()
    day.note("the exporter port is free")
    day.wait_delivery("GrowPageAgentDown", "resolved", failing)
    day.judge(SCENARIOS_BY_NAME["exporter-failing"], failing, pod, diagnose=outcome)
    return pod


def _storm_and_rollback(day: _Day, pod: VllmPod) -> VllmPod:
    """Scenarios 4 and 5: the storm on the monitor pod, then its replacement in mode off mid-storm."""
    settings = day.settings
    with Storm(pod.spec.url, "gameday", concurrency=settings.storm_concurrency, max_tokens=settings.storm_max_tokens,
               max_requests=STORM_MAX_REQUESTS) as storm:
        stormed = time.time()
        _size_storm(day, storm)
        paged = day.wait_delivery(TTFT_FAST, "firing", stormed)
        outcome = day.diagnose(SCENARIOS_BY_NAME["kv-storm"], pod) if paged else None
        # The slow burn must be burning before the pod goes: it is what the replacement must not erase.
        slow_before = _wait_until(lambda: day.firing_in_prometheus(TTFT_SLOW), settings.alert_timeout_s)
        day.note(f"{TTFT_SLOW} firing in Prometheus before the replacement: {slow_before}")
        day.judge(SCENARIOS_BY_NAME["kv-storm"], stormed, pod, diagnose=outcome)

        replaced = time.time()
        pod.stop()
        day.note(f"pod {pod.spec.name} stopped (rollback: replaced by a pod in mode off)")
        replacement = PodSpec(f"{NAMESPACE}-b", "off", free_port(), free_port(), kv_blocks=settings.kv_blocks)
        new_pod = day.start_pod(replacement)
        slow_held = True
        while not _serving(new_pod, settings.startup_timeout_s):
            slow_held &= day.firing_in_prometheus(TTFT_SLOW)
            time.sleep(1.0)
        new_pod.wait_ready(settings.startup_timeout_s)
        day.note(f"pod {replacement.name} serves; the slow burn held through the replacement: {slow_held}")
        storm.retarget(new_pod.spec.url)
        back = time.time()
        ttft = settings.mixin.thresholds.vllm_latency_slos[0]
        paging = day.wait_paging(TTFT_FAST, back, ttft)
        outcome = day.diagnose(SCENARIOS_BY_NAME["rollback-to-off"], new_pod) if paging else None
        checks = {"slow burn firing before the replacement": slow_before,
                  "slow burn kept firing while the replaced pod's series went away": slow_before and slow_held}
        day.judge(SCENARIOS_BY_NAME["rollback-to-off"], replaced, new_pod, checks, outcome,
                  held=frozenset({TTFT_FAST} if paging == "held" else ()))
    day.note(f"storm over: {storm.counts}")
    return new_pod


def _size_storm(day: _Day, storm: Storm) -> None:
    """Grow the storm until a queued request waits past the TTFT threshold on this host (see
    :mod:`growpage.gameday.storm`), from what the pod completes under the floor's clients."""
    day.note(f"storm starts: {storm.clients} clients")
    started, before = time.monotonic(), storm.counts.completed
    time.sleep(PILOT_S)
    completed_per_s = (storm.counts.completed - before) / (time.monotonic() - started)
    clients = concurrency_for(completed_per_s, ttft_threshold_s=day.settings.mixin.thresholds.vllm_ttft_s,
                              floor=day.settings.storm_concurrency)
    storm.grow(clients)
    day.note(f"storm sized to this host: {completed_per_s:.2f} requests/s completed under "
             f"{day.settings.storm_concurrency} clients, so {storm.clients} clients")


def _serving(pod: VllmPod, timeout_s: float) -> bool:
    """Whether the pod answers yet; raises GrowPageError once it exited or ``timeout_s`` passed."""
    if pod.process.poll() is not None:
        raise GrowPageError(f"pod {pod.spec.name} exited ({pod.process.returncode}); see {pod.log_path}")
    if time.time() - pod.started_s > timeout_s:
        raise GrowPageError(f"pod {pod.spec.name} did not serve within {timeout_s:g} s; see {pod.log_path}")
    return http_ok(f"{pod.spec.url}/health")


def _wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


@contextlib.contextmanager
def _stack(settings: GamedaySettings, workdir: Path) -> Iterator[tuple[Prometheus, WebhookReceiver]]:
    rules = workdir / "growpage-rules.yaml"
    rules.write_text(rules_yaml(config=settings.mixin), encoding="utf-8")
    # A game day judges its own run: the series and notification log an earlier run left in the same
    # --workdir would page on that run's storm (its slow burn's windows are an hour long at 1/60).
    for state in (workdir / "prometheus" / "data", workdir / "alertmanager" / "am-data"):
        shutil.rmtree(state, ignore_errors=True)
    with run_receiver() as receiver:
        routing = alertmanager_config({PAGER_RECEIVER: f"{receiver.url}/pager",
                                       TICKET_RECEIVER: f"{receiver.url}/ticket"}, TIMING, settings.mixin)
        with run_alertmanager(workdir / "alertmanager", routing) as alertmanager, \
                run_prometheus(workdir / "prometheus", [], rule_files=[rules],
                               alertmanager_url=alertmanager.url) as prometheus:
            yield prometheus, receiver


def run_gameday(workdir: Path, settings: GamedaySettings = GamedaySettings(),
                log: Callable[[str], None] = print) -> GamedayResult:
    """Run every scenario in order; always stops what it started.

    Raises:
        GrowPageError: the packaged model is not prepared, a pod never serves, or a binary is missing.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir = resolve_model_dir(None)
    with _stack(settings, workdir) as (prometheus, receiver):
        day = _Day(settings, workdir, prometheus, receiver, model_dir, log)
        first = PodSpec(f"{NAMESPACE}-a", "monitor", free_port(), free_port(), kv_blocks=settings.kv_blocks)
        pod = _exporter_failing_and_start(day, first)
        try:
            idle = time.time()
            _watch_idle(day, settings.idle_s)
            day.judge(SCENARIOS_BY_NAME["idle-monitor"], idle, pod)
            pod = _storm_and_rollback(day, pod)
            calm = time.time()
            day.wait_resolved(TTFT_FAST, calm)
            day.judge(SCENARIOS_BY_NAME["idle-off"], calm, pod)
        finally:
            pod.stop()
        return GamedayResult(tuple(day.verdicts), summarize(day.verdicts), settings, tuple(day.timeline),
                             host_facts())
