"""Live source: scrape the agent's ``/metrics/growpage`` (and a DCGM exporter) twice, ``duration`` apart.

Two scrapes make rates real: counters and histograms are increases between them. The first scrape
is validated before waiting, so a wrong URL fails in seconds, not after ``--duration``. vLLM's own
``/metrics`` on the same server is read alongside, for the series the user-facing alerts read (its
latency histograms, preemptions, KV usage, queue); when it cannot be read, a note says so and the
checks that need it say unknown.
"""

from __future__ import annotations

import dataclasses
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from growpage import catalog
from growpage.diagnose.checks.vllm import VLLM_HOME
from growpage.diagnose.errors import DiagnoseError
from growpage.diagnose.exposition import Exposition, parse_exposition, with_snapshot_time
from growpage.diagnose.scrapes import observations_from_expositions
from growpage.diagnose.sources import http
from growpage.diagnose.sources.result import SourceResult

if TYPE_CHECKING:
    import httpx

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
    vllm_url = urllib.parse.urlunparse(urllib.parse.urlparse(agent_url)._replace(path=catalog.VLLM_METRICS_PATH))
    with http.make_client(timeout_s) as client:
        agent, dcgm, vllm, response_times_s = [], [], [], []
        vllm_problem: str | None = None
        for index in range(2):
            if index:
                sleep(duration_s)
            exposition, elapsed_s = _scrape_agent(client, agent_url)
            response_times_s.append(elapsed_s)
            if index == 0 and _home(exposition) not in (None, VLLM_HOME):
                vllm_problem = ""  # the reference engine: no vLLM to read, nothing to note
            if vllm_problem is None:
                found, vllm_problem = _scrape_vllm(client, vllm_url)
                if found is not None:
                    vllm.append(found)
                    exposition = _merged(exposition, found)
            agent.append(exposition)
            if dcgm_url:
                dcgm.append(_scrape_dcgm(client, dcgm_url))
    if vllm_problem is not None:
        agent = [_without_vllm(e) for e in agent]  # both scrapes or neither: increases need both
    source = {"kind": "endpoint", "target": agent_url, "dcgm": dcgm_url, "duration_s": duration_s}
    notes = (() if not vllm_problem else
             (f"vLLM's own metrics were not read ({vllm_problem}): the checks on what users feel say unknown",))
    observations = observations_from_expositions(agent, dcgm, source, response_time_s=max(response_times_s),
                                                 dcgm_labels=dcgm_labels, notes=notes)
    raw = [(f"raw/agent-{i + 1}.prom", with_snapshot_time(e.text, e.time_s)) for i, e in enumerate(agent)]
    # Stamped with its agent scrape's time: a replay attaches it to that snapshot.
    raw += [(f"raw/vllm-{i + 1}.prom", with_snapshot_time(e.text, agent[i].time_s)) for i, e in enumerate(vllm)
            if vllm_problem is None]
    raw += [(f"raw/dcgm-{i + 1}.prom", with_snapshot_time(e.text, e.time_s)) for i, e in enumerate(dcgm)]
    return SourceResult(observations=observations, raw_files=tuple(raw))


def _home(exposition: Exposition) -> str | None:
    """The agent's home from its build info (``None`` when it exports none)."""
    homes = {s.labels.get("home") for s in exposition.samples if s.name == catalog.BUILD_INFO.name}
    return next(iter(homes)) if len(homes) == 1 else None


def _scrape_vllm(client: httpx.Client, url: str) -> tuple[Exposition | None, str | None]:
    """vLLM's /metrics, or why it could not be read (never fatal: GrowPage's route is the source)."""
    try:
        response = http.get(client, url, "vLLM")
        if response.status_code != 200:
            return None, f"{url} answered HTTP {response.status_code}"
        exposition = parse_exposition(response.text, url, response.received_at_s, response.content_type)
    except DiagnoseError as error:
        return None, str(error)
    if not any(sample.name.startswith("vllm:") for sample in exposition.samples):
        return None, f"{url} serves no vllm:* series"
    return exposition, None


def _merged(agent: Exposition, vllm: Exposition) -> Exposition:
    """The agent's scrape with vLLM's series of the same moment added (the text stays the agent's)."""
    samples = tuple(sample for sample in vllm.samples if sample.name.startswith("vllm:"))
    return dataclasses.replace(agent, samples=(*agent.samples, *samples))


def _without_vllm(exposition: Exposition) -> Exposition:
    return dataclasses.replace(exposition,
                               samples=tuple(s for s in exposition.samples if not s.name.startswith("vllm:")))


def _fetch(client: httpx.Client, url: str, what: str) -> tuple[Exposition, float]:
    response = http.get(client, url, what)
    if response.status_code == 404:
        raise DiagnoseError(f"{what} at {url} answered HTTP 404: check the path (the agent serves "
                            f"{catalog.METRICS_PATH}, DCGM exporters serve {DCGM_METRICS_PATH})")
    if response.status_code != 200:
        raise DiagnoseError(f"{what} at {url} answered HTTP {response.status_code}: check that it is "
                            "healthy (its logs) and that this is its metrics URL")
    exposition = parse_exposition(response.text, url, response.received_at_s, response.content_type)
    return exposition, response.elapsed_s


def _scrape_agent(client: httpx.Client, url: str) -> tuple[Exposition, float]:
    exposition, elapsed_s = _fetch(client, url, "the agent")
    if not exposition.has_growpage:
        hint = ("this looks like vLLM's own /metrics; GrowPage serves " + catalog.METRICS_PATH
                if any(sample.name.startswith("vllm:") for sample in exposition.samples)
                else f"is the GrowPage plugin loaded (mode not off) and is this its {catalog.METRICS_PATH} route?")
        raise DiagnoseError(f"{url} serves no growpage_* metrics: {hint}")
    return exposition, elapsed_s


def _scrape_dcgm(client: httpx.Client, url: str) -> Exposition:
    exposition, _ = _fetch(client, url, "the DCGM exporter")
    if not exposition.has_dcgm:
        raise DiagnoseError(f"{url} serves no {catalog.DCGM_FB_USED}/{catalog.DCGM_FB_FREE}: is it a "
                            "DCGM exporter with the default counters? (or leave out --dcgm)")
    return exposition
