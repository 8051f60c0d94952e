"""vLLM's real router in front of two real GrowPage replicas sends requests to the one with KV headroom.

``gpctl fleet``'s library starts two ``gpctl serve --engine vllm --mode enforce`` replicas on loopback
(replica A with a small KV space, B with a larger one; one CPU each) and ``vllm-router --policy
power_of_two`` polling their ``/get_load`` every second. Long requests sent straight to A fill its
KV (each client sends its next request as soon as one ends, until the test is done, so A stays busy
however fast the machine), so A's load rises while B's stays 0; then requests sent one at a time through the router must
all land on B (counted by B's own ``vllm:request_success_total``). With vLLM's own load (no
``/get_load``) the router would see two replicas with nothing in flight from it and pick either.
About three minutes; the fleet's process groups are stopped at the end whatever happens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.vllm_guard import require_vllm_plugin

require_vllm_plugin()

import httpx

from growpage import catalog
from growpage.tooling.fleet import Fleet, fleet_spec, router_executable
from support.promstack import free_port

pytestmark = pytest.mark.slow

MODEL = "growpage-fleet-test"
BACKGROUND_REQUESTS = 4
BACKGROUND_TOKENS = 480
ROUTED_REQUESTS = 6
POLLS = 120  # one-second polls for A's load to rise, at most


@pytest.fixture(scope="module")
def fleet(prepared_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    try:
        router_executable()
    except Exception as error:  # GrowPageError: the message says how to install it
        pytest.skip(str(error))
    base = free_port()
    spec = fleet_spec(replicas=2, port=free_port(), router_port=free_port(), metrics_port=base, mode="enforce",
                      kv_blocks=[20, 96], base_pages=6, max_model_len=512, max_num_seqs=8,
                      model=str(prepared_model_dir), served_model_name=MODEL, load_poll_s=1, cpu_binds=("0", "1"),
                      router_metrics_port=free_port())
    with Fleet(spec, tmp_path_factory.mktemp("fleet")) as running:
        running.start(startup_timeout_s=600)
        yield running


def _load(url: str) -> int:
    return int(httpx.get(f"{url}{catalog.LOAD_PATH}", timeout=10).json()["load"])


def _successes(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


def _complete(url: str, prompt: str, max_tokens: int) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    try:
        httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    except httpx.HTTPError:
        pass  # a background request cut short when the fleet stops


def _keep_busy(url: str, client: int, done: threading.Event) -> None:
    """Send long requests to ``url`` back to back until ``done``; lengths differ per client, so the
    clients never all finish at once and A's load never touches 0 between them."""
    request = 0
    while not done.is_set():
        _complete(url, f"Write a long story number {client}-{request}.", BACKGROUND_TOKENS - 60 * client)
        request += 1


def test_every_replica_answers_the_routers_load_poll(fleet):
    loads = httpx.get(f"{fleet.spec.router_url}/get_loads", timeout=30).json()["workers"]
    assert sorted(w["worker"] for w in loads) == sorted(r.url for r in fleet.spec.replicas)
    assert all(w["load"] == 0 for w in loads)  # idle, and GrowPage answered (the router writes -1 otherwise)


def test_requests_go_to_the_replica_with_headroom(fleet):
    small, large = (r.url for r in fleet.spec.replicas)
    done = threading.Event()
    background = [threading.Thread(target=_keep_busy, args=(small, client, done), daemon=True)
                  for client in range(BACKGROUND_REQUESTS)]
    for thread in background:
        thread.start()
    try:
        _route_while_a_is_busy(fleet, small, large)
    finally:
        done.set()


def _route_while_a_is_busy(fleet: Fleet, small: str, large: str) -> None:
    for _ in range(POLLS):
        if _load(small) > 0:
            break
        time.sleep(1.0)
    time.sleep(3.0)  # the router's monitor polls every second: let it read the new load
    loads = {w["worker"]: w["load"] for w in httpx.get(f"{fleet.spec.router_url}/get_loads", timeout=30).json()
             ["workers"]}
    assert loads[small] > loads[large] == 0, loads
    before = _successes(large)
    for index in range(ROUTED_REQUESTS):  # one at a time: the router's own in-flight counts stay 0
        _complete(fleet.spec.router_url, f"Say hello number {index}.", 4)
    assert _load(small) > 0, "A went idle while the routed requests were sent; add background clients"
    assert _successes(large) - before == ROUTED_REQUESTS


def _router_samples(fleet: Fleet) -> dict[str, list[tuple[str, float]]]:
    """The router's own exposition: series name -> (labels, value) of each sample."""
    samples: dict[str, list[tuple[str, float]]] = {}
    for line in httpx.get(fleet.spec.router_metrics_url, timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name, _, labels = series.partition("{")
            samples.setdefault(name, []).append((labels, float(value)))
    return samples


def test_the_router_exports_what_its_panels_and_alerts_read(fleet):
    """Runs after the routed requests: the counters the router alerts read exist once incremented."""
    samples = _router_samples(fleet)
    health = samples.get(catalog.ROUTER_WORKER_HEALTH, [])
    assert sorted(v for _, v in health) == [1.0, 1.0], health  # both replicas healthy, one series each
    assert all(f'{catalog.ROUTER_WORKER_LABEL}="' in labels for labels, _ in health)
    assert samples[catalog.ROUTER_ACTIVE_WORKERS][0][1] == 2
    assert sum(v for _, v in samples[catalog.ROUTER_REQUESTS]) >= ROUTED_REQUESTS
    assert set(samples) <= set(catalog.ROUTER_METRICS_SERIES) | {n for n in samples if not n.startswith("vllm_router_")
                                                                 } | _UNUSED_ROUTER_SERIES, sorted(samples)


# What vllm-router 0.1.17 exports beyond what the panels and alerts read (so a new series in an upgrade
# shows here): its end-to-end latency histogram per route (the replicas' own TTFT and ITL SLOs page on
# latency) and its circuit breakers' outcomes (their state, vllm_router_cb_state, is in the availability runbooks).
_UNUSED_ROUTER_SERIES = {"vllm_router_generate_duration_seconds_bucket", "vllm_router_generate_duration_seconds_sum",
                         "vllm_router_generate_duration_seconds_count", "vllm_router_cb_outcomes_total"}

