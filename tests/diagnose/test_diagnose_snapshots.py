"""``gpctl diagnose --snapshot``: one fixture per checklist branch, exact statuses and evidence."""

from __future__ import annotations

import io
import json
import os
import tarfile

import diagnose_scenarios as scenarios
import jsonschema
import pytest
from rich.console import Console

from gpctl.main import app
from growpage import catalog
from growpage.diagnose.checks import run_checks
from growpage.diagnose.checks.advice import setting_of
from growpage.diagnose.render import render_text
from growpage.diagnose.schema import REPORT_SCHEMA
from growpage.diagnose.sources import snapshot

CHECK_IDS = ["vllm-latency", "slo-utilization", "slo-compress-ratio", "slo-allocation-latency", "over-granting",
             "allocation-latency", "oom-fragmentation", "rollout", "agent-health"]
OK = dict.fromkeys(CHECK_IDS, "ok")
# Snapshots hold no history: the burn-rate checks are not checked (unknown), and never decide the
# verdict. On the reference engine no vLLM serves: its latency SLOs do not apply (ok).
NO_BURNS = {"vllm-latency": "unknown", "slo-allocation-latency": "unknown"}
NO_BURNS_REFERENCE = {"slo-allocation-latency": "unknown"}

# scenario -> (verdict, exit code, the checks that are not ok). Statuses follow the alerts' severity
# table: only pages are critical (stranded pages here); over-granting and slow grants are tickets.
BRANCHES = {
    "healthy": (scenarios.HEALTHY, "ok", 0, NO_BURNS),
    "over-granting": (scenarios.OVER_GRANTING, "warning", 1,
                      {**NO_BURNS_REFERENCE, "slo-utilization": "warning", "over-granting": "warning"}),
    "latency": (scenarios.LATENCY, "warning", 1,
                {**NO_BURNS, "allocation-latency": "warning", "rollout": "warning"}),
    # Stranded pages are over-granted pages (reference engine): both checks see them.
    "oom-fragmentation": (scenarios.OOM_FRAGMENTATION, "critical", 2,
                          {**NO_BURNS_REFERENCE, "slo-utilization": "warning", "over-granting": "warning",
                           "oom-fragmentation": "critical"}),
    "agent-errors": (scenarios.AGENT_ERRORS, "warning", 1, {**NO_BURNS, "agent-health": "warning"}),
    "compress-int8": (scenarios.COMPRESS_INT8, "warning", 1, {**NO_BURNS, "slo-compress-ratio": "warning"}),
    "phase-two-candidate": (scenarios.PHASE_TWO_CANDIDATE, "ok", 0, NO_BURNS),
    "mixed": (scenarios.MIXED, "critical", 2,
              {**NO_BURNS_REFERENCE, "slo-utilization": "warning", "over-granting": "warning",
               "allocation-latency": "warning", "oom-fragmentation": "critical"}),
    "partial": (scenarios.NO_LATENCY_HISTOGRAM, "ok", 0, {**NO_BURNS, "allocation-latency": "unknown"}),
    # An idle healthy pod is healthy: nothing burns, nothing is over-granted.
    "idle": (scenarios.IDLE, "ok", 0, NO_BURNS),
    "idle-monitor": (scenarios.IDLE.replace(build={**scenarios.IDLE.build, "mode": "monitor"}), "ok", 0, NO_BURNS),
    "idle-off": (scenarios.IDLE.replace(build={**scenarios.IDLE.build, "mode": "off"},
                                        components={"observer": "mode_off", "enforcer": "mode_off"}), "ok", 0,
                 {"vllm-latency": "unknown"}),
    # 8 % of first tokens after 2.5 s over one minute: the pages compare 5m to 3d windows, which
    # snapshots do not hold, so the burn is not checked (diagnose --prometheus judges it).
    "users-feel-it": (scenarios.SLOW_FIRST_TOKENS, "ok", 0, NO_BURNS),
    # GrowPage's own checks hold nothing in mode off; what users feel is vLLM's, judged in any mode.
    "mode-off": (scenarios.MODE_OFF, "ok", 0, {"vllm-latency": "unknown"}),
}


def run_json(runner, *args):
    result = runner.invoke(app, ["diagnose", "--output", "json", *args])
    assert "Traceback" not in result.output
    return result, (json.loads(result.stdout) if result.exit_code != 3 or result.stdout.strip() else None)


def checks_by_id(document):
    return {check["id"]: check for check in document["checks"]}


