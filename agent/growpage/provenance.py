"""Where a measurement ran: the host's CPU kind, Python and the commit, recorded in every result JSON.

Benchmarks on this project's CPU hosts differ by their vector units (AVX2-only or AMX), so a number
without its host cannot be compared; stdlib only, so any tool can record it.
"""

from __future__ import annotations

import contextlib
import platform
import subprocess
from pathlib import Path


def cpu_kind(cpuinfo: str) -> str:
    """``amx``, ``avx512``, ``avx2`` or ``""``: the widest matrix or vector unit the flags line names."""
    line = next((row for row in cpuinfo.splitlines() if row.startswith("flags")), "")
    flags = set(line.split())
    return "amx" if "amx_tile" in flags else "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else ""


def _cpuinfo() -> str:
    """``/proc/cpuinfo`` ("" where it cannot be read: not Linux)."""
    with contextlib.suppress(OSError):
        return Path("/proc/cpuinfo").read_text()
    return ""


def host_cpu_kind() -> str:
    """This host's :func:`cpu_kind` ("" where unknown)."""
    return cpu_kind(_cpuinfo())


def host_facts() -> dict[str, str]:
    """The machine, its CPU kind and model name, Python, the commit GrowPage runs from ("" when unknown)
    and how many paths its checkout had changed beyond it (0: the commit's code; -1 when unknown)."""
    text = _cpuinfo()
    kind = cpu_kind(text)
    model = next((row.split(":", 1)[1].strip() for row in text.splitlines() if row.startswith("model name")), "")
    commit, uncommitted = "", -1
    here = Path(__file__).resolve().parent
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=here).stdout.strip()
        # a run from a checkout with changes ran code no commit holds: say so beside the commit
        status = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, timeout=5,
                                cwd=here)
        uncommitted = len(status.stdout.splitlines()) if status.returncode == 0 else -1
    return {"machine": platform.machine(), "cpu": kind, "cpu_model": model, "python": platform.python_version(),
            "commit": commit, "uncommitted_paths": uncommitted}
