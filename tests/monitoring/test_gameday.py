"""The game day, run: a real vLLM pod (CPU build) with GrowPage, a real Prometheus with the shipped
rules at 1/60 of their windows, a real Alertmanager with the shipped routing and a webhook receiver.

Every scenario must pass: what must page pages, nothing else does, every page resolves once its
cause is gone, and ``gpctl diagnose`` gives the same verdict and names the same alerts. The runbook
of every alert that fired must open its Mitigation with a command whose target the shipped
manifests define (on every overlay it applies to).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from kustomize_render import build
from monitoring_paths import RUNBOOKS_DIR
from test_runbook_commands import OVERLAYS, _applies, _commands, _problem

from support.vllm_guard import require_vllm_plugin

require_vllm_plugin()

from growpage.gameday.runner import GamedaySettings, run_gameday  # noqa: E402
from growpage.gameday.scenarios import SCENARIOS  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("gameday")
    outcome = run_gameday(workdir, GamedaySettings())
    (workdir / "gameday.json").write_text(json.dumps(outcome.to_dict(), indent=2))
    return outcome


def test_every_scenario_pages_what_it_must_and_nothing_else(result):
    assert [v.scenario for v in result.verdicts] == [s.name for s in SCENARIOS]
    report = "\n".join(f"{v.scenario}: {dataclasses.asdict(v)}" for v in result.verdicts if not v.passed)
    assert result.passed, report + "\n" + "\n".join(f"{t:7.1f}s {event}" for t, event in result.timeline)
    summary = result.summary
    assert summary.false_pages == 0 and summary.missed_pages == 0
    assert summary.pages_received == summary.pages_expected > 0
    assert summary.diagnose_agreement == 1.0


def test_the_slow_burn_keeps_a_replaced_pods_errors(result):
    [rollback] = [v for v in result.verdicts if v.scenario == "rollback-to-off"]
    assert rollback.checks and all(rollback.checks.values()), rollback.checks


def _first_mitigation(alertname: str, scratch_dir: Path):
    path = RUNBOOKS_DIR / f"{alertname}.md"
    text = path.read_text()
    section = text[text.index("## Mitigation"):text.index("## Verify the fix")]
    # Not beside the runbook: under xdist, tests on the other worker read runbooks/*.md meanwhile
    # (test_runbooks would find a runbook with no alert, or one deleted between glob and read).
    scratch = scratch_dir / f"{alertname}.mitigation.md"
    scratch.write_text(section)
    return [dataclasses.replace(c, runbook=path.name) for c in _commands(scratch)]


def test_the_first_mitigation_of_every_alert_that_fired_targets_what_the_manifests_define(result, tmp_path):
    fired = {re.sub(r" \(.*\)$", "", received) for v in result.verdicts for received in v.received}
    assert fired
    rendered = {name: build(directory) for name, directory in OVERLAYS.items()}
    for alertname in sorted(fired):
        commands = _first_mitigation(alertname, tmp_path)
        assert commands, f"{alertname}: its Mitigation names no kubectl command"
        first = commands[0]
        checked = [name for name, documents in rendered.items() if _applies(first, documents)]
        assert checked, f"{alertname}: {first.text} applies to no shipped overlay"
        problems = {name: problem for name in checked if (problem := _problem(first, rendered[name]))}
        assert not problems, f"{alertname}: {first.text}: {problems}"