@pytest.mark.parametrize("branch", list(BRANCHES))
def test_each_branch_gives_its_verdict_statuses_and_exit_code(runner, write_snapshots, branch):
    scenario, verdict, exit_code, not_ok = BRANCHES[branch]
    result, document = run_json(runner, "--snapshot", *map(str, write_snapshots(scenario)))
    assert result.exit_code == exit_code, result.output
    assert document["status"] == verdict and document["exit_code"] == exit_code
    assert {check["id"]: check["status"] for check in document["checks"]} == {**OK, **not_ok}
    jsonschema.validate(document, REPORT_SCHEMA)


def test_json_is_stable_keys_and_order(runner, write_snapshots):
    _, document = run_json(runner, "--snapshot", *map(str, write_snapshots(scenarios.HEALTHY)))
    assert list(document) == ["schema_version", "status", "exit_code", "source", "counts", "notes", "not_checked",
                              "checks"]
    assert [check["id"] for check in document["checks"]] == CHECK_IDS
    for check in document["checks"]:
        assert list(check) == ["id", "title", "status", "severity", "summary", "evidence", "remediation",
                               "runbook_url", "breakdown", "alerts", "not_checked"]
        assert list(check["evidence"])[:4] == ["metric", "value", "threshold", "window"]
        assert check["runbook_url"].startswith("https://github.com/growpage/growpage/blob/main/runbooks/")
    assert document["source"]["window"] == {
        "kind": "snapshots", "start": "2024-05-01T10:00:00Z", "end": "2024-05-01T10:01:00Z", "duration_s": 60.0,
        "num_samples": 2, "description": "1m, 2 snapshots"}


def test_over_granting_evidence_and_suggestion(runner, write_snapshots):
    _, document = run_json(runner, "--snapshot", *map(str, write_snapshots(scenarios.OVER_GRANTING)))
    check = checks_by_id(document)["over-granting"]
    evidence = check["evidence"]
    assert (evidence["metric"], evidence["value"], evidence["threshold"]) == ("growpage_kv_page_utilization", 0.34, 0.4)
    assert evidence["mean"] == pytest.approx(0.32)
    assert (evidence["base_pages"], evidence["block_size"], evidence["grant_tokens"]) == (128, 16, 2048)
    # 4 finished requests/s for 60 s; lengths p50 320, p90 853.3, p99 1843.2 (bucket interpolation)
    assert evidence["requests_finished"] == pytest.approx(240)
    assert evidence["request_tokens_p50"] == pytest.approx(320)
    assert evidence["request_tokens_p90"] == pytest.approx(853.333333)
    assert evidence["request_tokens_p99"] == pytest.approx(1843.2)
    assert evidence["suggested_base_pages"] == 30  # floor(320 / (0.65 x 16))
    assert evidence["suggested_base_pages_formula"] == "max(1, floor(p50_tokens / (utilization_slo x block_size)))"
    assert check["remediation"][0].startswith("Set base_pages to 30 (now 128): floor(320 / (0.65 x 16)) = 30")


def test_latency_evidence(runner, write_snapshots):
    _, document = run_json(runner, "--snapshot", *map(str, write_snapshots(scenarios.LATENCY)))
    checks = checks_by_id(document)
    slo = checks["slo-allocation-latency"]["evidence"]
    assert slo["value"] == pytest.approx(0.85) and slo["threshold"] == 0.99
    assert (slo["grants"], slo["grants_within_threshold"]) == (pytest.approx(3000), pytest.approx(2550))
    assert slo["method"] == "bucket le=0.015 / all grants"
    latency = checks["allocation-latency"]
    assert latency["evidence"]["value"] == pytest.approx(0.075) and latency["evidence"]["threshold"] == 0.02
    assert latency["evidence"]["gpu"] == "NVIDIA H100 80GB HBM3"  # from DCGM's modelName
    assert latency["evidence"]["recommended_block_size"] == 32
    assert latency["evidence"]["throttled_share"] == pytest.approx(0.6)
    assert "block_size 16 on H100" in latency["summary"]
    assert any("not a vLLM rule" in step for step in latency["remediation"])


