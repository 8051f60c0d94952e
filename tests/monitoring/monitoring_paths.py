"""Paths of the committed, generated monitoring files (tests read what users import)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RULES_FILE = REPO_ROOT / "alerts" / "growpage-rules.yaml"
ALERT_TESTS_DIR = REPO_ROOT / "alerts" / "tests"
ALERTMANAGER_FILE = REPO_ROOT / "alerts" / "alertmanager.yaml"
RUNBOOKS_DIR = REPO_ROOT / "runbooks"
DEPLOY_DIR = REPO_ROOT / "deploy"
