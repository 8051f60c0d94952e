"""Two data-parallel ranks of vLLM's CPU build with GrowPage: each engine core exports on its own port.

vLLM runs a dense model's data-parallel ranks as independent engines, one engine core (and one
GrowPage scheduler agent) per rank, each told ``data_parallel_size`` 1 but its own local rank; on
one host they would all bind ``exporter_port``. Rank ``r`` binds ``exporter_port + r``
(``startup.rank_exporter_port``). One server, two ranks, one OpenMP thread each (one core each),
started as ``gpctl serve --engine vllm`` starts it; requests go through vLLM's own DP balancer.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from support.vllm_guard import require_vllm_plugin

require_vllm_plugin()

import httpx

from growpage import catalog
from growpage.engine.model_prep import resolve_model_dir
from growpage.errors import GrowPageError
from growpage.tooling.serve import serve_command
from support.processes import stop_group, wait_serving
from support.promstack import free_port

pytestmark = pytest.mark.slow

STARTUP_TIMEOUT_S = 300.0
RANKS = 2


def _free_pair() -> int:
    """A port ``p`` with ``p + 1`` free too (the two ranks' exporters)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports on loopback")


def _scrape(port: int) -> str | None:
    try:
        response = httpx.get(f"http://127.0.0.1:{port}{catalog.METRICS_PATH}", timeout=3)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


def _series(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " ")]


def test_each_data_parallel_rank_serves_its_own_exporter(tmp_path: Path):
    try:
        model_dir = resolve_model_dir(None)
    except GrowPageError as error:
        pytest.skip(f"the packaged model is not prepared ({error}); run gpctl model prepare")
    port, exporter_port = free_port(), _free_pair()
    argv, env = serve_command(
        str(model_dir), host="127.0.0.1", port=port, cpu=True,
        growpage={"mode": "monitor", "exporter_port": exporter_port, "exporter_host": "127.0.0.1"},
        extra_args=["--max-model-len", "512", "--max-num-seqs", "4", "--num-gpu-blocks-override", "32",
                    "--data-parallel-size", str(RANKS), "--seed", "0"])
    env.update(OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND="0|1")  # rank r on core r
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        wait_serving(f"http://127.0.0.1:{port}", process, log_path, STARTUP_TIMEOUT_S)
        for index in range(4):  # vLLM's balancer spreads them over the ranks; every rank keeps serving
            response = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120, json={
                "model": str(model_dir), "prompt": f"Count to {index + 3}:", "max_tokens": 8, "temperature": 0})
            assert response.status_code == 200, response.text
        time.sleep(1.0)  # one exporter poll
        expositions = [_scrape(exporter_port + rank) for rank in range(RANKS)]
    finally:
        stop_group(process)
    log = log_path.read_text(errors="replace")
    for rank, text in enumerate(expositions):
        assert text is not None, f"rank {rank}: nothing on port {exporter_port + rank}\n{log[-3000:]}"
        [build_info] = _series(text, catalog.BUILD_INFO.name)
        assert 'mode="monitor"' in build_info and 'home="vllm"' in build_info, build_info
        assert _series(text, catalog.VLLM_STEPS.name), f"rank {rank} exports no step counter"
    # two engine cores, two exporters, each announced by its own process
    announced = {line.split("served from start-up at ")[1].split()[0] for line in log.splitlines()
                 if "served from start-up at" in line}
    assert announced == {f"http://127.0.0.1:{exporter_port + rank}{catalog.METRICS_PATH}" for rank in range(RANKS)}
    # the ranks together ran the steps of the four requests (each rank's counter is its own)
    steps = [float(_series(text, catalog.VLLM_STEPS.name)[0].rsplit(" ", 1)[1]) for text in expositions if text]
    assert sum(steps) >= 8, steps
