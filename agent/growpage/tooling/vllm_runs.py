"""One vLLM engine per child interpreter (:mod:`growpage.tooling.vllm_child`), for the demo and the benchmarks.

vLLM loads its plugins once per process, so "vLLM alone" (the plugin inactive) and "vLLM +
GrowPage" cannot share one; each engine runs in a child started here, its spec passed through a
file (long prompts exceed what one command-line argument may hold), its progress and results read
back as JSON lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable

from growpage.errors import GrowPageError
from growpage.tooling.vllm_child import PROGRESS_PREFIX, RESULT_PREFIX, RUN_KEYS

CHILD_MODULE = "growpage.tooling.vllm_child"


def run_child(spec: dict, on_progress: Callable[[dict], None], timeout_s: float) -> dict:
    """Run one engine (:mod:`growpage.tooling.vllm_child`) on ``spec``; returns its result record.

    Raises:
        GrowPageError: the run failed (with the child's last error line).
    """
    return run_engine(spec, [], on_progress, timeout_s)[0]


def run_engine(spec: dict, runs: list[dict], on_progress: Callable[[dict], None], timeout_s: float) -> list[dict]:
    """One engine on ``spec`` serving ``runs`` in turn (each changes only the run keys of
    :data:`~growpage.tooling.vllm_child.RUN_KEYS`; none: ``spec`` itself); their result records, in order.

    Raises:
        ValueError: a run changes an engine setting (those need an engine of their own).
        GrowPageError: the engine or a run failed (with the child's last error line).
    """
    for run in runs:
        engine_keys = sorted(set(run) - set(RUN_KEYS))
        if engine_keys:
            raise ValueError(f"a run on a shared engine may change only {', '.join(RUN_KEYS)}; "
                             f"{engine_keys[0]!r} needs an engine of its own")
    env = dict(os.environ, VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the spec goes through a file: long prompts exceed what one command-line argument may hold
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="growpage-spec-", delete=False) as spec_file:
        json.dump({**spec, "runs": runs}, spec_file)
    try:
        return _run_spec_file(spec_file.name, spec, max(1, len(runs)), env, on_progress, timeout_s)
    finally:
        os.unlink(spec_file.name)


def _run_spec_file(path: str, spec: dict, expected: int, env: dict[str, str], on_progress: Callable[[dict], None],
                   timeout_s: float) -> list[dict]:
    process = subprocess.Popen([sys.executable, "-m", CHILD_MODULE, "@" + path],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    results: list[dict] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith(PROGRESS_PREFIX):
                on_progress(json.loads(line.removeprefix(PROGRESS_PREFIX)))
            elif line.startswith(RESULT_PREFIX):
                results.append(json.loads(line.removeprefix(RESULT_PREFIX)))
        process.wait(timeout=timeout_s)
    finally:
        if process.poll() is None:
            process.kill()
    stderr = process.stderr.read() if process.stderr else ""
    if process.returncode != 0 or len(results) != expected:
        lines = [line for line in stderr.splitlines() if line.strip()] or ["no output"]
        errors = [line for line in lines if "Error" in line] or lines[-1:]
        raise GrowPageError(f"the vLLM run {spec['variant']!r} failed (exit "
                            f"{process.returncode}): {errors[-1].strip()}")
    return results