def test_oom_fragmentation_evidence_from_separate_dcgm_snapshots(runner, write_snapshots):
    paths = write_snapshots(scenarios.OOM_FRAGMENTATION, separate_dcgm=True)
    assert sorted(path.name for path in paths) == ["agent-1.prom", "agent-2.prom", "dcgm-1.prom", "dcgm-2.prom"]
    _, document = run_json(runner, "--snapshot", *map(str, paths))
    check = checks_by_id(document)["oom-fragmentation"]
    evidence = check["evidence"]
    assert evidence["value"] == pytest.approx(6) and evidence["preemptions"] == pytest.approx(12)
    assert evidence["gpu_framebuffer_used_max"] == pytest.approx(50000 / 81920, abs=1e-6)  # context only
    assert evidence["fragmentation_max"] == 0.62
    assert evidence["pool_free_fraction_min"] == pytest.approx(20 / 4000)
    assert evidence["stranded_slots_max"] == pytest.approx(0.66)
    assert "pages are stranded" in check["summary"]
    text = " ".join(check["remediation"])
    # It runs vLLM 0.32.1 in monitor mode: enforce is advised, an upgrade is not.
    assert "Run mode=enforce (now monitor)" in text and "Upgrade" not in text


def test_agent_errors_by_component(runner, write_snapshots):
    _, document = run_json(runner, "--snapshot", *map(str, write_snapshots(scenarios.AGENT_ERRORS)))
    evidence = checks_by_id(document)["agent-health"]["evidence"]
    assert evidence["value"] == pytest.approx(3) and evidence["errors_by_component"] == {"policy": pytest.approx(3)}


def test_partial_data_says_why_each_unknown(runner, write_snapshots):
    _, document = run_json(runner, "--snapshot", *map(str, write_snapshots(scenarios.NO_LATENCY_HISTOGRAM)))
    check = checks_by_id(document)["allocation-latency"]
    assert check["evidence"]["reason"] == "growpage_page_allocation_latency_seconds not found"


def test_one_snapshot_uses_totals_since_start_and_says_so(runner, write_snapshots):
    paths = write_snapshots(scenarios.OVER_GRANTING, count=1)
    result, document = run_json(runner, "--snapshot", str(paths[0]))
    assert result.exit_code == 1
    assert document["source"]["window"]["kind"] == "lifetime"
    assert any("totals since the agent started" in note for note in document["notes"])
    assert "one snapshot" in checks_by_id(document)["over-granting"]["summary"]


def test_snapshot_time_falls_back_to_the_file_mtime(runner, tmp_path):
    paths = []
    for index in range(2):
        path = tmp_path / f"s{index}.prom"
        path.write_text(scenarios.text_exposition(scenarios.samples(scenarios.LATENCY, index * 30.0, index)))
        os.utime(path, (1_714_557_600 + index * 30, 1_714_557_600 + index * 30))
        paths.append(path)
    _, document = run_json(runner, "--snapshot", *map(str, paths))
    assert document["source"]["window"]["duration_s"] == 30.0
    assert checks_by_id(document)["slo-allocation-latency"]["evidence"]["grants"] == pytest.approx(1500)


def test_snapshot_files_after_the_option_are_accepted_like_a_shell_glob(runner, write_snapshots):
    first, second = write_snapshots(scenarios.HEALTHY, dcgm=False)
    result = runner.invoke(app, ["diagnose", "--snapshot", str(first), str(second)])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("branch", list(BRANCHES))
def test_text_report_leads_with_the_verdict_and_fits_80_columns(write_snapshots, branch):
    scenario, verdict, exit_code, _ = BRANCHES[branch]
    report = run_checks(snapshot.observe(write_snapshots(scenario)).observations)
    console = Console(width=80, file=io.StringIO(), record=True, color_system=None)
    render_text(report, console)
    text = console.export_text()
    lines = text.splitlines()
    assert lines[0].startswith(f"VERDICT: {verdict.upper()} (exit {exit_code})")
    assert max(len(line) for line in lines) <= 80
    for finding in report.findings:
        assert f"[{finding.id}]" in text and finding.runbook_url.rsplit("/", 1)[-1] in text


def test_cli_text_output_at_80_columns(runner, write_snapshots):
    result = runner.invoke(app, ["diagnose", "--snapshot", *map(str, write_snapshots(scenarios.MIXED))])
    assert result.exit_code == 2
    assert result.stdout.startswith("VERDICT: CRITICAL (exit 2)")
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    # One recommendation per setting: the critical stranded-pages finding keeps the base_pages step.
    assert "fix 1. Lower base_pages (now 128)" in result.stdout


