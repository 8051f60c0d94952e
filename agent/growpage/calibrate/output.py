"""The calibrated config file (YAML under ``growpage:``, evidence in a comment block), and JSON.

The file is written atomically and only after :func:`growpage.config.load_config` has read it back
from a temporary file next to the target: a file calibrate writes always loads.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from growpage import __version__
from growpage.calibrate.evidence import Evidence
from growpage.calibrate.thresholds import Calibration, Setting
from growpage.config import load_config
from growpage.errors import GrowPageError

TOP_LEVEL_KEY = "growpage"


def check_writable(path: Path) -> None:
    """Fail before reading any source, not after, when ``path`` cannot be written."""
    if path.is_dir():
        raise GrowPageError(f"--output {path} is a directory: pass a file name, "
                            f"e.g. {path / 'growpage-calibrated.yaml'}")
    parent = path.resolve().parent
    if not parent.is_dir():
        raise GrowPageError(f"--output {path}: directory {parent} does not exist; create it or pick another path")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise GrowPageError(f"--output {path} is not writable: pick a path you can write, or use --dry-run")


def _explain(setting: Setting, calibration: Calibration) -> str:
    quantile = f"q{setting.quantile:g} of {setting.metric}"
    if setting.name == "base_pages":
        quantile = f"ceil({quantile} = {setting.observed:.6g} tokens / block_size {calibration.block_size})"
    notes = "".join(f"; {note}" for note in setting.notes)
    return f"#   {setting.name}: {setting.value}  <- {quantile}, {count_text(setting.samples)} samples{notes}"


def count_text(count: float) -> str:
    """``1234567`` stays whole; Prometheus' extrapolated ``1079.278`` keeps one decimal (never 1.2e+06)."""
    return str(int(count)) if float(count).is_integer() else f"{count:.1f}"


def render_yaml(calibration: Calibration, evidence: Evidence, command: str,
                created: datetime.datetime | None = None) -> str:
    """The config file: a comment block with the evidence, then the settings under ``growpage:``."""
    created = created or datetime.datetime.now(datetime.UTC)
    model = calibration.model or "(series without a model_name label)"
    lines = [
        f"# GrowPage settings calibrated by gpctl calibrate (growpage {__version__}), "
        f"{created.strftime('%Y-%m-%dT%H:%M:%SZ')}",
        f"# Command: {command}",
        f"# Source: {evidence.source.get('kind')} {evidence.source.get('target')}"
        + (f" {evidence.source['selector']}" if evidence.source.get("selector", "{}") != "{}" else ""),
        f"# Window: {evidence.window.describe()}",
        f"# Model: {model}; block_size {calibration.block_size} from {calibration.block_size_from}",
        "# Samples: " + ", ".join(f"{name} {count_text(count)}" for name, count in _samples(calibration).items()),
        "# Quantiles from histogram buckets, linear inside the bucket (as histogram_quantile):",
        *(_explain(setting, calibration) for setting in calibration.settings),
    ]
    if calibration.rollout_candidates:
        lines.append("# Rollout candidates (LTS entropy p50 above rollout_entropy_threshold): "
                     + ", ".join(f"namespace {name} (p50 {p50:.4g})"
                                 for name, p50 in calibration.rollout_candidates.items()))
    if calibration.rollout is not None:
        settings = "".join(f"; set {key}: {value}" for key, value in calibration.rollout.settings.items())
        lines.append(f"# Rollout (monitor's forecast of enforce): {calibration.rollout.verdict}: "
                     f"{calibration.rollout.reason}{settings}")
    lines.append("# Everything else keeps GrowPageConfig's defaults; review before enforcing.")
    body = yaml.safe_dump({TOP_LEVEL_KEY: calibration.config_values()}, sort_keys=False, default_flow_style=False)
    return "\n".join(lines) + "\n" + body


def _samples(calibration: Calibration) -> dict[str, float]:
    return {setting.metric: setting.samples for setting in calibration.settings}


def write_config(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, after ``load_config`` accepted it.

    Raises:
        GrowPageError: the directory cannot be written.
    """
    try:
        handle, temporary = tempfile.mkstemp(dir=path.resolve().parent, prefix=f".{path.name}.", suffix=".yaml")
    except OSError as error:
        raise _cannot_write(path, error) from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        load_config(temporary, env={})  # a ConfigError here is a calibrate bug: it propagates
        os.replace(temporary, path)  # atomic: a deployment never reads half a file
    except OSError as error:
        raise _cannot_write(path, error) from None
    finally:
        Path(temporary).unlink(missing_ok=True)


def _cannot_write(path: Path, error: OSError) -> GrowPageError:
    return GrowPageError(f"cannot write --output {path} ({error.strerror}): pick a writable path or use --dry-run")


def to_json(calibration: Calibration, evidence: Evidence, command: str, written: Path | None) -> str:
    """The summary for scripts: the values, the evidence behind each, and where the file went."""
    document: dict[str, Any] = {
        "model": calibration.model,
        "source": {key: value for key, value in evidence.source.items() if key not in ("where", "wider")},
        "window": evidence.window.to_dict(),
        "block_size": calibration.block_size,
        "block_size_from": calibration.block_size_from,
        "settings": {setting.name: {"value": setting.value, "metric": setting.metric, "quantile": setting.quantile,
                                    "observed": round(setting.observed, 6), "samples": setting.samples,
                                    "notes": list(setting.notes)}
                     for setting in calibration.settings},
        "rollout_candidates": {name: round(p50, 6) for name, p50 in calibration.rollout_candidates.items()},
        "rollout": calibration.rollout.to_dict() if calibration.rollout is not None else None,
        "config": {TOP_LEVEL_KEY: calibration.config_values()},
        "command": command,
        "output": str(written) if written is not None else None,
    }
    return json.dumps(document, indent=2)
