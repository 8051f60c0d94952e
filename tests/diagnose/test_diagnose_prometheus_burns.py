"""Burn rates, clusters and the mixin config's selectors against a REAL Prometheus.

Seven hours of recorded series at one-minute resolution, loaded with ``promtool tsdb
create-blocks-from openmetrics``, ending an hour before now. vLLM's time to first token, per pod:

- cluster ``eu``, namespace ``chat``: no slow first token for 6.5 h, then 7 % over 2.5 s for the
  last 30 minutes: a 7x burn over ``--since 30m``, but the 6h/30m pair's long window holds only
  0.58 % bad and the 1h/5m pair is under 14.4x: the rules raise nothing.
- cluster ``eu``, namespace ``search``: 20 % over 2.5 s for the last 70 minutes: the 1h/5m pair of
  the fast burn holds (20 % > 14.4 %), the 6h/30m pair does not (6h: 3.9 %).
- cluster ``us``, namespace ``chat``: healthy.

The day-long windows of the slow burn (1d, 3d) reach before the data: not checked, and said so.

And Prometheus' own ``ALERTS`` series: the fast burn firing for ``eu``/``chat`` from 20 to 10
minutes before the end (what an on-call sees paged while its short window has fallen back).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import diagnose_scenarios as scenarios
import jsonschema
import pytest

from gpctl.main import app
from growpage import catalog
from growpage.diagnose.schema import REPORT_SCHEMA
from support.promstack import run_prometheus, run_tool

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                reason="prometheus/promtool not installed (scripts/install-system-deps.sh)")

HOURS = 7
STEP_S = 60.0
REQUESTS_PER_STEP = 60.0
# (cluster, region, namespace, pod) -> (bad share of first tokens, for how many final minutes)
PODS = {("eu", "west", "chat", "chat-0"): (0.07, 30), ("eu", "west", "search", "search-0"): (0.20, 70),
        ("us", "east", "chat", "chat-us-0"): (0.0, 0)}
FAST = "GrowPageVLLMTimeToFirstTokenFastBurn"
PAGED_MINUTES = (20, 10)  # the fast burn's ALERTS series for eu/chat: from, to (minutes before the end)


def _lines(labels: dict[str, str], bad: float, minutes: int, times: list[float]) -> dict[str, list[str]]:
    """OpenMetrics sample lines by family for one pod: build info and vLLM's TTFT histogram."""
    def text(name: str, more: dict[str, str], value: float, at: float) -> str:
        rendered = ",".join(f'{k}="{v}"' for k, v in {**labels, **more}.items())
        return f"{name}{{{rendered}}} {value!r} {at:.3f}"

    build = {"version": "0.1.0", "home": "vllm", "mode": "enforce", "block_size": "32", "base_pages": "64"}
    families: dict[str, list[str]] = {catalog.BUILD_INFO.name: [], catalog.VLLM_TTFT: []}
    good = total = 0.0
    histogram = catalog.VLLM_TTFT
    for at in times:
        burning = at > times[-1] - minutes * 60
        total += REQUESTS_PER_STEP
        good += REQUESTS_PER_STEP * (1 - (bad if burning else 0.0))
        families[catalog.BUILD_INFO.name].append(text(catalog.BUILD_INFO.name, {**build, "job": catalog.SCRAPE_JOB},
                                                      1.0, at))
        vllm = {"job": catalog.VLLM_SCRAPE_JOB, "engine": "0"}
        families[histogram] += [text(f"{histogram}_bucket", {**vllm, "le": "2.5"}, good, at),
                                text(f"{histogram}_bucket", {**vllm, "le": "+Inf"}, total, at),
                                text(f"{histogram}_count", vllm, total, at),
                                text(f"{histogram}_sum", vllm, total * 0.5, at)]
    return families


