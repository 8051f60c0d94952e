"""Real Prometheus and Alertmanager on free loopback ports, stopped after: the game day's and the tests'.

The Debian packages (``scripts/install-system-deps.sh``) provide ``prometheus``,
``prometheus-alertmanager``, ``promtool`` and ``amtool``. Nothing here is mocked: callers talk to the
real servers over HTTP.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

PROMETHEUS = "prometheus"
ALERTMANAGER = "prometheus-alertmanager"


def require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise RuntimeError(f"{binary} is not installed; run scripts/install-system-deps.sh as root")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_get_json(url: str, timeout_s: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (loopback only)
        return json.loads(response.read())


# Waits return as soon as their condition holds; their limits only bound how long a hung component
# is waited for. Machines running the suite are shared and noisy (a 2-core machine under a load of
# 14 took 5-10x longer than idle), so every limit is stretched by this factor: a slow machine
# waits longer, a fast one is not slowed down, and nothing depends on how fast anything ran.
PATIENCE = float(os.environ.get("GROWPAGE_TEST_PATIENCE", "5"))


def wait_until(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.2,
               what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value (returned) or ``timeout_s * PATIENCE`` runs out."""
    timeout_s *= PATIENCE
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (OSError, urllib.error.URLError, ValueError, KeyError, httpx.HTTPError) as exc:  # not up yet
            last_error = exc
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}"
                       + (f" (last error: {last_error})" if last_error else ""))


def run_tool(*args: str, input_text: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run promtool/amtool; returns the completed process (stdout+stderr as text)."""
    require(args[0])
    # a hang guard, not a timing check: promtool over every rule file took 2m46s on a loaded 2-core machine
    result = subprocess.run(args, input=input_text, capture_output=True, text=True, timeout=900)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def promtool_test_rules(paths: list[Path]) -> str:
    """``promtool test rules`` over ``paths``, one process per CPU on a share of the files (promtool
    runs its files one after another); every process must pass. Returns their stdout, joined."""
    require("promtool")
    groups = [paths[start::max(1, os.cpu_count() or 1)] for start in range(min(len(paths), os.cpu_count() or 1))]
    processes = [subprocess.Popen(["promtool", "test", "rules", *map(str, group)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for group in groups]
    outputs = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=900)  # a hang guard, not a timing check
        if process.returncode != 0:
            raise AssertionError(f"promtool test rules failed ({process.returncode}):\n{stdout}\n{stderr}")
        outputs.append(stdout)
    return "\n".join(outputs)


class _Server:
    def __init__(self, process: subprocess.Popen, port: int, log_path: Path, config_path: Path | None = None):
        self.process, self.port, self.log_path, self.config_path = process, port, log_path, config_path
        self.url = f"http://127.0.0.1:{port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        def ready():
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited ({self.process.returncode}):\n{self.log()[-3000:]}")
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:  # noqa: S310
                return response.status == 200
        wait_until(ready, timeout_s, what=f"{self.url}/-/ready")


class Prometheus(_Server):
    """A running Prometheus with helpers for the HTTP API."""

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr}
        if at is not None:
            params["time"] = str(at)
        data = http_get_json(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}")
        if data.get("status") != "success":
            raise AssertionError(f"query failed: {expr}: {data}")
        return data["data"]["result"]

    def query_value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def targets_up(self) -> bool:
        data = http_get_json(f"{self.url}/api/v1/targets")
        active = data["data"]["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def metadata(self, metric: str) -> list[dict]:
        data = http_get_json(f"{self.url}/api/v1/metadata?{urllib.parse.urlencode({'metric': metric})}")
        return data["data"].get(metric, [])

    def alerts(self) -> list[dict]:
        return http_get_json(f"{self.url}/api/v1/alerts")["data"]["alerts"]

    def rescrape(self, scrape_configs: list[dict]) -> None:
        """Replace the scrape configs and reload (what service discovery does when a pod is replaced)."""
        assert self.config_path is not None
        config = yaml.safe_load(self.config_path.read_text(encoding="utf-8"))
        config["scrape_configs"] = scrape_configs
        self.config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=10):  # noqa: S310 (loopback)
            pass


class Alertmanager(_Server):
    def alerts(self) -> list[dict]:
        return http_get_json(f"{self.url}/api/v2/alerts")


@contextlib.contextmanager
def run_prometheus(workdir: Path, scrape_configs: list[dict], rule_files: list[Path] = (),
                   alertmanager_url: str | None = None, scrape_interval_s: float = 1.0,
                   evaluation_interval_s: float = 1.0, extra_args: list[str] = (),
                   storage_path: Path | None = None) -> Iterator[Prometheus]:
    """Start Prometheus with ``scrape_configs`` (and rules, and an Alertmanager) until exit."""
    require(PROMETHEUS)
    workdir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "global": {"scrape_interval": _duration(scrape_interval_s),
                   "evaluation_interval": _duration(evaluation_interval_s)},
        "scrape_configs": scrape_configs,
    }
    if rule_files:
        config["rule_files"] = [str(p) for p in rule_files]
    if alertmanager_url:
        target = urllib.parse.urlparse(alertmanager_url).netloc
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [target]}]}]}
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    storage = storage_path or workdir / "data"
    with _serve(Prometheus, workdir / "prometheus.log", lambda port: [
            PROMETHEUS, f"--config.file={config_path}", f"--storage.tsdb.path={storage}",
            f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle", *extra_args]) as server:
        server.config_path = config_path
        yield server


@contextlib.contextmanager
def run_alertmanager(workdir: Path, config: dict | str) -> Iterator[Alertmanager]:
    """Start Alertmanager (no clustering) with ``config`` until exit."""
    require(ALERTMANAGER)
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "alertmanager.yml"
    config_path.write_text(config if isinstance(config, str) else yaml.safe_dump(config), encoding="utf-8")
    with _serve(Alertmanager, workdir / "alertmanager.log", lambda port: [
            ALERTMANAGER, f"--config.file={config_path}", f"--storage.path={workdir / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="]) as server:
        yield server


@contextlib.contextmanager
def _serve(server_type: type[_Server], log_path: Path, command: Callable[[int], list[str]]) -> Iterator:
    """Start ``command(port)`` on a free loopback port, wait until ready, stop it on exit."""
    port = free_port()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command(port), stdout=log, stderr=subprocess.STDOUT)
    server = server_type(process, port, log_path)
    try:
        server.wait_ready()
        yield server
    finally:
        _stop(process)


def _duration(seconds: float) -> str:
    """Prometheus durations take no decimals: 1.0 -> "1s", 0.5 -> "500ms"."""
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{round(seconds * 1000)}ms"


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