def test_bundle_holds_raw_data_and_report_and_replays(runner, write_snapshots, tmp_path):
    bundle = tmp_path / "incident.tar.gz"
    first = runner.invoke(app, ["diagnose", "--output", "json", "--bundle", str(bundle),
                                "--snapshot", *map(str, write_snapshots(scenarios.LATENCY, separate_dcgm=True))])
    assert first.exit_code == 1  # slow grants are a ticket
    with tarfile.open(bundle) as archive:
        names = archive.getnames()
        report = json.loads(archive.extractfile("report.json").read())
        text = archive.extractfile("report.txt").read().decode()
        build = json.loads(archive.extractfile("build_info.json").read())
    assert {"report.json", "report.txt", "build_info.json", "manifest.json"} <= set(names)
    assert sum(name.startswith("raw/") and name.endswith(".prom") for name in names) == 4
    assert report == json.loads(first.stdout)
    assert text.startswith("VERDICT: WARNING (exit 1)")
    assert build["overall"][0]["block_size"] == 16
    replay = runner.invoke(app, ["diagnose", "--output", "json", "--snapshot", str(bundle)])
    assert replay.exit_code == 1
    assert [c["status"] for c in json.loads(replay.stdout)["checks"]] == [c["status"] for c in report["checks"]]


@pytest.mark.parametrize("branch", ["oom-fragmentation", "mixed", "latency"])
def test_one_recommendation_per_setting_across_the_whole_report(runner, write_snapshots, branch):
    _, document = run_json(runner, "--snapshot", *map(str, write_snapshots(BRANCHES[branch][0])))
    steps = [step for check in document["checks"] for step in check["remediation"]]
    settings = [setting_of(step) for step in steps if setting_of(step)]
    assert len(settings) == len(set(settings)), steps
    text = " ".join(steps)
    assert not ("--block-size 32" in text and "Lower block_size" in text)


def test_nan_and_inf_are_unknown_and_said_so(runner, write_snapshots, tmp_path):
    paths = write_snapshots(scenarios.OOM_FRAGMENTATION)
    for path in paths:  # the agent exports garbage for two counters
        text = path.read_text()
        lines = []
        for line in text.splitlines():
            if line.startswith(catalog.OOM_EVENTS.name + "{"):
                line = line.rsplit(" ", 1)[0] + " +Inf"
            if line.startswith(catalog.COMPRESS_OUTPUT_BYTES.name + "{"):
                line = line.rsplit(" ", 1)[0] + " NaN"
            lines.append(line)
        path.write_text("\n".join(lines) + "\n")
    _, document = run_json(runner, "--snapshot", *map(str, paths))
    checks = checks_by_id(document)
    rendered = json.dumps(document)
    assert "inf OOM" not in rendered.lower() and "reached inf" not in rendered
    assert any("NaN or Inf" in note and catalog.OOM_EVENTS.name in note for note in document["notes"])
    compress = checks["slo-compress-ratio"]
    assert compress["status"] == "unknown" and "NaN or Inf" in compress["evidence"]["reason"]
    assert "no compressions" not in compress["summary"]
    assert checks["agent-health"]["status"] == "warning"
    assert catalog.OOM_EVENTS.name in checks["agent-health"]["evidence"]["non_finite"]


def test_an_inactive_component_is_an_agent_health_finding(runner, write_snapshots):
    scenario = scenarios.HEALTHY.replace(components={"observer": "active", "enforcer": "full_cudagraph"})
    _, document = run_json(runner, "--snapshot", *map(str, write_snapshots(scenario)))
    health = checks_by_id(document)["agent-health"]
    assert health["status"] == "warning" and "enforcer (full_cudagraph)" in health["summary"]
    assert health["evidence"]["inactive_components"] == {"enforcer": "full_cudagraph"}
    off = scenarios.HEALTHY.replace(components={"observer": "mode_off", "enforcer": "mode_off"},
                                    build={**scenarios.HEALTHY.build, "mode": "off"})
    _, document = run_json(runner, "--snapshot", *map(str, write_snapshots(off)))
    assert "inactive" not in checks_by_id(document)["agent-health"]["summary"]