def openmetrics(end_s: float) -> str:
    times = [end_s - HOURS * 3600 + i * STEP_S for i in range(int(HOURS * 3600 / STEP_S) + 1)]
    families: dict[str, list[str]] = {}
    for (cluster, region, namespace, pod), (bad, minutes) in PODS.items():
        labels = {"cluster": cluster, "region": region, "namespace": namespace, "pod": pod,
                  catalog.MODEL_LABEL: scenarios.MODEL, "instance": f"{pod}.{cluster}:8000"}
        for family, lines in _lines(labels, bad, minutes, times).items():
            families.setdefault(family, []).extend(lines)
    paged = {"alertname": FAST, "alertstate": "firing", "severity": "critical", "long_window": "1h",
             "short_window": "5m", "cluster": "eu", "namespace": "chat", catalog.MODEL_LABEL: scenarios.MODEL}
    rendered = ",".join(f'{k}="{v}"' for k, v in paged.items())
    families["ALERTS"] = [f"ALERTS{{{rendered}}} 1.0 {at:.3f}" for at in times
                          if end_s - PAGED_MINUTES[0] * 60 <= at <= end_s - PAGED_MINUTES[1] * 60]
    types = {catalog.BUILD_INFO.name: "gauge", catalog.VLLM_TTFT: "histogram", "ALERTS": "gauge"}
    out = []
    for family, lines in families.items():
        out.append(f"# TYPE {family} {types[family]}")
        out += scenarios._group_by_series(lines)
    return "\n".join([*out, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def burning(tmp_path_factory):
    """A Prometheus serving the seven hours; yields (url, end of data as unix seconds)."""
    work = tmp_path_factory.mktemp("prometheus-burns")
    end_s = float(int(time.time() // 60) * 60 - 3600)
    data = work / "burns.om"
    data.write_text(openmetrics(end_s), encoding="utf-8")
    run_tool("promtool", "tsdb", "create-blocks-from", "openmetrics", str(data), str(work / "tsdb"))
    with run_prometheus(work / "server", [], storage_path=work / "tsdb") as prometheus:
        yield prometheus.url, end_s


def diagnose(runner, url: str, at_s: float, *args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["diagnose", "--prometheus", url, "--at", f"{at_s:.0f}", "--since", "30m",
                                 "--output", "json", *args])
    assert "Traceback" not in result.output and result.stdout.strip(), result.output
    document = json.loads(result.stdout)
    jsonschema.validate(document, REPORT_SCHEMA)
    return result.exit_code, document


def latency(document: dict) -> dict:
    return next(check for check in document["checks"] if check["id"] == "vllm-latency")


def pairs(check: dict) -> dict[tuple[str, str, str], dict]:
    return {(p["service"], p["alert"], p["long_window"]): p for p in check["evidence"]["burn_pairs"]}


def test_a_30_minute_burn_at_7x_is_not_reported_as_a_fast_burn(runner, burning):
    url, end_s = burning
    # One pod, no --cluster: exactly what the old verdict read as a critical fast burn.
    exit_code, document = diagnose(runner, url, end_s, "--namespace", "chat", "--pod", "chat-0")
    check = latency(document)
    # The window itself burns at 7x (what the old verdict compared with the lowest fast factor, 6x).
    assert check["evidence"]["window_burn_rate"]["vllm_time_to_first_token"] == pytest.approx(7.0, rel=0.05)
    assert (check["status"], check["alerts"], exit_code) == ("ok", [], 0), check["summary"]
    found = pairs(check)
    service = f"cluster eu, {catalog.MODEL_LABEL} {scenarios.MODEL}, namespace chat"
    six_hours = found[(service, FAST, "6h")]
    assert six_hours["state"] == "quiet" and six_hours["short_ratio"] == pytest.approx(0.07, rel=0.05)
    assert six_hours["long_ratio"] == pytest.approx(0.07 / 12, rel=0.1)
    assert found[(service, FAST, "1h")]["state"] == "quiet"
    # Seven hours of data cannot cover the slow burn's day-long windows: not checked, not guessed.
    slow = "GrowPageVLLMTimeToFirstTokenSlowBurn"
    assert found[(service, slow, "1d")]["state"] == found[(service, slow, "3d")]["state"] == "not_checked"
    assert check["not_checked"] and f"{slow} 1d/2h" in check["not_checked"]["reason"]
    assert any(item["id"] == "vllm-latency" and item["in_part"] for item in document["not_checked"])


def test_the_report_names_the_alert_and_window_pair_the_rules_raise(runner, burning):
    url, end_s = burning
    exit_code, document = diagnose(runner, url, end_s, "--cluster", "eu")
    check = latency(document)
    assert (check["status"], check["alerts"], exit_code) == ("critical", [FAST], 2), check["summary"]
    service = f"cluster eu, {catalog.MODEL_LABEL} {scenarios.MODEL}, namespace search"
    firing = [key for key, p in pairs(check).items() if p["state"] == "firing"]
    assert firing == [(service, FAST, "1h")], firing
    assert f"{FAST} (1h/5m: " in check["summary"] and service in check["summary"]
    # The breakdown judges each namespace's services: chat does not burn, search does.
    scopes = check["breakdown"]["scopes"]
    assert (scopes["chat"]["status"], scopes["search"]["status"]) == ("ok", "critical")


def test_a_page_firing_in_prometheus_is_named_though_its_windows_have_fallen_back(runner, burning):
    url, end_s = burning
    at_s = end_s - (PAGED_MINUTES[1] + 2) * 60  # the page fires; chat's 1h window holds 2 % bad, under 14.4 %
    exit_code, document = diagnose(runner, url, at_s, "--cluster", "eu", "--namespace", "chat")
    check = latency(document)
    assert (check["status"], check["alerts"], exit_code) == ("critical", [FAST], 2), check["summary"]
    service = f"cluster eu, {catalog.MODEL_LABEL} {scenarios.MODEL}, namespace chat"
    assert all(p["state"] != "firing" for p in check["evidence"]["burn_pairs"])
    assert check["evidence"]["firing_in_prometheus"] == [{"alert": FAST, "service": service}]
    assert f"{FAST} (firing in Prometheus, {service}" in check["summary"]
    # once the page resolves (its series gone past the lookback), the report is quiet again
    exit_code, document = diagnose(runner, url, end_s, "--cluster", "eu", "--namespace", "chat")
    assert (latency(document)["status"], exit_code) == ("ok", 0)


def test_cluster_scopes_every_query(runner, burning, tmp_path: Path):
    import tarfile
    url, end_s = burning
    bundle = tmp_path / "us.tar.gz"
    exit_code, document = diagnose(runner, url, end_s, "--cluster", "us", "--bundle", str(bundle))
    assert exit_code == 0 and document["source"]["selector"] == '{cluster="us"}', document["source"]
    services = {p["service"] for p in latency(document)["evidence"]["burn_pairs"]}
    assert services == {f"cluster us, {catalog.MODEL_LABEL} {scenarios.MODEL}, namespace chat"}
    with tarfile.open(bundle) as archive:
        queries = json.loads(archive.extractfile("raw/prometheus-queries.json").read())
    selecting = [entry["query"] for entry in queries if catalog.BUILD_INFO.name in entry["query"]]
    assert selecting and all('cluster="us"' in query for query in selecting)
    # Without --cluster both clusters' "chat" are read together, and a note says so.
    _, everything = diagnose(runner, url, end_s)
    assert any("series from 2 clusters (eu, us" in note and "--cluster" in note for note in everything["notes"])


def test_the_mixin_configs_cluster_label_and_selector_scope_the_queries(runner, burning, tmp_path: Path):
    url, end_s = burning
    config = tmp_path / "mixin.yaml"
    config.write_text('cluster_label: region\ngrowpage_selector: namespace="search"\n'
                      'vllm_selector: namespace="search"\n')
    exit_code, document = diagnose(runner, url, end_s, "--mixin-config", str(config), "--cluster", "west")
    assert document["source"]["selector"] == '{region="west"}'
    check = latency(document)
    # Only search is read: its burn, kept per service with the config's cluster label.
    assert {p["service"] for p in check["evidence"]["burn_pairs"]} == {
        f"{catalog.MODEL_LABEL} {scenarios.MODEL}, namespace search, region west"}
    assert (check["status"], exit_code) == ("critical", 2)
    assert set(check["breakdown"]["scopes"]) == {"search"}


@pytest.mark.parametrize(("args", "config", "fragment"), [
    (["--cluster", "nosuch"], None, "clusters: eu, us"),
    (["--cluster", " "], None, "--cluster needs a cluster name"),
    ([], 'growpage_selector: namespace="nosuch"\n', "growpage_selector 'namespace=\"nosuch\"' (--mixin-config)"),
])
def test_a_bad_cluster_or_mixin_config_is_one_line_with_the_fix(runner, burning, tmp_path, args, config, fragment):
    url, end_s = burning
    extra = []
    if config is not None:
        path = tmp_path / "mixin.yaml"
        path.write_text(config)
        extra = ["--mixin-config", str(path)]
    result = runner.invoke(app, ["diagnose", "--prometheus", url, "--at", f"{end_s:.0f}", *args, *extra])
    assert result.exit_code == 3 and "Traceback" not in result.output, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and fragment in result.stderr, result.stderr


def test_cluster_goes_with_prometheus(runner, tmp_path):
    snapshot = tmp_path / "a.prom"
    snapshot.write_text(scenarios.text_exposition(scenarios.samples(scenarios.HEALTHY, 0.0)))
    result = runner.invoke(app, ["diagnose", "--snapshot", str(snapshot), "--cluster", "eu"])
    assert result.exit_code == 3 and "--cluster" in result.stderr and "go with --prometheus" in result.stderr
