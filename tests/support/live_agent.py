"""A live reference agent for end-to-end tests, and a bounded loopback load driver.

``run_live_agent`` starts exactly what ``gpctl serve`` runs (``build_stack``: the real engine, the
telemetry agent on ``/metrics/growpage``, the engine thread, the FastAPI app) under the real uvicorn
on a free loopback port. Pass the session fixtures ``llama_model``/``tokenizer``/``prepared_model_dir``
so the model loads once per session::

    with run_live_agent(GrowPageConfig(mode="enforce", base_pages=2), model=llama_model,
                        tokenizer=tokenizer, model_dir=prepared_model_dir) as agent:
        result = drive_load(agent.url, agent.model, num_requests=4, max_tokens=32)
        httpx.get(agent.metrics_url)

``drive_load`` sends completions with bounded concurrency and a time limit, to loopback only, and
returns when every request is answered or time is up; ``background_load`` runs it on a thread while
the test watches Prometheus, and stops it on exit.

Torch runs one intra-op thread while the agent runs (``torch_threads``): the model is tiny, and on
a busy 2-core machine a second thread spin-waits for a core and makes steps ~10x slower. PyTorch
copies the process setting into a thread on that thread's first parallel op, so it is set before
the engine thread starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import httpx

from growpage import catalog
from growpage.config import GrowPageConfig
from growpage.diagnose.exposition import parse_exposition
from support.promstack import free_port, wait_until

MODEL = "smollm2-live"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
PROMPTS = (
    "Explain why the sky is blue.",
    "List three uses of a paperclip.",
    "Write a short poem about autumn.",
    "Describe how a bicycle works.",
    "Give two tips for learning to cook.",
    "What makes a good morning routine?",
)


@dataclasses.dataclass
class LiveAgent:
    """A running reference server: ``url`` (http://127.0.0.1:PORT) and the stack behind it."""

    url: str
    port: int
    model: str
    stack: object  # growpage.engine.serving.ServingStack

    @property
    def target(self) -> str:
        """``host:port`` for a Prometheus static_config."""
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}{catalog.METRICS_PATH}"

    def scrape(self) -> str:
        response = httpx.get(self.metrics_url, timeout=10)
        response.raise_for_status()
        return response.text

    def exported(self, name: str) -> float:
        """The sum of ``name``'s series on the agent's metrics endpoint, as a scraper reads it now."""
        exposition = parse_exposition(self.scrape(), self.metrics_url, time.time())
        return sum(sample.value for sample in exposition.samples if sample.name == name)

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        """Until the engine has no request left (every page returned) and its metrics endpoint says so
        too: no request running and no grant still arriving. A scraper reads the exported snapshot,
        which can trail the engine on a loaded machine (an idle pod then read as running in CI)."""
        engine = self.stack.engine
        wait_until(lambda: not engine.has_unfinished_requests(), timeout_s, what="the engine to go idle")
        wait_until(lambda: self.exported(catalog.REQUESTS_RUNNING.name) == 0, timeout_s, interval_s=0.1,
                   what="no running request on the metrics endpoint")
        grants = [self.exported(catalog.ALLOCATIONS.name)]

        def no_new_grant() -> bool:
            now = self.exported(catalog.ALLOCATIONS.name)
            settled, grants[0] = now == grants[0], now
            return settled

        wait_until(no_new_grant, timeout_s, interval_s=0.5, what="grants to stop arriving on the metrics endpoint")


def scrape_config(agent: LiveAgent, labels: Mapping[str, str] | None = None, interval: str = "1s") -> dict:
    """The contract's scrape job (``vllm-growpage`` at ``/metrics/growpage``) for ``agent``;
    ``labels`` stand in for what Kubernetes service discovery adds (namespace, pod)."""
    static = {"targets": [agent.target], **({"labels": dict(labels)} if labels else {})}
    return {"job_name": catalog.SCRAPE_JOB, "metrics_path": catalog.METRICS_PATH,
            "scrape_interval": interval, "scrape_timeout": interval, "static_configs": [static]}


