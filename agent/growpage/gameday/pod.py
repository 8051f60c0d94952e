"""One vLLM pod of the game day: vLLM's CPU build with the GrowPage plugin, as ``gpctl serve`` starts it.

The pod is a process group on loopback ports, named like a Kubernetes pod in the labels the game
day's Prometheus adds to its two targets (``/metrics`` as job ``vllm``, ``/metrics/growpage`` as job
``vllm-growpage``), exactly as a ServiceMonitor would. Replacing the pod is starting another under a
new name and pointing the scrape at it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from growpage import catalog
from growpage.errors import GrowPageError
from growpage.tooling.fleet import http_ok
from growpage.tooling.serve import serve_command

SERVED_MODEL_NAME = "gameday"
BLOCK_SIZE = 32  # serve_command's CPU block size
STOP_GRACE_S = 5.0  # vLLM drains in-flight requests on SIGTERM; a game day need not wait for them


@dataclasses.dataclass(frozen=True)
class PodSpec:
    """What one pod runs.

    Attributes:
        name: the pod label its targets carry.
        mode: GrowPage's mode (``monitor``, ``enforce``, ``off``).
        port: vLLM's API port (``/v1``, ``/metrics``, ``/metrics/growpage``).
        exporter_port: the engine core's GrowPage exporter (the route relays it).
        kv_blocks: vLLM's KV cache, in blocks of 32 tokens (small, so a storm preempts).
        max_num_seqs: vLLM's batch limit.
    """

    name: str
    mode: str
    port: int
    exporter_port: int
    kv_blocks: int = 12
    max_num_seqs: int = 4

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def max_model_len(self) -> int:
        """What the blocks hold, less the one vLLM keeps back and one of slack (vLLM refuses to start
        when a full-length request cannot fit)."""
        return (self.kv_blocks - 2) * BLOCK_SIZE


class VllmPod:
    """A started pod; :meth:`stop` ends its whole process group."""

    def __init__(self, spec: PodSpec, model_dir: Path, log_path: Path):
        self.spec = spec
        argv, env = serve_command(
            str(model_dir), host="127.0.0.1", port=spec.port, cpu=True,
            growpage={"mode": spec.mode, "exporter_port": spec.exporter_port, "exporter_host": "127.0.0.1"},
            extra_args=["--served-model-name", SERVED_MODEL_NAME, "--max-model-len", str(spec.max_model_len),
                        "--max-num-seqs", str(spec.max_num_seqs), "--num-gpu-blocks-override", str(spec.kv_blocks),
                        "--seed", "0"])
        # One OpenMP thread on core 0: Prometheus, Alertmanager and the storm's clients keep core 1.
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
        env.setdefault("OMP_NUM_THREADS", "1")
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # its own process group
        self.started_s = time.time()

    def wait_ready(self, timeout_s: float) -> float:
        """Wait until vLLM answers ``/health``; returns when (unix seconds). Raises GrowPageError when
        the process exits first or time runs out."""
        deadline = time.monotonic() + timeout_s
        while not http_ok(f"{self.spec.url}/health"):
            if self.process.poll() is not None:
                raise GrowPageError(f"pod {self.spec.name} exited ({self.process.returncode}) before it served; "
                                    f"see {self.log_path}")
            if time.monotonic() > deadline:
                raise GrowPageError(f"pod {self.spec.name} did not serve within {timeout_s:g} s; see {self.log_path}")
            time.sleep(0.5)
        return time.time()

    def stop(self) -> None:
        """SIGTERM the process group, wait up to :data:`STOP_GRACE_S`, SIGKILL what is left."""
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        self._signal(signal.SIGKILL)  # the leader may be gone while its children exit
        self.process.wait()

    def _signal(self, sig: int) -> None:
        try:  # started with start_new_session: the group id is the pid, even once it is reaped
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def scrape_configs(spec: PodSpec, namespace: str) -> list[dict]:
    """The two jobs a ServiceMonitor pair would give the pod: vLLM's ``/metrics`` and GrowPage's route."""
    labels = {"namespace": namespace, "pod": spec.name}
    target = f"127.0.0.1:{spec.port}"
    return [{"job_name": job, "metrics_path": path, "static_configs": [{"targets": [target], "labels": labels}]}
            for job, path in ((catalog.VLLM_SCRAPE_JOB, catalog.VLLM_METRICS_PATH),
                              (catalog.SCRAPE_JOB, catalog.METRICS_PATH))]


class HungListener:
    """A process that holds a port, accepts connections and never answers: a wedged exporter.

    Held in this process (a listening socket and a thread that accepts and keeps the connections
    open) until :meth:`close`.
    """

    def __init__(self, port: int, host: str = "127.0.0.1"):
        self._socket = socket.socket()
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self._socket.listen(16)
        self._held: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="gameday-hung-listener", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return
            self._held.append(connection)  # never read, never answered

    def close(self) -> None:
        self._closed.set()
        for connection in self._held:
            connection.close()
        try:
            self._socket.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self._socket.close()
        self._thread.join(timeout=5)
