"""``gpctl calibrate`` against the real core in monitor mode behind the real telemetry agent: from its
endpoint, from saved snapshots, and from a real Prometheus that scraped it.

What a user checks: each threshold cuts the requests that really ran at its stated quantile (up to
the width of the bucket the threshold falls in, all a histogram can tell), the sample counts are the
requests and decisions that happened in the window, and the file loads as a GrowPage config.
"""

from __future__ import annotations

import json
import math
import shlex
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from calibrate_workload import BLOCK_SIZE, MODEL

from gpctl.main import app
from growpage import catalog
from growpage.config import load_config
from support.promstack import run_prometheus, wait_until

QUANTILES = {"lts_grow_threshold": 0.75, "rollout_entropy_threshold": 0.9, "density_threshold": 0.75,
             "base_pages": 0.5}


def invoke(runner, *args: str):
    result = runner.invoke(app, ["calibrate", *args])
    assert "Traceback" not in result.output, result.output
    return result


def calibrate_json(runner, *args: str) -> dict:
    result = invoke(runner, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def share_at_or_below(values: list[float], bound: float) -> float:
    return sum(value <= bound for value in values) / len(values)


def assert_cuts_at(values: list[float], bounds: tuple[float, ...], threshold: float, q: float) -> None:
    """``threshold`` is the q quantile of ``values`` as far as buckets ``bounds`` can tell: the share of
    values at or below the bucket's lower bound is <= q <= the share at or below its upper bound."""
    edges = (0.0, *bounds, math.inf)
    low, high = next((edges[i - 1], edges[i]) for i in range(1, len(edges)) if threshold <= edges[i])
    assert share_at_or_below(values, low) <= q <= share_at_or_below(values, high), (threshold, low, high)


def assert_matches_requests(document: dict, lts: list[float], density: list[float], tokens: list[int]) -> None:
    settings = document["settings"]
    assert settings["lts_grow_threshold"]["samples"] == len(lts)
    assert settings["density_threshold"]["samples"] == len(density)
    assert settings["base_pages"]["samples"] == len(tokens)
    for name, q in QUANTILES.items():
        assert settings[name]["quantile"] == q
    grow, rollout = settings["lts_grow_threshold"], settings["rollout_entropy_threshold"]
    # About the top quarter of the requests that ran has LTS above lts_grow_threshold: they grow.
    assert_cuts_at(lts, catalog.LTS_ENTROPY.buckets, grow["observed"], 0.75)
    assert_cuts_at(lts, catalog.LTS_ENTROPY.buckets, rollout["observed"], 0.9)
    assert_cuts_at(density, catalog.STS_DENSITY.buckets, settings["density_threshold"]["observed"], 0.75)
    median = settings["base_pages"]["observed"]
    assert_cuts_at(tokens, catalog.REQUEST_TOKENS.buckets, median, 0.5)
    assert settings["base_pages"]["value"] == max(6, math.ceil(median / BLOCK_SIZE))
    assert grow["value"] == round(grow["observed"], 4) <= rollout["value"]


def assert_loads(path: Path, document: dict) -> None:
    config = load_config(path, env={})
    values = {name: setting["value"] for name, setting in document["settings"].items()}
    assert {name: getattr(config, name) for name in values} == values
    assert config.block_size == BLOCK_SIZE == document["block_size"]
    assert document["block_size_from"] == catalog.BUILD_INFO.name


def test_from_the_endpoint_since_the_agent_started(runner, monitored, tmp_path):
    monitored.serve(80)
    recorded = monitored.recorded
    output = tmp_path / "calibrated.yaml"
    document = calibrate_json(runner, "--endpoint", monitored.url, "--output", str(output))
    assert document["model"] == MODEL and document["output"] == str(output)
    assert document["window"]["kind"] == "lifetime"
    assert_matches_requests(document, recorded.lts_at_finish, recorded.density_at_decision,
                            recorded.tokens_at_finish)
    assert_loads(output, document)
    text = output.read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert header[0].startswith("# GrowPage settings calibrated by gpctl calibrate")
    assert f"# Command: gpctl calibrate --endpoint {monitored.url} --output {output}" in header
    assert f"# Source: endpoint {monitored.url}{catalog.METRICS_PATH}" in header
    assert "# Window: since agent start, one snapshot" in header
    assert (f"# Samples: {catalog.LTS_ENTROPY.name} {len(recorded.lts_at_finish)}, "
            f"{catalog.STS_DENSITY.name} {len(recorded.density_at_decision)}, "
            f"{catalog.REQUEST_TOKENS.name} {len(recorded.tokens_at_finish)}") in header
    assert any(line.startswith(f"#   lts_grow_threshold: {document['settings']['lts_grow_threshold']['value']}  "
                               f"<- q0.75 of {catalog.LTS_ENTROPY.name}") for line in header)
    assert text.index("growpage:") > text.index(header[-1])  # the evidence comes first

    # The plain run says what it wrote in one line.
    result = invoke(runner, "--endpoint", monitored.url, "--output", str(output), "--lts-quantile", "0.5")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {output} for model {MODEL}")
    assert "--lts-quantile 0.5" in output.read_text()
    assert load_config(output, env={}).lts_grow_threshold <= document["settings"]["lts_grow_threshold"]["value"]


def test_from_snapshots_reads_the_increase_between_them(runner, monitored, tmp_path, monkeypatch):
    monitored.serve(30)
    before = len(monitored.recorded.lts_at_finish), len(monitored.recorded.density_at_decision), \
        len(monitored.recorded.tokens_at_finish)
    first, second = tmp_path / "before.prom", tmp_path / "after.prom"
    # The stamps are fixed, a minute apart: how long serving takes between the scrapes must not
    # change the window the header reports (the clock is the snapshot's, not the test's).
    stamp = 1_700_000_000.0
    first.write_text(f"# growpage-snapshot-time: {stamp:.3f}\n"
                     + httpx.get(monitored.url + catalog.METRICS_PATH).text)
    monitored.serve(70)
    second.write_text(f"# growpage-snapshot-time: {stamp + 60:.3f}\n"
                      + httpx.get(monitored.url + catalog.METRICS_PATH).text)
    recorded = monitored.recorded
    lts, density, tokens = (recorded.lts_at_finish[before[0]:], recorded.density_at_decision[before[1]:],
                            recorded.tokens_at_finish[before[2]:])

    monkeypatch.chdir(tmp_path)
    result = invoke(runner, "--snapshot", str(first), str(second), "--dry-run")
    assert result.exit_code == 0, result.output
    assert not Path("growpage-calibrated.yaml").exists()  # --dry-run writes nothing, not even the default
    assert result.stdout.startswith("# GrowPage settings calibrated")
    assert "# Window: 1m, 2 snapshots" in result.stdout
    printed = yaml.safe_load(result.stdout)["growpage"]
    document = calibrate_json(runner, "--snapshot", str(first), str(second), "--dry-run")
    assert document["output"] is None and document["config"]["growpage"] == printed
    assert_matches_requests(document, lts, density, tokens)

    # The command in the header reproduces the file.
    written = tmp_path / "written.yaml"
    result = invoke(runner, "--snapshot", str(first), str(second), "--output", str(written))
    command = next(line for line in written.read_text().splitlines() if line.startswith("# Command: "))
    args = shlex.split(command.removeprefix("# Command: "))
    assert args[:2] == ["gpctl", "calibrate"]
    again = tmp_path / "again.yaml"
    args[args.index("--output") + 1] = str(again)
    assert invoke(runner, *args[2:]).exit_code == 0
    assert yaml.safe_load(again.read_text()) == yaml.safe_load(written.read_text()) == {"growpage": printed}


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="prometheus not installed (scripts/install-system-deps.sh)")
def test_from_prometheus_matches_its_histogram_quantile(runner, monitored, tmp_path):
    """Bucket increases over the window give the same quantiles Prometheus itself computes."""
    stop = threading.Event()
    engine = threading.Thread(target=monitored.serve, args=(1_000_000, stop), name="engine", daemon=True)
    scrape = {"job_name": catalog.SCRAPE_JOB, "metrics_path": catalog.METRICS_PATH, "scrape_interval": "500ms",
              "scrape_timeout": "400ms", "static_configs": [{"targets": [monitored.url.removeprefix("http://")],
                                                            "labels": {"namespace": "chat"}}]}
    engine.start()
    try:
        with run_prometheus(tmp_path / "prometheus", [scrape]) as prometheus:
            def enough() -> str | None:
                """An evaluation time whose 20 s window holds 60 observations of each distribution."""
                at = round(time.time() - 1, 3)
                counts = [prometheus.query(f"sum(increase({spec.name}_count[20s]))", at=at)
                          for spec in (catalog.LTS_ENTROPY, catalog.STS_DENSITY, catalog.REQUEST_TOKENS)]
                return f"{at:.3f}" if all(count and float(count[0]["value"][1]) >= 60 for count in counts) else None
            at = wait_until(enough, 40, interval_s=0.5, what="60 observations of each distribution in 20s")
            output = tmp_path / "calibrated.yaml"
            document = calibrate_json(runner, "--prometheus", prometheus.url, "--since", "20s", "--at", at,
                                      "--namespace", "chat", "--output", str(output))
            metrics = {"lts_grow_threshold": catalog.LTS_ENTROPY, "rollout_entropy_threshold": catalog.LTS_ENTROPY,
                       "density_threshold": catalog.STS_DENSITY, "base_pages": catalog.REQUEST_TOKENS}
            for name, spec in metrics.items():
                q = QUANTILES[name]
                expected = prometheus.query(f'histogram_quantile({q}, sum by (le) (increase({spec.name}_bucket'
                                            f'{{namespace="chat"}}[20s])))', at=float(at))
                assert document["settings"][name]["observed"] == pytest.approx(float(expected[0]["value"][1]),
                                                                               rel=1e-6, abs=1e-6), name
            assert document["source"]["selector"] == '{namespace="chat"}'
            assert document["window"]["kind"] == "range" and document["window"]["duration_s"] == 20
            assert_loads(output, document)

            missing = invoke(runner, "--prometheus", prometheus.url, "--since", "20s", "--namespace", "batch",
                             "--dry-run")
            assert missing.exit_code == 2
            assert "has no growpage_lts_entropy" in missing.stderr and len(missing.stderr.splitlines()) == 1
    finally:
        stop.set()
        engine.join(timeout=30)
