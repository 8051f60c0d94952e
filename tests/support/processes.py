"""Servers the tests start in their own process group (``start_new_session=True``): waiting until one
serves, and stopping it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx

from growpage.gameday.promstack import wait_until


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM the process group (a vLLM server's API process, EngineCore, workers), then SIGKILL it."""
    try:
        pgid = os.getpgid(process.pid)
    except ProcessLookupError:
        return
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; children may still be exiting: make sure none survives.
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        break


def wait_serving(url: str, process: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    """Wait until ``url/health`` answers 200; fail with the end of the server's log when the process
    exits first (or, from ``wait_until``, when time runs out)."""
    def healthy() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"vLLM exited ({process.returncode}):\n{log_path.read_text(errors='replace')[-4000:]}")
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, timeout_s, interval_s=1.0, what=f"{url}/health")
