"""``gpctl serve`` as an operator runs it: bad configurations stop it with one line and exit 2, SIGTERM
drains and exits, and ``--engine vllm`` forwards signals to its server instead of orphaning it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from gpctl.main import app
from support.promstack import free_port, wait_until


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "GROWPAGE_TRACING": "0",
                          "GROWPAGE_VLLM_PYTHON": sys.executable, "GROWPAGE_CACHE_DIR": "/nonexistent"})


@pytest.mark.parametrize("args, fragment", [
    (["--base-pages", "100000"], "lower --base-pages"),
    (["--mode", "off", "--kv-cache-mib", "2"], "cannot hold one request of the full context"),
    (["--block-size", "100000000"], "longer than the context"),
    (["--kv-cache-mib", "100000000"], "MiB are available"),
    (["--shutdown-timeout", "inf"], "finite number of seconds"),
    (["--public", "everything"], "public endpoint 'everything' is unknown"),
])
def test_a_configuration_that_cannot_serve_exits_2_with_one_line(runner, prepared_model_dir, args, fragment):
    result = runner.invoke(app, ["serve", "--engine", "reference", "--model", str(prepared_model_dir), *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output
    assert "unknown GrowPage setting" not in result.output  # GROWPAGE_TRACING etc. are not config fields


def test_an_undecodable_config_file_exits_2_with_one_line(runner, prepared_model_dir, tmp_path):
    config = tmp_path / "growpage.yaml"
    config.write_bytes("mode: monitor  # é\n".encode("latin-1"))
    result = runner.invoke(app, ["serve", "--engine", "reference", "--model", str(prepared_model_dir),
                                 "--config", str(config)])
    assert result.exit_code == 2 and "not UTF-8" in result.output and "Traceback" not in result.output


def test_sigterm_drains_then_exits_and_the_request_hears_why(prepared_model_dir):
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GROWPAGE_TRACING": "0"}
    gpctl = Path(sys.executable).parent / "gpctl"
    if not gpctl.exists():
        pytest.skip("the gpctl console script is not installed")
    process = subprocess.Popen([str(gpctl), "serve", "--engine", "reference", "--model", str(prepared_model_dir),
                                "--port", str(port), "--shutdown-timeout", "2", "--max-model-len", "2048"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(url, process), 180, interval_s=0.5, what="gpctl serve")
        model = httpx.get(f"{url}/v1/models", timeout=5).json()["data"][0]["id"]
        body = {"model": model, "prompt": "Write a long story.", "max_tokens": 1500, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"])
            process.send_signal(signal.SIGTERM)
            rest = "\n".join(lines)
        # 1,500 tokens outlast the 2 s drain: the stream hears why it ends, and the process exits
        assert "shutting down" in rest and '"finish_reason": "length"' not in rest
        process.wait(timeout=120)  # a hang guard, not a measured duration
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _healthy(url: str, process: subprocess.Popen) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"gpctl serve exited: {process.stdout.read()}")
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


CHILD = textwrap.dedent("""
    import signal, sys, time
    record = open(sys.argv[1], "a", buffering=1)
    def on_signal(signum, frame):
        record.write(signal.Signals(signum).name + "\\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    record.write("ready\\n")
    time.sleep(120)
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_vllm_launcher_forwards_signals_and_waits_for_its_server(tmp_path, sig):
    child, record = tmp_path / "child.py", tmp_path / "signals.txt"
    child.write_text(CHILD)
    launcher = ("import sys; from growpage.tooling.serve import run_child; "
                f"sys.exit(run_child([sys.executable, {str(child)!r}, {str(record)!r}], shutdown_timeout_s=5))")
    parent = subprocess.Popen([sys.executable, "-c", launcher])
    try:
        wait_until(lambda: record.is_file() and "ready" in record.read_text(), 30, what="the child to start")
        parent.send_signal(sig)
        assert parent.wait(timeout=20) == 0  # the child's own exit status
        assert record.read_text().split() == ["ready", sig.name]
    finally:
        if parent.poll() is None:
            parent.kill()
    # No orphan left behind: nothing still runs the child script.
    survivors = subprocess.run(["pgrep", "-f", str(child)], capture_output=True, text=True).stdout.split()
    assert survivors == []
