"""`gpctl dashboards build` / `gpctl alerts build`: committed files are current; --check catches drift."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from monitoring_paths import REPO_ROOT
from typer.testing import CliRunner

from gpctl.main import app
from growpage.monitoring.artefacts import ALERT_TESTS_DIR, find_repo_root

runner = CliRunner()
KINDS = ("dashboards", "alerts")


@pytest.mark.parametrize("kind", KINDS)
def test_committed_files_are_up_to_date(kind):
    result = runner.invoke(app, [kind, "build", "--check", "--root", str(REPO_ROOT)])
    assert result.exit_code == 0, result.output
    assert "up to date" in result.output


@pytest.fixture
def checkout(tmp_path):
    """A copy of what the generators read and write."""
    for folder in ("dashboards", "alerts", "runbooks", "deploy"):
        shutil.copytree(REPO_ROOT / folder, tmp_path / folder)
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def test_check_names_stale_files_in_one_line_and_build_repairs_them(checkout):
    (checkout / "dashboards" / "growpage-overview.json").write_text("{}\n")
    (checkout / ALERT_TESTS_DIR / "GrowPageRetired.test.yaml").write_text("tests: []\n")
    stale = runner.invoke(app, ["dashboards", "build", "--check", "--root", str(checkout)])
    assert stale.exit_code == 1
    assert stale.output.strip().count("\n") == 0 and "dashboards/growpage-overview.json" in stale.output
    assert "GrowPageRetired" in runner.invoke(app, ["alerts", "build", "--check", "--root", str(checkout)]).output

    for kind in KINDS:
        assert runner.invoke(app, [kind, "build", "--root", str(checkout)]).exit_code == 0
        assert runner.invoke(app, [kind, "build", "--check", "--root", str(checkout)]).exit_code == 0
    assert not (checkout / ALERT_TESTS_DIR / "GrowPageRetired.test.yaml").exists()


def test_a_missing_runbook_is_a_one_line_user_error(checkout):
    (checkout / "runbooks" / "GrowPageAgentDown.md").unlink()
    result = runner.invoke(app, ["alerts", "build", "--root", str(checkout)])
    assert result.exit_code == 2
    assert "runbooks/GrowPageAgentDown.md" in result.output


def test_repo_root_is_found_from_a_subfolder():
    assert find_repo_root(REPO_ROOT / "runbooks") == REPO_ROOT


def test_a_mixin_config_builds_its_own_rules_and_dashboards_and_checks_against_them(checkout):
    options = ["--cluster-label", "k8s_cluster", "--runbook-url", "https://runbooks.example.org/growpage/{alert}"]
    for kind in KINDS:
        assert runner.invoke(app, [kind, "build", "--root", str(checkout), *options]).exit_code == 0
        assert runner.invoke(app, [kind, "build", "--check", "--root", str(checkout), *options]).exit_code == 0
        assert runner.invoke(app, [kind, "build", "--check", "--root", str(checkout)]).exit_code == 1
    rules = (checkout / "alerts" / "growpage-rules.yaml").read_text()
    assert "by (k8s_cluster, namespace, model_name)" in rules and "by (cluster," not in rules
    assert "https://runbooks.example.org/growpage/GrowPageKVPagesStranded" in rules
    board = (checkout / "dashboards" / "growpage-troubleshooting.json").read_text()
    assert 'k8s_cluster=~\\"$cluster\\"' in board and "https://runbooks.example.org/growpage/" in board


def test_runbook_url_pattern_must_name_the_alert(checkout):
    result = runner.invoke(app, ["alerts", "build", "--root", str(checkout), "--runbook-url", "https://x/"])
    assert result.exit_code == 2 and "{alert}" in result.output


def test_a_mixin_config_file_builds_and_checks_with_the_same_file(checkout, tmp_path):
    empty = tmp_path / "defaults.yaml"
    empty.write_text("# every key left out keeps its default\n")
    for kind in KINDS:  # the default config, spelled as a file, is the committed build
        assert runner.invoke(app, [kind, "build", "--check", "--root", str(checkout), "--mixin-config",
                                   str(empty)]).exit_code == 0
    custom = tmp_path / "growpage-mixin.json"
    custom.write_text(json.dumps({"cluster_label": "k8s_cluster", "thresholds": {"checklist": {
        "fragmentation_high": 0.6}}}))
    for kind in KINDS:
        built = runner.invoke(app, [kind, "build", "--root", str(checkout), "--mixin-config", str(custom)])
        assert built.exit_code == 0, built.output
        assert runner.invoke(app, [kind, "build", "--check", "--root", str(checkout), "--mixin-config",
                                   str(custom)]).exit_code == 0
        stale = runner.invoke(app, [kind, "build", "--check", "--root", str(checkout)])
        assert stale.exit_code == 1 and "with the same options" not in stale.output
    rules = yaml.safe_load((checkout / "alerts" / "growpage-rules.yaml").read_text())["groups"]
    [fragmentation] = [rule for group in rules for rule in group["rules"]
                       if rule.get("alert") == "GrowPageFragmentationHigh"]
    first_line = fragmentation["expr"].splitlines()[0]
    assert first_line == "namespace_pod_model_name:growpage_page_table_fragmentation:ratio > 0.6"
    assert "k8s_cluster" in fragmentation["expr"]


@pytest.mark.parametrize(("content", "words"), [
    ("thresholds:\n  checklist:\n    fragmentaton_high: 0.6\n", ["unknown key thresholds.checklist.fragmentaton_high",
                                                                "fragmentation_high"]),
    ("thresholds: {vllm_ttft_s: fast}\n", ["thresholds.vllm_ttft_s must be a number"]),
    ("cluster_label: [a\n", ["not valid YAML or JSON", "line"]),
    (None, ["cannot read the mixin config"]),
])
@pytest.mark.parametrize("command", [["alerts", "build"], ["dashboards", "build", "--check"], ["diagnose"]])
def test_a_bad_mixin_config_is_one_line_naming_the_fix(command, content, words, tmp_path, checkout):
    path = tmp_path / "growpage-mixin.yaml"
    if content is not None:
        path.write_text(content)
    source = ["--snapshot", str(tmp_path / "none.prom")] if command == ["diagnose"] else ["--root", str(checkout)]
    result = runner.invoke(app, [*command, *source, "--mixin-config", str(path)])
    assert result.exit_code == (3 if command == ["diagnose"] else 2), result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith("error: ") and all(word in line for word in words), line
    if command[0] == "alerts":
        assert not runner.invoke(app, ["alerts", "build", "--check", "--root", str(checkout)]).exit_code
