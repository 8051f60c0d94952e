"""Bad input: every case exits 3 with one line on stderr that says what to check; no traceback."""

from __future__ import annotations

import diagnose_scenarios as scenarios
import pytest

from gpctl.main import app
from support.promstack import free_port


def assert_one_clear_line(result, *fragments: str) -> str:
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(("path", "fragments"), [
    ("/nope", ("HTTP 404", "/metrics/growpage")),
    ("/error", ("HTTP 503",)),
    ("/html", ("not a Prometheus exposition", "<!doctype html>")),
    ("/garbage", ("not a Prometheus exposition",)),
    ("/vllm", ("no growpage_* metrics", "vLLM's own /metrics")),
])
def test_endpoint_bad_responses(runner, metrics_server, path, fragments):
    server = metrics_server()
    result = runner.invoke(app, ["diagnose", "--endpoint", f"{server.url}{path}", "--duration", "1"])
    assert_one_clear_line(result, *fragments)
    assert len(server.requests) == 1  # fails on the first scrape, without waiting --duration


def test_endpoint_unreachable(runner):
    result = runner.invoke(app, ["diagnose", "--endpoint", f"127.0.0.1:{free_port()}"])
    assert_one_clear_line(result, "cannot connect to the agent", "is it running")


def test_endpoint_timeout(runner, metrics_server):
    server = metrics_server()
    result = runner.invoke(app, ["diagnose", "--endpoint", f"{server.url}/slow", "--timeout", "0.5"])
    assert_one_clear_line(result, "did not answer within 0.5s", "--timeout")


def test_dcgm_url_without_dcgm_series(runner, metrics_server):
    server = metrics_server()
    result = runner.invoke(app, ["diagnose", "--endpoint", server.url, "--dcgm", f"{server.url}/vllm",
                                 "--duration", "1"])
    assert_one_clear_line(result, "DCGM_FI_DEV_FB_USED", "leave out --dcgm")


def test_prometheus_unreachable(runner):
    result = runner.invoke(app, ["diagnose", "--prometheus", f"http://127.0.0.1:{free_port()}"])
    assert_one_clear_line(result, "cannot connect to Prometheus")


def test_prometheus_url_that_is_not_prometheus(runner, metrics_server):
    server = metrics_server()
    result = runner.invoke(app, ["diagnose", "--prometheus", f"{server.url}/html"])
    assert_one_clear_line(result, "is not a Prometheus API", "base URL")


def test_prometheus_query_error(runner, metrics_server):
    server = metrics_server()
    result = runner.invoke(app, ["diagnose", "--prometheus", f"{server.url}/json-error"])
    assert_one_clear_line(result, "Prometheus rejected a query", "bad_data", "query: ")


def test_prometheus_without_growpage_series(runner, metrics_server):
    server = metrics_server()
    result = runner.invoke(app, ["diagnose", "--prometheus", f"{server.url}/json-empty"])
    assert_one_clear_line(result, "no growpage_* series", "vllm-growpage")


@pytest.mark.parametrize(("content", "fragments"), [
    (b"", ("is empty",)),
    (b"\xff\xfe\x00binary", ("not UTF-8",)),
    (b"<html><body>saved the wrong page</body></html>\n", ("not a Prometheus exposition",)),
    (b"node_load1 0.5\n", ("no growpage_*, vllm:* or DCGM_FI_DEV_FB_USED series",)),
    (b'growpage_requests_running{model_name="m" 3\n', ("not a Prometheus exposition",)),
])
def test_bad_snapshot_files(runner, tmp_path, content, fragments):
    path = tmp_path / "snapshot.prom"
    path.write_bytes(content)
    assert_one_clear_line(runner.invoke(app, ["diagnose", "--snapshot", str(path)]), str(path), *fragments)


def test_missing_snapshot_and_directory(runner, tmp_path):
    assert_one_clear_line(runner.invoke(app, ["diagnose", "--snapshot", str(tmp_path / "nope.prom")]),
                          "does not exist")
    assert_one_clear_line(runner.invoke(app, ["diagnose", "--snapshot", str(tmp_path)]), "is a directory")


def test_snapshots_with_the_same_time(runner, tmp_path):
    paths = []
    for index in range(2):
        path = tmp_path / f"s{index}.prom"
        path.write_text(scenarios.text_exposition(scenarios.samples(scenarios.HEALTHY, index * 60.0), 1000.0))
        paths.append(str(path))
    assert_one_clear_line(runner.invoke(app, ["diagnose", "--snapshot", *paths]), "same time",
                          "growpage-snapshot-time")


def test_only_dcgm_snapshots(runner, tmp_path):
    path = tmp_path / "dcgm.prom"
    path.write_text(scenarios.text_exposition(scenarios.dcgm_samples(scenarios.HEALTHY), 1000.0))
    assert_one_clear_line(runner.invoke(app, ["diagnose", "--snapshot", str(path)]), "no snapshot has growpage_*")


@pytest.mark.parametrize(("args", "fragments"), [
    ([], ("choose exactly one source",)),
    (["--endpoint", "http://a", "--prometheus", "http://b"], ("--endpoint and --prometheus",)),
    (["--endpoint", "http://a", "--duration", "soon"], ("--duration", "not a duration")),
    (["--prometheus", "http://a", "--since", "0s"], ("--since must be longer than 0s",)),
    (["--prometheus", "http://a", "--at", "yesterday"], ("--at", "ISO 8601")),
    (["--snapshot", "x.prom", "--namespace", "a"], ("go with --prometheus",)),
    (["--prometheus", "ftp://host"], ("not an http(s) URL",)),
    (["extra.prom"], ("snapshot files go after --snapshot",)),
])
def test_bad_options(runner, args, fragments):
    assert_one_clear_line(runner.invoke(app, ["diagnose", *args]), *fragments)


def test_bundle_directory_missing_fails_before_diagnosing(runner, metrics_server, tmp_path):
    server = metrics_server()
    result = runner.invoke(app, ["diagnose", "--endpoint", server.url, "--bundle", str(tmp_path / "no" / "b.tgz")])
    assert_one_clear_line(result, "does not exist")
    assert server.requests == []