@contextlib.contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """``torch.set_num_threads(num_threads)`` for the block (``None``: leave it)."""
    if num_threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def run_live_agent(growpage_config: GrowPageConfig, *, model, tokenizer, model_dir: str | Path,
                   num_pages: int = 400, max_num_seqs: int = 8, max_num_batched_tokens: int = 512,
                   served_model_name: str = MODEL, num_threads: int | None = 1,
                   startup_timeout_s: float = 60.0) -> Iterator[LiveAgent]:
    """The reference server (``build_stack`` + uvicorn) on a free loopback port until exit.

    Args:
        growpage_config: GrowPage's settings (mode, base_pages, ...).
        model, tokenizer: already loaded (the session fixtures ``llama_model``, ``tokenizer``).
        model_dir: the prepared folder (``prepared_model_dir``).
        num_pages, max_num_seqs, max_num_batched_tokens: engine settings (``EngineConfig``).
        num_threads: torch intra-op threads while the agent runs (``None``: leave the setting).
    """
    import uvicorn

    from growpage.engine.engine import EngineConfig
    from growpage.engine.serving import build_stack

    engine_config = EngineConfig(model_dir=str(model_dir), num_pages=num_pages, max_num_seqs=max_num_seqs,
                                 max_num_batched_tokens=max_num_batched_tokens,
                                 served_model_name=served_model_name)
    with torch_threads(num_threads):
        stack = build_stack(engine_config, growpage_config, model=model, tokenizer=tokenizer)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(stack.app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{port}"
        try:
            def healthy() -> bool:
                if not thread.is_alive():
                    raise RuntimeError("the live agent's server thread exited during start-up")
                try:
                    return httpx.get(f"{url}/health", timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False
            wait_until(healthy, startup_timeout_s, what=f"{url}/health")
            yield LiveAgent(url=url, port=port, model=served_model_name, stack=stack)
        finally:
            server.should_exit = True  # the app's lifespan stops the engine thread
            thread.join(timeout=30)
            stack.close()  # idempotent: stops the engine (if still running) and the telemetry agent


@dataclasses.dataclass
class LoadResult:
    """What a load run got back."""

    num_sent: int = 0
    num_ok: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    completion_tokens: int = 0
    prompt_tokens: int = 0
    elapsed_s: float = 0.0
    timed_out: bool = False

    def __str__(self) -> str:
        return (f"{self.num_ok}/{self.num_sent} ok, {self.completion_tokens} completion tokens in "
                f"{self.elapsed_s:.1f}s" + (" (time limit)" if self.timed_out else "")
                + (f"; errors: {self.errors[:3]}" if self.errors else ""))


def _check_loopback(url: str) -> None:
    host = urllib.parse.urlparse(url).hostname
    if host not in LOOPBACK_HOSTS:
        raise ValueError(f"the load driver only talks to loopback, not {host!r}")


def drive_load(url: str, model: str, *, num_requests: int, concurrency: int = 4, max_tokens: int | Sequence[int] = 32,
               ignore_eos: bool = True, prompts: Sequence[str] = PROMPTS, time_limit_s: float = 60.0,
               namespace: str | None = None, stop: threading.Event | None = None) -> LoadResult:
    """Send ``num_requests`` completions (at most ``concurrency`` in flight) and wait for them.

    Stops by itself: no new request after ``time_limit_s`` (or once ``stop`` is set), and each
    request's timeout ends at the deadline. ``ignore_eos`` makes every answer ``max_tokens`` long,
    so the KV each request holds is known. A sequence of ``max_tokens`` is cycled over the requests:
    answers of different lengths keep the clients out of step, so the engine is rarely idle between
    batches (equal lengths finish together and leave a gap where every gauge reads an empty engine).
    Returns what came back; never raises for a failed request.
    """
    _check_loopback(url)
    lengths = (max_tokens,) if isinstance(max_tokens, int) else tuple(max_tokens)
    if not lengths or not all(1 <= length <= 48 for length in lengths):
        raise ValueError("keep max_tokens in 1..48: these tests run on a 2-core CPU")
    result = LoadResult()
    started = time.monotonic()
    deadline = started + time_limit_s
    headers = {"x-growpage-namespace": namespace} if namespace else {}
    lock = threading.Lock()

    def one(index: int) -> None:
        body = {"model": model, "prompt": prompts[index % len(prompts)], "max_tokens": lengths[index % len(lengths)],
                "temperature": 0, "ignore_eos": ignore_eos}
        remaining = max(1.0, deadline - time.monotonic())
        try:
            response = client.post(f"{url}/v1/completions", json=body, headers=headers, timeout=remaining)
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
            usage = response.json()["usage"]
            with lock:
                result.num_ok += 1
                result.completion_tokens += usage["completion_tokens"]
                result.prompt_tokens += usage["prompt_tokens"]
        except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as error:
            with lock:
                result.errors.append(f"request {index}: {error}")

    with httpx.Client(limits=httpx.Limits(max_connections=concurrency)) as client, \
            ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="load") as pool:
        in_flight = set()
        for index in range(num_requests):
            while len(in_flight) >= concurrency:
                _, in_flight = wait(in_flight, timeout=max(0.0, deadline - time.monotonic()),
                                    return_when=FIRST_COMPLETED)
                if time.monotonic() >= deadline:
                    break
            if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                result.timed_out = time.monotonic() >= deadline
                break
            in_flight.add(pool.submit(one, index))
            result.num_sent += 1
        wait(in_flight)  # each request's own timeout ends at the deadline
    result.elapsed_s = time.monotonic() - started
    return result


class BackgroundLoad:
    """``drive_load`` on a thread: ``result()`` waits for it; ``stop()`` sends nothing more."""

    def __init__(self, url: str, model: str, **options):
        self._stop = threading.Event()
        self._result: LoadResult | None = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._result = drive_load(url, model, stop=self._stop, **options)
            except BaseException as error:  # noqa: BLE001 (reported by result())
                self._error = error

        self._thread = threading.Thread(target=run, name="load-driver", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout_s: float = 120.0) -> LoadResult:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"the load driver did not finish within {timeout_s}s")
        if self._error is not None:
            raise self._error
        return self._result


@contextlib.contextmanager
def background_load(url: str, model: str, **options) -> Iterator[BackgroundLoad]:
    """Drive load while the block runs; on exit, send nothing more and wait for what is in flight."""
    load = BackgroundLoad(url, model, **options)
    try:
        yield load
    finally:
        load.stop()
        load.result()
