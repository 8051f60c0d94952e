"""What a user sees when calibrate cannot calibrate: one line on stderr that says how to fix it,
exit code 2, and no file written. The agent is the real telemetry agent where one is needed."""

from __future__ import annotations

import functools
from pathlib import Path

import httpx
import pytest

from gpctl.main import app
from growpage import catalog
from growpage.calibrate import sources
from support.promstack import free_port


def refused(runner, tmp_path: Path, *args: str, output: Path | None = None) -> str:
    """Run calibrate; assert exit 2, one ``error:`` line, no traceback, nothing written. Returns the line."""
    output = output or tmp_path / "calibrated.yaml"
    result = runner.invoke(app, ["calibrate", *args, "--output", str(output)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert not output.is_file()
    return lines[0]


def test_no_source_or_two_sources(runner, tmp_path):
    assert ("choose exactly one source: --endpoint URL, --prometheus URL or --snapshot FILE..."
            in refused(runner, tmp_path))
    line = refused(runner, tmp_path, "--endpoint", "http://127.0.0.1:1", "--prometheus", "http://127.0.0.1:1")
    assert "(got --endpoint and --prometheus)" in line


@pytest.mark.parametrize(("args", "expected"), [
    (["--lts-quantile", "1.5"], "--lts-quantile must be a fraction between 0 and 1 (exclusive), got 1.5"),
    (["--density-quantile", "0"], "--density-quantile must be a fraction between 0 and 1"),
    (["--min-samples", "0"], "--min-samples must be a whole number >= 1"),
    (["--block-size", "0"], "--block-size must be a whole number of tokens >= 1"),
    (["--namespace", "chat"], "--namespace and --at go with --prometheus"),
    (["--duration", "soon"], "--duration 'soon' is not a duration"),
])
def test_bad_options(runner, tmp_path, args, expected):
    snapshot = tmp_path / "agent.prom"
    snapshot.write_text("growpage_requests_running 0\n")
    assert expected in refused(runner, tmp_path, "--snapshot", str(snapshot), *args)


def test_an_unreachable_endpoint(runner, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    line = refused(runner, tmp_path, "--endpoint", url, "--timeout", "2s")
    assert f"cannot connect to the agent at {url}{catalog.METRICS_PATH}" in line
    assert "is it running, and are the host and port right?" in line


def test_the_wrong_path_on_the_real_agent(runner, tmp_path, monitored):
    line = refused(runner, tmp_path, "--endpoint", f"{monitored.url}/metrics")
    assert line == (f"error: the agent at {monitored.url}/metrics answered HTTP 404: check the path "
                    f"(the agent serves {catalog.METRICS_PATH})")


def test_too_few_samples_on_the_real_agent(runner, tmp_path, monitored):
    monitored.serve(5)
    line = refused(runner, tmp_path, "--endpoint", monitored.url)
    assert line.startswith(f"error: only 5 {catalog.LTS_ENTROPY.name} samples for model_name='calibrate-test-model' "
                           f"in the agent at {monitored.url}{catalog.METRICS_PATH}, need --min-samples 50 "
                           "(growpage_build_info says mode=monitor)")
    assert line.endswith("let more requests run with GrowPage in monitor mode, or lower --min-samples")


def test_two_scrapes_without_traffic_between_them_have_no_samples(runner, tmp_path, monitored, monkeypatch):
    monitored.serve(60)  # plenty since start, none in the window
    slept: list[float] = []
    monkeypatch.setattr(sources, "from_endpoint", functools.partial(sources.from_endpoint, sleep=slept.append))
    line = refused(runner, tmp_path, "--endpoint", monitored.url, "--duration", "0.2s")
    assert slept == [0.2]  # two scrapes, --duration apart
    assert f"only 0 {catalog.LTS_ENTROPY.name} samples" in line
    assert "a longer --duration, or none (everything since the agent started)" in line


def test_a_metric_monitor_mode_never_exported(runner, tmp_path, monitored):
    monitored.serve(60)
    text = httpx.get(monitored.url + catalog.METRICS_PATH).text
    kept = [line for line in text.splitlines() if catalog.STS_DENSITY.name not in line]
    snapshot = tmp_path / "agent.prom"
    snapshot.write_text("\n".join(kept) + "\n")
    line = refused(runner, tmp_path, "--snapshot", str(snapshot))
    assert f"{catalog.STS_DENSITY.name} is missing from snapshot {snapshot}" in line
    assert "run GrowPage in monitor mode (mode: monitor)" in line


def test_snapshots_that_are_not_growpage_data(runner, tmp_path):
    assert "does not exist" in refused(runner, tmp_path, "--snapshot", str(tmp_path / "nope.prom"))
    vllm = tmp_path / "vllm.prom"
    vllm.write_text("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n")
    assert f"snapshot {vllm} has no growpage_* series" in refused(runner, tmp_path, "--snapshot", str(vllm))
    html = tmp_path / "grafana.prom"
    html.write_text("<!doctype html><html><body>Grafana</body></html>\n")
    assert "is not a Prometheus exposition" in refused(runner, tmp_path, "--snapshot", str(html))


def test_the_agent_is_not_a_prometheus(runner, tmp_path, monitored):
    line = refused(runner, tmp_path, "--prometheus", monitored.url, "--since", "5m")
    assert f"{monitored.url} is not a Prometheus API" in line


def test_an_output_that_cannot_be_written_is_refused_before_reading_anything(runner, tmp_path):
    unreachable = f"http://127.0.0.1:{free_port()}"  # never contacted: the output is checked first
    missing_dir = tmp_path / "no" / "such" / "dir" / "out.yaml"
    line = refused(runner, tmp_path, "--endpoint", unreachable, output=missing_dir)
    assert f"--output {missing_dir}: directory {missing_dir.parent} does not exist" in line
    line = refused(runner, tmp_path, "--endpoint", unreachable, output=tmp_path)
    assert f"--output {tmp_path} is a directory" in line
    a_file = tmp_path / "file.txt"
    a_file.write_text("")
    line = refused(runner, tmp_path, "--endpoint", unreachable, output=a_file / "out.yaml")
    assert "does not exist" in line


def test_several_models_need_a_model_name(runner, tmp_path, monitored):
    monitored.serve(60)
    text = httpx.get(monitored.url + catalog.METRICS_PATH).text
    other = text.replace('model_name="calibrate-test-model"', 'model_name="other-model"')
    snapshot = tmp_path / "two-models.prom"
    body_a = [line for line in text.splitlines() if not line.startswith("#")]
    body_b = [line for line in other.splitlines() if not line.startswith("#")]
    snapshot.write_text("\n".join(body_a + body_b) + "\n")
    line = refused(runner, tmp_path, "--snapshot", str(snapshot))
    assert "distributions of 2 models ('calibrate-test-model', 'other-model')" in line and "--model-name" in line
    result = runner.invoke(app, ["calibrate", "--snapshot", str(snapshot), "--model-name", "other-model", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "# Model: other-model; block_size 16" in result.stdout
