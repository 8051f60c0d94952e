"""The generated, committed files, and the build / ``--check`` logic ``gpctl`` runs over them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from growpage.errors import GrowPageError
from growpage.monitoring.alert_tests import alert_test_files
from growpage.monitoring.alertmanager import alertmanager_yaml
from growpage.monitoring.dashboards import dashboards, to_json_text
from growpage.monitoring.kubernetes import dashboard_configmaps_yaml
from growpage.monitoring.mixin import DEFAULT_CONFIG, MixinConfig
from growpage.monitoring.rules_file import dump_yaml, generated_header, prometheus_rule_yaml, rules_yaml
from growpage.monitoring.runbook_sections import runbook_files

RULES_FILE = "alerts/growpage-rules.yaml"
ALERT_TESTS_DIR = "alerts/tests"
ALERT_TEST_SUFFIX = ".test.yaml"
ALERTMANAGER_FILE = "alerts/alertmanager.yaml"
DASHBOARDS_DIR = "dashboards"
RUNBOOKS_DIR = "runbooks"
# Cluster-wide, applied once (deploy/monitoring), never with each model's application overlay.
PROMETHEUS_RULE_FILE = "deploy/components/monitoring/prometheusrule.yaml"
DASHBOARD_CONFIGMAPS_FILE = "deploy/components/monitoring/grafana-dashboards.yaml"


@dataclasses.dataclass(frozen=True)
class Artefact:
    """A generated file: its path relative to the repository root and its full content."""

    path: str
    content: str


def find_repo_root(start: Path | None = None) -> Path:
    """The GrowPage checkout: from ``start`` (default: the working directory) upwards, else the
    checkout this package is installed from (editable installs).

    Raises:
        GrowPageError: no folder with pyproject.toml, dashboards/ and alerts/ was found.
    """
    def is_root(path: Path) -> bool:
        return all((path / name).exists() for name in ("pyproject.toml", DASHBOARDS_DIR, "alerts"))

    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents, *Path(__file__).resolve().parents):
        if is_root(candidate):
            return candidate
    raise GrowPageError(f"cannot find the GrowPage checkout from {here} (a folder with pyproject.toml, "
                        f"dashboards/ and alerts/); run gpctl inside it or pass --root")


def dashboard_artefacts(config: MixinConfig = DEFAULT_CONFIG) -> list[Artefact]:
    files = [Artefact(f"{DASHBOARDS_DIR}/{name}", to_json_text(doc)) for name, doc in dashboards(config).items()]
    return [*files, Artefact(DASHBOARD_CONFIGMAPS_FILE, dashboard_configmaps_yaml(config))]


def alert_artefacts(root: Path, config: MixinConfig = DEFAULT_CONFIG) -> list[Artefact]:
    """Rules, promtool tests, Alertmanager config, PrometheusRule and the runbooks' generated blocks."""
    header = generated_header("alerts build")
    tests = [Artefact(f"{ALERT_TESTS_DIR}/{name}{ALERT_TEST_SUFFIX}", dump_yaml(doc, header))
             for name, doc in alert_test_files(config).items()]

    def read_runbook(name: str) -> str | None:
        path = root / RUNBOOKS_DIR / name
        return path.read_text(encoding="utf-8") if path.is_file() else None

    runbooks = [Artefact(f"{RUNBOOKS_DIR}/{name}", text)
                for name, text in runbook_files(read_runbook, config).items()]
    return [
        Artefact(RULES_FILE, rules_yaml(config=config)), *tests, Artefact(ALERTMANAGER_FILE, alertmanager_yaml(config)),
        Artefact(PROMETHEUS_RULE_FILE, prometheus_rule_yaml(config)), *runbooks,
    ]


def _orphan_alert_tests(root: Path, artefacts: list[Artefact]) -> list[str]:
    """Generated test files whose alert no longer exists (only when building the alerts)."""
    wanted = {a.path for a in artefacts}
    if not any(path.startswith(f"{ALERT_TESTS_DIR}/") for path in wanted):
        return []
    folder = root / ALERT_TESTS_DIR
    found = sorted(folder.glob(f"*{ALERT_TEST_SUFFIX}")) if folder.is_dir() else []
    return [str(p.relative_to(root)) for p in found if str(p.relative_to(root)) not in wanted]


def stale_paths(root: Path, artefacts: list[Artefact]) -> list[str]:
    """Paths whose committed content differs from what the generator makes now (or that should go)."""
    stale = [a.path for a in artefacts
             if not (root / a.path).is_file() or (root / a.path).read_text(encoding="utf-8") != a.content]
    return stale + _orphan_alert_tests(root, artefacts)


def write_artefacts(root: Path, artefacts: list[Artefact]) -> list[str]:
    """Writes what changed, removes orphaned alert tests; returns the paths it touched."""
    touched = []
    for path in _orphan_alert_tests(root, artefacts):
        (root / path).unlink()
        touched.append(path)
    for artefact in artefacts:
        target = root / artefact.path
        if target.is_file() and target.read_text(encoding="utf-8") == artefact.content:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(artefact.content, encoding="utf-8")
        touched.append(artefact.path)
    return touched


BUILDERS: dict[str, Callable[[Path, MixinConfig], list[Artefact]]] = {
    "dashboards": lambda root, config: dashboard_artefacts(config),
    "alerts": alert_artefacts,
}


@dataclasses.dataclass(frozen=True)
class BuildResult:
    """What a build or a check found: ``stale`` (check) or ``written`` (build) paths."""

    stale: list[str]
    written: list[str]


def build(kind: str, root: Path, check: bool, config: MixinConfig = DEFAULT_CONFIG) -> BuildResult:
    """Regenerates the ``kind`` artefacts ("dashboards" or "alerts") under ``root`` for ``config``, or
    with ``check`` only lists the stale ones (CI runs the check; nothing is written)."""
    artefacts = BUILDERS[kind](root, config)
    if check:
        return BuildResult(stale=stale_paths(root, artefacts), written=[])
    return BuildResult(stale=[], written=write_artefacts(root, artefacts))
