"""The engine phases on CUDA machines (``engine_cases.phases``), checked without a GPU.

``scripts/gpu-checks.sh`` runs the engine tests on CUDA vLLM; which phases exist there decides what
those tests can check, so the choice is pinned here for one GPU and for three.
"""

from __future__ import annotations

import engine_cases
import pytest


@pytest.mark.parametrize("gpus", [1, 2, 3])
def test_cuda_phases_add_graph_modes_and_fp8_and_tp3_only_with_three_gpus(monkeypatch, gpus):
    monkeypatch.setattr(engine_cases, "_cuda_devices", lambda: gpus)
    phases = {phase["name"]: phase for phase in engine_cases.phases("")}
    assert ("enforce_tp3" in phases) == (gpus >= engine_cases.TP_RANKS)
    assert {"monitor_cudagraph_default", "monitor_piecewise", "monitor_fp8_kv"} <= set(phases)
    assert phases["monitor_piecewise"]["engine"]["compilation_config"] == {"cudagraph_mode": "PIECEWISE"}
    fp8 = phases["monitor_fp8_kv"]
    assert fp8["engine"]["kv_cache_dtype"] == "fp8" and fp8["scrape"] and fp8["growpage"]["mode"] == "monitor"


def test_the_cpu_build_runs_tp3_and_no_cuda_phase(monkeypatch):
    monkeypatch.setattr(engine_cases, "_cuda_devices", lambda: 0)
    names = [phase["name"] for phase in engine_cases.phases("")]
    assert "enforce_tp3" in names and not {"monitor_piecewise", "monitor_fp8_kv"} & set(names)
