"""Stopping a server the tests started in its own process group (``start_new_session=True``)."""

from __future__ import annotations

import os
import signal
import subprocess


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
