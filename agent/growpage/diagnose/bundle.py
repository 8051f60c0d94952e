"""``--bundle FILE.tar.gz``: everything an incident ticket needs, replayable offline.

Contents: ``report.json`` and ``report.txt`` (the report as shown), ``build_info.json``, ``raw/``
(the expositions read, each with its ``# growpage-snapshot-time:`` line, or the Prometheus queries
and their results) and ``manifest.json``. ``gpctl diagnose --snapshot FILE.tar.gz`` re-runs the
diagnosis from an endpoint or snapshot bundle.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
import time
from pathlib import Path

from rich.console import Console

from growpage import __version__
from growpage.diagnose.errors import DiagnoseError
from growpage.diagnose.findings import Report
from growpage.diagnose.observations import Observations
from growpage.diagnose.render import render_text, to_json
from growpage.diagnose.sources.result import SourceResult

TEXT_WIDTH = 100


def check_writable(path: Path) -> None:
    """Fail before diagnosing, not after, when the bundle cannot be written."""
    parent = path.resolve().parent
    if not parent.is_dir():
        raise DiagnoseError(f"--bundle {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise DiagnoseError(f"--bundle {path}: directory {parent} is not writable")


def write_bundle(path: Path, report: Report, result: SourceResult) -> None:
    created_s = time.time()
    files: list[tuple[str, str]] = [
        ("report.json", to_json(report) + "\n"),
        ("report.txt", _text(report)),
        ("build_info.json", json.dumps(_build_info(result.observations), indent=2) + "\n"),
        *result.raw_files,
    ]
    manifest = {"gpctl_version": __version__, "created": created_s, "source": report.source,
                "files": [name for name, _ in files],
                "replay": ("gpctl diagnose --snapshot THIS_FILE" if report.source.get("kind") != "prometheus"
                           else "raw/prometheus-queries.json holds every query and result")}
    files.append(("manifest.json", json.dumps(manifest, indent=2) + "\n"))
    handle, temporary = tempfile.mkstemp(dir=path.resolve().parent, suffix=".partial")
    try:
        with os.fdopen(handle, "wb") as stream, tarfile.open(fileobj=stream, mode="w:gz") as archive:
            for name, text in files:
                data = text.encode("utf-8")
                member = tarfile.TarInfo(name)
                member.size, member.mtime, member.mode = len(data), int(created_s), 0o644
                archive.addfile(member, io.BytesIO(data))
        os.replace(temporary, path)  # atomic: a ticket never gets half a bundle
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        raise DiagnoseError(f"cannot write bundle {path}: {error}") from None


def _text(report: Report) -> str:
    console = Console(width=TEXT_WIDTH, record=True, file=io.StringIO(), color_system=None)
    render_text(report, console)
    return console.export_text()


def _build_info(observations: Observations) -> dict:
    return {"overall": [info.to_dict() for info in observations.overall.build_infos],
            "breakdown_label": observations.breakdown_label,
            "breakdown": {name: [info.to_dict() for info in scope.build_infos]
                          for name, scope in sorted(observations.breakdown.items())}}
