"""A fleet on one machine: N ``gpctl serve --engine vllm`` replicas behind vLLM's router (``gpctl fleet``).

Each replica runs in its own process group (``gpctl serve`` and the vLLM server, EngineCore and
workers under it), and so does the router, so stopping the fleet stops every process it started:
SIGTERM to each group (vLLM drains), SIGKILL to what is left after the grace period. Replicas get
consecutive API ports and GrowPage exporter ports (the API server's ``/metrics/growpage`` and
``/get_load`` read that exporter). The router (``vllm-router``) starts once every replica answers
``/health``, and polls ``/get_load`` every ``load_poll_s`` seconds under ``power_of_two``; it serves
its own Prometheus metrics (``vllm_router_*``) on ``router_metrics_port``.

A replica in mode ``vllm`` is vLLM alone (no GrowPage plugin): ``/get_load`` is then a 404 and the
router counts its own requests in flight, which is what "power_of_two on vLLM's own load" means in
the fleet benchmark.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from growpage import catalog
from growpage.engine.model_prep import resolve_model_dir
from growpage.errors import ConfigError, GrowPageError

POLICIES = ("power_of_two", "round_robin", "random", "cache_aware", "kv_aware", "consistent_hash",
            "sticky_least_loaded")
MODES = ("off", "monitor", "enforce", "vllm")
STOP_GRACE_S = 30.0


@dataclasses.dataclass(frozen=True)
class ReplicaSpec:
    """One replica: its API port, its GrowPage exporter port, its KV blocks (None: vLLM's default
    sizing) and its mode (``off``, ``monitor``, ``enforce``, or ``vllm`` for vLLM alone)."""

    port: int
    metrics_port: int
    kv_blocks: int | None
    mode: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclasses.dataclass(frozen=True)
class FleetSpec:
    """The replicas and the router (see :func:`fleet_spec` for a validated one)."""

    replicas: tuple[ReplicaSpec, ...]
    router_port: int
    policy: str = "power_of_two"
    # vllm-router's --prometheus-port (its default, which it binds even when not asked): set it apart per fleet.
    router_metrics_port: int = catalog.ROUTER_METRICS_PORT
    host: str = "127.0.0.1"
    model: str | None = None
    base_pages: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 8
    # gpctl serve's own default, given to every replica, vLLM alone included: vLLM's CPU API server
    # would otherwise take 2048, and the arms of a comparison would differ in their prefill chunks
    max_num_batched_tokens: int = 512
    served_model_name: str = "growpage"
    load_poll_s: int = 1
    serve_args: tuple[str, ...] = ()
    cpu_binds: tuple[str, ...] = ()  # CPU build: replica i's VLLM_CPU_OMP_THREADS_BIND is cpu_binds[i % len]

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    @property
    def router_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.router_metrics_port}{catalog.ROUTER_METRICS_PATH}"


def fleet_spec(*, replicas: int, port: int, router_port: int, metrics_port: int, mode: str = "enforce",
               modes: Sequence[str] = (), kv_blocks: Sequence[int] = (), policy: str = "power_of_two",
               **options: object) -> FleetSpec:
    """A :class:`FleetSpec` with replica ``i`` on ``port + i`` (exporter ``metrics_port + i``).

    Args:
        modes: one mode per replica (default: ``mode`` for every replica).
        kv_blocks: KV blocks, one for every replica or one per replica (default: vLLM's sizing).
        options: the other :class:`FleetSpec` fields.

    Raises:
        ConfigError: a count, port, mode or policy that cannot work; the message says what to change.
    """
    if replicas < 1:
        raise ConfigError(f"--replicas {replicas}: a fleet needs at least 1 replica")
    if policy not in POLICIES:
        raise ConfigError(f"--policy {policy} is not one of vllm-router's: {', '.join(POLICIES)}")
    modes = list(modes) or [mode] * replicas
    blocks: list[int | None] = list(kv_blocks) or [None] * replicas
    if len(blocks) == 1:
        blocks *= replicas
    if len(modes) != replicas or len(blocks) != replicas:
        raise ConfigError(f"give one --kv-blocks (and mode) for every replica or one per replica ({replicas})")
    for name in modes:
        if name not in MODES:
            raise ConfigError(f"mode {name} is not one of {', '.join(MODES)}")
    specs = tuple(ReplicaSpec(port + i, metrics_port + i, blocks[i], modes[i]) for i in range(replicas))
    router_metrics_port = options.get("router_metrics_port", catalog.ROUTER_METRICS_PORT)
    if not isinstance(router_metrics_port, int):
        raise ConfigError(f"router_metrics_port must be a port number, got {router_metrics_port!r}")
    ports = [router_port, router_metrics_port, *(s.port for s in specs), *(s.metrics_port for s in specs)]
    if len(set(ports)) != len(ports) or not all(0 < p < 65536 for p in ports):
        raise ConfigError(f"ports overlap or are out of range ({sorted(ports)}); space --port, --router-port and "
                          f"--metrics-port at least {replicas} apart")
    return FleetSpec(replicas=specs, router_port=router_port, policy=policy, **options)  # type: ignore[arg-type]


def replica_command(spec: FleetSpec, replica: ReplicaSpec) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of one replica: ``gpctl serve --engine vllm`` (vLLM alone in mode ``vllm``)."""
    vllm_args = ["--max-num-seqs", str(spec.max_num_seqs),
                 "--max-num-batched-tokens", str(spec.max_num_batched_tokens),
                 "--served-model-name", spec.served_model_name]
    if replica.mode == "vllm":
        # deferred: growpage.tooling.serve imports torch (the plugin's settings); gpctl fleet starts without
        from growpage.tooling.serve import serve_command

        model = str(resolve_model_dir(Path(spec.model) if spec.model else None))
        extra = [*vllm_args, *(["--max-model-len", str(spec.max_model_len)] if spec.max_model_len else []),
                 *(["--num-gpu-blocks-override", str(replica.kv_blocks)] if replica.kv_blocks else [])]
        argv, env = serve_command(model, host=spec.host, port=replica.port, extra_args=extra)
        env["VLLM_PLUGINS"] = ""  # no plugin at all: vLLM alone
    else:
        argv = [gpctl_executable(), "serve", "--engine", "vllm", "--host", spec.host, "--port", str(replica.port),
                "--mode", replica.mode, "--metrics-port", str(replica.metrics_port), "--metrics-host", "127.0.0.1",
                *vllm_args, *spec.serve_args]
        for flag, value in (("--model", spec.model), ("--base-pages", spec.base_pages),
                            ("--max-model-len", spec.max_model_len), ("--kv-blocks", replica.kv_blocks)):
            if value is not None:
                argv += [flag, str(value)]
        env = dict(os.environ)
    if spec.cpu_binds:
        env["VLLM_CPU_OMP_THREADS_BIND"] = spec.cpu_binds[spec.replicas.index(replica) % len(spec.cpu_binds)]
    return argv, env


def router_command(spec: FleetSpec) -> list[str]:
    """vLLM's router in front of the replicas, polling their load every ``load_poll_s`` seconds, its metrics on
    loopback at ``router_metrics_port``."""
    return [router_executable(), "--host", spec.host, "--port", str(spec.router_port), "--policy", spec.policy,
            "--worker-urls", *(r.url for r in spec.replicas),
            "--worker-startup-check-interval", str(spec.load_poll_s), "--worker-startup-timeout-secs", "900",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(spec.router_metrics_port),
            "--log-level", "warning"]


def gpctl_executable() -> str:
    return _executable("gpctl", "reinstall GrowPage into this environment: pip install -e .")


def router_executable() -> str:
    return _executable("vllm-router", "run `make setup`, or pip install 'growpage[fleet]' (vllm-router 0.1.17)")


def _executable(name: str, fix: str) -> str:
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise GrowPageError(f"{name} is not installed for {sys.executable}; {fix}")
    return found


def check_ports_free(spec: FleetSpec) -> None:
    """Raise a one-line :class:`ConfigError` naming the first port another process holds."""
    for port in (spec.router_port, spec.router_metrics_port, *(r.port for r in spec.replicas),
                 *(r.metrics_port for r in spec.replicas)):
        with socket.socket() as sock:
            # as the servers bind: a port whose last connections linger in TIME_WAIT is free, a listener is not
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                raise ConfigError(f"port {port} is in use; choose other --port/--router-port/--metrics-port "
                                  "values or stop what holds it") from None


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """Whether ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class Fleet:
    """The started processes of a :class:`FleetSpec`; a context manager that always stops them.

    Args:
        spec: the fleet.
        log_dir: one log file per process (``replica-<i>.log``, ``router.log``).
        sleep: waiting between readiness checks (tests inject theirs).
    """

    def __init__(self, spec: FleetSpec, log_dir: Path, *, sleep: Callable[[float], None] = time.sleep):
        self.spec = spec
        self.log_dir = Path(log_dir)
        self.processes: dict[str, subprocess.Popen] = {}
        self._sleep = sleep

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, startup_timeout_s: float = 900.0) -> None:
        """Start the replicas, wait until each answers ``/health``, then start the router and wait
        until it is ready. Raises :class:`GrowPageError` when a process exits or time runs out."""
        check_ports_free(self.spec)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for index, replica in enumerate(self.spec.replicas):
            argv, env = replica_command(self.spec, replica)
            self._launch(f"replica-{index}", argv, env)
        for index, replica in enumerate(self.spec.replicas):
            self._wait(f"replica-{index}", f"{replica.url}/health", startup_timeout_s)
        self._launch("router", router_command(self.spec), dict(os.environ))
        self._wait("router", f"{self.spec.router_url}/readiness", startup_timeout_s)

    def _launch(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with open(self.log_dir / f"{name}.log", "wb") as log:
            self.processes[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                    start_new_session=True)  # its own process group

    def _wait(self, name: str, url: str, timeout_s: float) -> None:
        process = self.processes[name]
        deadline = time.monotonic() + timeout_s
        while not http_ok(url):
            if process.poll() is not None:
                raise GrowPageError(f"{name} exited with status {process.returncode} before {url} answered; "
                                    f"see {self.log_dir / (name + '.log')}")
            if time.monotonic() > deadline:
                raise GrowPageError(f"{url} did not answer within {timeout_s:g} s; see "
                                    f"{self.log_dir / (name + '.log')} or raise --startup-timeout")
            self._sleep(1.0)

    def exited(self) -> dict[str, int]:
        """Processes that have exited, with their status."""
        return {name: p.returncode for name, p in self.processes.items() if p.poll() is not None}

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM every process group (router first), wait up to ``grace_s``, SIGKILL what is left."""
        order = sorted(self.processes.items(), key=lambda item: item[0] != "router")
        for _, process in order:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _, process in order:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(process, signal.SIGKILL)  # the leader may be gone while children exit
            process.wait()

    def urls(self) -> dict[str, str]:
        """What each process serves, for people: the router, each replica and its load."""
        rows = {"router": f"{self.spec.router_url}/v1 (policy {self.spec.policy}), "
                          f"metrics {self.spec.router_metrics_url}"}
        for index, replica in enumerate(self.spec.replicas):
            blocks = replica.kv_blocks if replica.kv_blocks is not None else "vLLM's sizing"
            rows[f"replica-{index}"] = (f"{replica.url}/v1, {replica.url}{catalog.LOAD_PATH} (mode {replica.mode}, "
                                        f"KV blocks {blocks})")
        return rows


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:  # started with start_new_session: its process group id is its pid, even once it is reaped
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
