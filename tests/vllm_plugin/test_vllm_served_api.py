"""vLLM's OpenAI-compatible server with the GrowPage plugin, started the way users start it.

One server per module (``growpage.tooling.serve.serve_command``, what ``gpctl serve --engine
vllm`` runs) on the packaged model, mode ``monitor``, CPU settings, one OpenMP thread, loopback
ports. It takes about a minute to start on one core (up to ``STARTUP_TIMEOUT_S`` on a busy box).
The tests send completions (one with ``x-growpage-namespace``), read ``/metrics/growpage``, lint
it with ``promtool`` and let a real Prometheus scrape it. The server's process group is always
killed at the end.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.vllm_guard import require_vllm_plugin

require_vllm_plugin()

import httpx

from growpage import catalog
from growpage.engine.model_prep import resolve_model_dir
from growpage.errors import GrowPageError
from growpage.tooling.serve import serve_command
from support.processes import stop_group
from support.promstack import free_port, http_get_json, run_prometheus, run_tool, wait_until

pytestmark = pytest.mark.slow

STARTUP_TIMEOUT_S = 240.0
MODEL_NAME = "smollm2-growpage-test"
NAMESPACE = "served-api-test"
PROMPT = "The capital of France is"
MAX_TOKENS = 40


class Served:
    """The running server: its URL, its process and its log."""

    def __init__(self, process: subprocess.Popen, url: str, log_path: Path):
        self.process, self.url, self.log_path = process, url, log_path
        self.completions: list[dict] = []  # filled by test_completions (the metrics tests need traffic)

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    try:
        model_dir = resolve_model_dir(None)
    except GrowPageError as error:
        pytest.skip(f"the packaged model is not prepared ({error}); run gpctl model prepare")
    tmp = tmp_path_factory.mktemp("vllm-served")
    port, exporter_port = free_port(), free_port()
    argv, env = serve_command(
        str(model_dir), host="127.0.0.1", port=port, cpu=True,
        growpage={"mode": "monitor", "exporter_port": exporter_port, "exporter_host": "127.0.0.1"},
        extra_args=["--served-model-name", MODEL_NAME, "--max-model-len", "1024", "--max-num-seqs", "4",
                    "--max-num-batched-tokens", "512", "--num-gpu-blocks-override", "256", "--seed", "0"])
    gpu_util = float(argv[argv.index("--gpu-memory-utilization") + 1])
    assert gpu_util <= 0.3 and "--enforce-eager" in argv, argv
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    log_path = tmp / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # its own process group, killed at the end
    served = Served(process, f"http://127.0.0.1:{port}", log_path)
    try:
        def healthy() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"the vLLM server exited ({process.returncode}):\n{served.log_tail()}")
            try:
                return httpx.get(f"{served.url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        started = time.monotonic()
        try:
            wait_until(healthy, STARTUP_TIMEOUT_S, interval_s=1.0, what=f"{served.url}/health")
        except TimeoutError as error:
            raise AssertionError(f"{error}\n{served.log_tail()}") from None
        print(f"vLLM server healthy after {time.monotonic() - started:.0f}s")
        yield served
    finally:
        stop_group(process)


def _complete(served: Served, headers: dict[str, str] | None = None) -> dict:
    response = httpx.post(f"{served.url}/v1/completions", headers=headers or {}, timeout=120, json={
        "model": MODEL_NAME, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert response.status_code == 200, f"{response.status_code}: {response.text}\n{served.log_tail(3000)}"
    return response.json()


def _growpage_metrics(served: Served) -> str:
    response = httpx.get(f"{served.url}{catalog.METRICS_PATH}", timeout=10)
    assert response.status_code == 200, f"{response.status_code}: {response.text}\n{served.log_tail(3000)}"
    return response.text


def test_completions(server: Served):
    plain = _complete(server)
    namespaced = _complete(server, {"x-growpage-namespace": NAMESPACE})
    again = _complete(server)
    server.completions = [plain, namespaced, again]
    for body in server.completions:
        choice = body["choices"][0]
        assert body["model"] == MODEL_NAME
        assert choice["text"].strip(), body
        assert 0 < body["usage"]["completion_tokens"] <= MAX_TOKENS, body
    # monitor never changes outputs, with or without a namespace: greedy text is identical.
    assert {body["choices"][0]["text"] for body in server.completions} == {plain["choices"][0]["text"]}


def _ensure_traffic(served: Served) -> None:
    if not served.completions:  # run alone (-k): the exporter starts with the first engine step
        served.completions = [_complete(served, {"x-growpage-namespace": NAMESPACE})]


def test_growpage_metrics_route_passes_promtool(server: Served):
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    _ensure_traffic(server)
    text = wait_until(lambda: _growpage_metrics(server), 30, what="/metrics/growpage")
    assert "vllm:" not in text
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert samples, text
    names = {line.split("{")[0].split(" ")[0] for line in samples}
    assert all(name.startswith("growpage_") for name in names), sorted(names)
    assert catalog.BUILD_INFO.name in names, sorted(names)
    errors = [line for line in samples if line.startswith("growpage_agent_errors_total")]
    assert all(float(line.rsplit(" ", 1)[1]) == 0 for line in errors), errors
    run_tool("promtool", "check", "metrics", input_text=text)


def test_prometheus_scrapes_growpage_metrics(server: Served, tmp_path: Path):
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    _ensure_traffic(server)
    target = server.url.removeprefix("http://")
    # In a cluster the namespace label comes from the scrape (catalog.MODEL_LABEL is the only
    # label the plugin exports); a static target label stands in for it here.
    scrape = {"job_name": catalog.SCRAPE_JOB, "metrics_path": catalog.METRICS_PATH,
              "scrape_interval": "1s", "scrape_timeout": "900ms",
              "static_configs": [{"targets": [target], "labels": {"namespace": NAMESPACE}}]}
    with run_prometheus(tmp_path, [scrape]) as prom:
        wait_until(prom.targets_up, 60, interval_s=0.5, what="the /metrics/growpage target to be up")
        selector = f'{{__name__=~"growpage_.+", job="{catalog.SCRAPE_JOB}", namespace="{NAMESPACE}"}}'
        result = wait_until(lambda: prom.query(selector), 30, interval_s=0.5, what=f"series for {selector}")
        names = {series["metric"]["__name__"] for series in result}
        assert all(name.startswith("growpage_") for name in names), sorted(names)
        assert all(series["metric"].get(catalog.MODEL_LABEL) for series in result), result[:3]
        build = prom.query(f'{catalog.BUILD_INFO.name}{{job="{catalog.SCRAPE_JOB}", namespace="{NAMESPACE}"}}')
        assert [float(series["value"][1]) for series in build] == [1.0], build
        assert build[0]["metric"].get("home") == "vllm", build
        assert not prom.query('{__name__=~"vllm:.+"}')


RULES_FILE = Path(__file__).resolve().parents[2] / "alerts" / "growpage-rules.yaml"
IDLE_MINUTES = 5


def _scraped_series(text: str, extra: dict[str, str]) -> list[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` of every finite sample of an exposition, with the scrape's labels."""
    import math

    from prometheus_client.parser import text_string_to_metric_families

    series = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if math.isfinite(sample.value):
                series.append((sample.name, {**sample.labels, **extra}, float(sample.value)))
    return series


