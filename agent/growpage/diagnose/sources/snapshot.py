"""Offline source: saved expositions (files, or a ``gpctl diagnose --bundle`` tarball).

The time of a snapshot is its ``# growpage-snapshot-time: <unix seconds>`` line when it has one
(``--bundle`` writes it), else the file's modification time (a tarball member's own mtime). Files
with ``growpage_*`` series are agent snapshots; files with DCGM framebuffer series are GPU
snapshots (one file may be both). With two or more agent snapshots, rates are computed between
the oldest and the newest; with one, counters are totals since the agent started.
"""

from __future__ import annotations

import dataclasses
import os
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from growpage import catalog
from growpage.diagnose.errors import DiagnoseError
from growpage.diagnose.exposition import Exposition, parse_exposition, snapshot_time, with_snapshot_time
from growpage.diagnose.scrapes import observations_from_expositions
from growpage.diagnose.sources.result import SourceResult

BUNDLE_EXPOSITION_SUFFIXES = (".prom", ".om")  # report.txt in a bundle is not an exposition


def observe(paths: Sequence[Path], dcgm_labels: Mapping[str, str] | None = None) -> SourceResult:
    """Observations from ``paths``; raises DiagnoseError naming the file for unreadable input.

    Args:
        dcgm_labels: target -> source label naming the GPU's user in DCGM series.
    """
    if not paths:
        raise DiagnoseError("--snapshot needs at least one file")
    texts: list[tuple[str, str, float]] = []  # (origin, text, time)
    for path in paths:
        texts += _read(Path(path))
    expositions = [parse_exposition(text, origin, time_s) for origin, text, time_s in texts]
    for exposition in expositions:
        if not exposition.has_growpage and not exposition.has_dcgm and not exposition.has_vllm:
            raise DiagnoseError(f"{exposition.origin} has no growpage_*, vllm:* or {catalog.DCGM_FB_USED} series: "
                                f"save the agent's {catalog.METRICS_PATH} (or vLLM's or a DCGM exporter's /metrics)")
    agent = _with_vllm(sorted((e for e in expositions if e.has_growpage), key=lambda e: e.time_s),
                       [e for e in expositions if e.has_vllm and not e.has_growpage])
    dcgm = [e for e in expositions if e.has_dcgm]
    if not agent:
        raise DiagnoseError("no snapshot has growpage_* series: add a saved "
                            f"{catalog.METRICS_PATH} exposition next to the DCGM one")
    for earlier, later in zip(agent, agent[1:], strict=False):
        if later.time_s == earlier.time_s:
            raise DiagnoseError(
                f"snapshots {earlier.origin} and {later.origin} have the same time ({later.time_s:.3f}): "
                "rates need different times; add a '# growpage-snapshot-time: <unix seconds>' first line "
                "(file copies lose their modification times)")
    source = {"kind": "snapshot", "target": ", ".join(str(path) for path in paths),
              "files": [e.origin for e in expositions]}
    raw = tuple((f"raw/{i + 1:02d}-{Path(e.origin.split(':')[-1]).name}", with_snapshot_time(e.text, e.time_s))
                for i, e in enumerate(sorted(expositions, key=lambda e: e.time_s)))
    return SourceResult(observations_from_expositions(agent, dcgm, source, sample_noun="snapshots",
                                                      dcgm_labels=dcgm_labels),
                        raw_files=raw)


def _with_vllm(agent: list[Exposition], vllm: list[Exposition]) -> list[Exposition]:
    """Agent snapshots with vLLM's series of the same time added (a separately saved vLLM /metrics)."""
    by_time = {exposition.time_s: exposition for exposition in agent}
    for exposition in vllm:
        if exposition.time_s not in by_time:
            raise DiagnoseError(f"{exposition.origin} (vLLM's metrics) has no GrowPage snapshot of the same time "
                                f"({exposition.time_s:.3f}): give both the same '# growpage-snapshot-time:' line, "
                                "or save them into one file")
        target = by_time[exposition.time_s]
        extra = tuple(sample for sample in exposition.samples if sample.name.startswith("vllm:"))
        by_time[exposition.time_s] = dataclasses.replace(target, samples=(*target.samples, *extra))
    return [by_time[exposition.time_s] for exposition in agent]


def _read(path: Path) -> list[tuple[str, str, float]]:
    if not path.exists():
        raise DiagnoseError(f"snapshot {path} does not exist")
    if path.is_dir():
        raise DiagnoseError(f"snapshot {path} is a directory: pass the files (e.g. {path}/*.prom)")
    if tarfile.is_tarfile(path):
        return _read_bundle(path)
    data = path.read_bytes()
    return [(str(path), _decode(data, str(path)), _time_of_text(data, os.path.getmtime(path)))]


def _read_bundle(path: Path) -> list[tuple[str, str, float]]:
    found = []
    try:
        with tarfile.open(path) as bundle:
            for member in bundle.getmembers():
                if member.isfile() and member.name.endswith(BUNDLE_EXPOSITION_SUFFIXES):
                    member_file = bundle.extractfile(member)
                    if member_file is None:
                        continue
                    data = member_file.read()
                    origin = f"{path}:{member.name}"
                    found.append((origin, _decode(data, origin), _time_of_text(data, member.mtime)))
    except (tarfile.TarError, OSError) as error:
        raise DiagnoseError(f"cannot read bundle {path} ({error}): is it a gpctl diagnose --bundle file?") from None
    if not found:
        raise DiagnoseError(f"bundle {path} holds no *.prom expositions: is it a gpctl diagnose --bundle file?")
    return found


def _decode(data: bytes, origin: str) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DiagnoseError(f"snapshot {origin} is not UTF-8 text: save the exposition as text "
                            f"(curl -s http://AGENT{catalog.METRICS_PATH} > file.prom)") from None
    if not text.strip():
        raise DiagnoseError(f"snapshot {origin} is empty")
    return text


def _time_of_text(data: bytes, fallback_s: float) -> float:
    written = snapshot_time(data.decode("utf-8", errors="replace"))
    return written if written is not None else float(fallback_s)
