"""Live source: scrape the agent's ``/metrics/growpage`` (and a DCGM exporter) twice, ``duration`` apart.

Two scrapes make rates real: counters and histograms are increases between them. The first scrape
is validated before waiting, so a wrong URL fails in seconds, not after ``--duration``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from growpage import catalog
from growpage.diagnose.errors import DiagnoseError
from growpage.diagnose.exposition import Exposition, parse_exposition, with_snapshot_time
from growpage.diagnose.scrapes import observations_from_expositions
from growpage.diagnose.sources import http
from growpage.diagnose.sources.result import SourceResult

DCGM_METRICS_PATH = "/metrics"


def observe(endpoint_url: str, dcgm_url: str | None = None, duration_s: float = 15.0,
            timeout_s: float = 10.0, sleep: Callable[[float], None] = time.sleep,
            dcgm_labels: Mapping[str, str] | None = None) -> SourceResult:
    """Scrape twice ``duration_s`` apart; raises DiagnoseError when the agent cannot be read.

    Args:
        dcgm_labels: target -> source label naming the GPU's user in DCGM series.
    """
    agent_url = http.with_default_path(http.check_url(endpoint_url, "--endpoint"), catalog.METRICS_PATH)
    dcgm_url = http.with_default_path(http.check_url(dcgm_url, "--dcgm"), DCGM_METRICS_PATH) if dcgm_url else None
    with http.make_client(timeout_s) as client:
        agent, dcgm, response_times_s = [], [], []
        for index in range(2):
            if index:
                sleep(duration_s)
            exposition, elapsed_s = _scrape_agent(client, agent_url)
            agent.append(exposition)
            response_times_s.append(elapsed_s)
            if dcgm_url:
                dcgm.append(_scrape_dcgm(client, dcgm_url))
    source = {"kind": "endpoint", "target": agent_url, "dcgm": dcgm_url, "duration_s": duration_s}
    observations = observations_from_expositions(agent, dcgm, source, response_time_s=max(response_times_s),
                                                 dcgm_labels=dcgm_labels)
    raw = [(f"raw/agent-{i + 1}.prom", with_snapshot_time(e.text, e.time_s)) for i, e in enumerate(agent)]
    raw += [(f"raw/dcgm-{i + 1}.prom", with_snapshot_time(e.text, e.time_s)) for i, e in enumerate(dcgm)]
    return SourceResult(observations=observations, raw_files=tuple(raw))


def _fetch(client, url: str, what: str) -> tuple[Exposition, float]:
    response = http.get(client, url, what)
    if response.status_code == 404:
        raise DiagnoseError(f"{what} at {url} answered HTTP 404: check the path (the agent serves "
                            f"{catalog.METRICS_PATH}, DCGM exporters serve {DCGM_METRICS_PATH})")
    if response.status_code != 200:
        raise DiagnoseError(f"{what} at {url} answered HTTP {response.status_code}: check that it is "
                            "healthy (its logs) and that this is its metrics URL")
    exposition = parse_exposition(response.text, url, response.received_at_s, response.content_type)
    return exposition, response.elapsed_s


def _scrape_agent(client, url: str) -> tuple[Exposition, float]:
    exposition, elapsed_s = _fetch(client, url, "the agent")
    if not exposition.has_growpage:
        hint = ("this looks like vLLM's own /metrics; GrowPage serves " + catalog.METRICS_PATH
                if any(sample.name.startswith("vllm:") for sample in exposition.samples)
                else f"is the GrowPage plugin loaded (mode not off) and is this its {catalog.METRICS_PATH} route?")
        raise DiagnoseError(f"{url} serves no growpage_* metrics: {hint}")
    return exposition, elapsed_s


def _scrape_dcgm(client, url: str) -> Exposition:
    exposition, _ = _fetch(client, url, "the DCGM exporter")
    if not exposition.has_dcgm:
        raise DiagnoseError(f"{url} serves no {catalog.DCGM_FB_USED}/{catalog.DCGM_FB_FREE}: is it a "
                            "DCGM exporter with the default counters? (or leave out --dcgm)")
    return exposition