def _promtool_series(name: str, labels: dict[str, str]) -> str:
    body = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    return f"{name}{{{body}}}"


def test_the_rules_load_on_a_real_pod_and_an_idle_healthy_pod_raises_nothing(server: Served, tmp_path: Path):
    """The generated rules run on what a real vLLM + GrowPage pod exports: they load, evaluate
    without errors, the vLLM-facing recording rules produce series, and the same pod left idle
    (every series as scraped, held for five minutes of rule evaluation in promtool) raises no alert."""
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.skip("prometheus/promtool are not installed (apt-get install prometheus)")
    import yaml

    _ensure_traffic(server)
    target = server.url.removeprefix("http://")
    pod = {"namespace": NAMESPACE, "pod": "vllm-0"}  # what the ServiceMonitors' relabeling adds in a cluster
    scrapes = [{"job_name": job, "metrics_path": path, "scrape_interval": "1s", "scrape_timeout": "900ms",
                "static_configs": [{"targets": [target], "labels": pod}]}
               for job, path in ((catalog.SCRAPE_JOB, catalog.METRICS_PATH), ("vllm", "/metrics"))]
    with run_prometheus(tmp_path / "prometheus", scrapes, rule_files=[RULES_FILE]) as prom:
        wait_until(prom.targets_up, 60, interval_s=0.5, what="both targets to be up")
        record = "namespace_model_name:vllm_time_to_first_token:slo_error_ratio_rate5m"
        wait_until(lambda: prom.query(record), 60, interval_s=0.5, what=f"series of {record}")
        groups = http_get_json(f"{prom.url}/api/v1/rules")["data"]["groups"]
        unhealthy = [(rule["name"], rule.get("lastError")) for group in groups for rule in group["rules"]
                     if rule.get("health") not in ("ok", "unknown")]
        assert groups and not unhealthy, unhealthy
        assert not [a for a in prom.alerts() if a["state"] == "firing"], prom.alerts()
    # Five minutes of evaluation of the idle pod, from exactly what it exports.
    growpage_text = httpx.get(f"{server.url}{catalog.METRICS_PATH}", timeout=10).text
    vllm_text = httpx.get(f"{server.url}/metrics", timeout=10).text
    series = (_scraped_series(growpage_text, {**pod, "job": catalog.SCRAPE_JOB})
              + _scraped_series(vllm_text, {**pod, "job": "vllm"}))
    steps = IDLE_MINUTES * 4  # 15 s apart
    input_series = [{"series": _promtool_series(name, labels), "values": f"{value:g}x{steps}"}
                    for name, labels, value in series]
    input_series.append({"series": _promtool_series("up", {**pod, "job": catalog.SCRAPE_JOB}), "values": f"1x{steps}"})
    input_series.append({"series": _promtool_series("up", {**pod, "job": "vllm"}), "values": f"1x{steps}"})
    alert_names = sorted({rule["alert"] for group in yaml.safe_load(RULES_FILE.read_text())["groups"]
                          for rule in group["rules"] if "alert" in rule})
    test = {"rule_files": [str(RULES_FILE)], "evaluation_interval": "15s",
            "tests": [{"interval": "15s", "input_series": input_series,
                       "alert_rule_test": [{"eval_time": f"{IDLE_MINUTES}m", "alertname": name, "exp_alerts": []}
                                           for name in alert_names]}]}
    test_path = tmp_path / "idle-pod.test.yaml"
    test_path.write_text(yaml.safe_dump(test), encoding="utf-8")
    result = run_tool("promtool", "test", "rules", str(test_path), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
