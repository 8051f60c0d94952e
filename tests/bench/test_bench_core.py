"""`gpctl bench core --quick` runs and its JSON has the shape the docs and notes rely on."""

import json

import pytest
import torch
from typer.testing import CliRunner

from gpctl.main import app


def test_quick_core_bench_produces_every_measure(tmp_path):
    output = tmp_path / "core.json"
    result = CliRunner().invoke(app, ["bench", "core", "--quick", "--json", "--output", str(output)])
    assert result.exit_code == 0, result.output
    data = json.loads(output.read_text())
    assert data["benchmark"] == "core" and data["device"] == "cpu"
    assert data["policy"]["decide_ns_per_call"] > 0
    overhead = data["monitor_overhead"]
    assert overhead["step_ms_off"] > 0 and overhead["step_ms_monitor"] > 0
    assert overhead["monitor_over_off_step_time"] > 0
    assert data["grants"]["grants_measured"] > 10
    assert data["grants"]["grant_latency_p99_us"] >= data["grants"]["grant_latency_p50_us"] > 0
    compression = data["compression"]
    assert compression["quantize_int8_tokens_per_s"] > 0 and compression["evict_tokens_per_s"] > 0
    observation = data["observation"]
    step = observation["steps"][0]
    assert step["memory"] == "analytic" and step["after_chunks"] > 1  # a 64 KiB cap: many chunks
    assert 0 < step["after_peak_bytes"] <= step["cap_bytes"] < step["before_peak_bytes"]
    assert step["before_ms"] > 0 and step["after_ms"] > 0 and step["max_abs_diff_token_mass"] < 1e-4
    assert observation["compaction"][0]["bytes_moved"] > 0 and observation["compaction"][0]["ms"] > 0
    assert json.loads(result.output) == data


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU exists here")
def test_cuda_without_a_gpu_is_one_clear_error():
    result = CliRunner().invoke(app, ["bench", "core", "--quick", "--device", "cuda"])
    assert result.exit_code == 2
    assert "no CUDA device" in result.output and "Traceback" not in result.output