def test_vllm_metrics_saved_separately_attach_to_the_snapshot_of_the_same_time(runner, tmp_path):
    scenario, start_s = scenarios.SLOW_FIRST_TOKENS, 1_714_557_600.0
    paths = scenarios.write_snapshots(tmp_path, scenario, start_s=start_s, vllm=False)
    for index in range(2):
        rows = scenarios.vllm_samples(scenario, index * 60.0)
        path = tmp_path / f"vllm-{index + 1}.prom"
        path.write_text(scenarios.text_exposition(rows, start_s + index * 60.0), encoding="utf-8")
        paths.append(path)
    _, document = run_json(runner, "--snapshot", *map(str, paths))
    check = checks_by_id(document)["vllm-latency"]
    assert check["evidence"]["within_slo"] == {"vllm_time_to_first_token": pytest.approx(0.92),
                                               "vllm_inter_token_latency": 1.0}, check
    assert check["status"] == "unknown" and "burn-rate alerts not checked" in check["not_checked"]["reason"]
    stray = tmp_path / "vllm-late.prom"
    stray.write_text(scenarios.text_exposition(scenarios.vllm_samples(scenario, 0.0), start_s + 30), encoding="utf-8")
    result = runner.invoke(app, ["diagnose", "--snapshot", *map(str, paths), str(stray)])
    assert result.exit_code == 3 and "no GrowPage snapshot of the same time" in result.output


def test_a_pod_in_mode_off_is_never_a_finding_even_while_its_users_wait(runner, write_snapshots):
    _, document = run_json(runner, "--snapshot", *map(str, write_snapshots(scenarios.MODE_OFF)))
    checks = checks_by_id(document)
    assert document["status"] == "ok" and not any(check["alerts"] for check in document["checks"])
    assert checks["slo-allocation-latency"]["summary"].startswith("mode off")


def test_the_mixin_config_gives_diagnose_the_thresholds_the_alerts_use(runner, write_snapshots, tmp_path):
    # 92 % of first tokens within 2.5 s pages by default; a deployment whose TTFT SLO is 5 s does
    # not page on it, and diagnose given its config agrees.
    paths = list(map(str, write_snapshots(scenarios.SLOW_FIRST_TOKENS)))
    config = tmp_path / "growpage-mixin.yaml"
    config.write_text("thresholds:\n  vllm_ttft_s: 5.0\n")
    _, document = run_json(runner, "--snapshot", *paths)
    assert checks_by_id(document)["vllm-latency"]["evidence"]["within_slo"]["vllm_time_to_first_token"] == \
        pytest.approx(0.92)
    _, document = run_json(runner, "--snapshot", *paths, "--mixin-config", str(config))
    latency = checks_by_id(document)["vllm-latency"]
    assert "(5 s, 100 ms)" in latency["title"], latency
    assert latency["evidence"]["within_slo"]["vllm_time_to_first_token"] == 1.0


def test_a_growpage_only_snapshot_is_ok_and_lists_what_was_not_checked(runner, write_snapshots):
    # /metrics/growpage saved without vLLM's /metrics: every GrowPage check runs and is ok; the
    # user-facing check only lacks vLLM's histograms, and says what to save.
    result, document = run_json(runner, "--snapshot", *map(str, write_snapshots(scenarios.HEALTHY, vllm=False)))
    assert (result.exit_code, document["status"]) == (0, "ok"), result.output
    jsonschema.validate(document, REPORT_SCHEMA)
    listed = {item["id"]: item for item in document["not_checked"]}
    assert set(listed) == {"vllm-latency", "slo-allocation-latency"}
    assert "save vLLM's /metrics beside /metrics/growpage" in listed["vllm-latency"]["to_check"]
    assert "--prometheus" in listed["slo-allocation-latency"]["to_check"]
    assert not any(item["in_part"] for item in listed.values())
    text = " ".join(runner.invoke(app, ["diagnose", "--snapshot", *map(str, write_snapshots(
        scenarios.HEALTHY, vllm=False))]).output.split())
    assert text.startswith("VERDICT: OK (exit 0): 7 ok, 2 not checked"), text
    assert "Not checked (left out of the verdict), and how to check it: [vllm-latency]" in text


def test_exit_3_only_when_nothing_could_be_read(runner, tmp_path):
    empty = tmp_path / "empty.prom"
    empty.write_text("")
    result = runner.invoke(app, ["diagnose", "--snapshot", str(empty)])
    assert result.exit_code == 3 and len(result.output.strip().splitlines()) == 1, result.output
    # Build info alone is something read: what it tells (mode, health) is checked, the rest listed.
    build_only = tmp_path / "build.prom"
    build_only.write_text(scenarios.text_exposition(
        [row for row in scenarios.samples(scenarios.HEALTHY, 0.0) if row.family == catalog.BUILD_INFO.name]))
    result, document = run_json(runner, "--snapshot", str(build_only))
    assert result.exit_code == 0 and document["status"] == "ok", result.output
    assert {item["id"] for item in document["not_checked"]} >= {"slo-utilization", "over-granting",
                                                                "allocation-latency", "oom-fragmentation"}
