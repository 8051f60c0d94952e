"""The server survives its users, as a hostile-but-realistic client finds out over real HTTP: one
bad request never hurts the others, abandoned work stops, shutdown is bounded, and nobody gets in
who should not."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import uvicorn

from growpage.config import GrowPageConfig
from growpage.engine.engine import EngineConfig
from growpage.engine.server_settings import ServerSettings
from growpage.engine.serving import GracefulServer, build_stack
from support.promstack import free_port, wait_until

MODEL = "smollm2-hardening"
CONTEXT = 1024


class Records(logging.Handler):
    """Collects log records of the loggers that would print a traceback for a request."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def tracebacks(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.exc_info or r.levelno >= logging.ERROR]


@contextlib.contextmanager
def live(llama_model, tokenizer, model_dir, *, settings=None, growpage=None, max_num_seqs=4):
    growpage = growpage or GrowPageConfig(mode="enforce", base_pages=4, recent_window_tokens=16, sink_tokens=4)
    stack = build_stack(EngineConfig(model_dir=str(model_dir), num_pages=400, max_num_seqs=max_num_seqs,
                                     served_model_name=MODEL, max_model_len=CONTEXT),
                        growpage, model=llama_model, tokenizer=tokenizer, telemetry=False, settings=settings)
    port = free_port()
    config = uvicorn.Config(stack.app, host="127.0.0.1", port=port, log_level="warning",
                            timeout_graceful_shutdown=int(stack.settings.shutdown_timeout_s) + 5)
    server = GracefulServer(config, stack)
    thread = threading.Thread(target=server.run, daemon=True)
    records = Records()
    watched = [logging.getLogger(name) for name in ("uvicorn.error", "uvicorn", "growpage.engine", "fastapi")]
    for logger in watched:
        logger.addHandler(records)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    key = {"authorization": f"Bearer {stack.settings.api_key}"} if stack.settings.api_key else {}
    wait_until(lambda: httpx.get(f"{url}/health", headers=key, timeout=2).status_code == 200, 60,
               what="server health")
    try:
        yield url, stack, server, thread, records
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        for logger in watched:
            logger.removeHandler(records)


@pytest.fixture(scope="module")
def enforced(llama_model, tokenizer, prepared_model_dir):
    """An enforced deployment with the default (safe) settings and 4 admission slots."""
    with live(llama_model, tokenizer, prepared_model_dir) as running:
        yield running


def post(url, body, path="/v1/completions", timeout=120, **kwargs):
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(f"{url}{path}", content=content, timeout=timeout,
                      headers={"content-type": "application/json", **kwargs.pop("headers", {})}, **kwargs)


def wait_idle(stack, timeout_s=30):
    pool = stack.engine.manager.pool
    wait_until(lambda: not stack.engine.has_unfinished_requests() and pool.num_free == pool.num_pages, timeout_s,
               what="every page back")


# ---- 1. one request's sampling never fails the others -----------------------------------------
def test_a_tiny_temperature_answers_200_beside_other_requests(enforced):
    url, stack, *_ = enforced
    bodies = [{"model": MODEL, "prompt": "Name a colour.", "max_tokens": 8, "temperature": 1e-50},
              {"model": MODEL, "prompt": "Name a fruit.", "max_tokens": 8, "temperature": 0}]
    with ThreadPoolExecutor(2) as pool:
        responses = list(pool.map(lambda body: post(url, body), bodies))
    assert [r.status_code for r in responses] == [200, 200], [r.text for r in responses]
    assert all(r.json()["choices"][0]["text"] for r in responses)
    assert stack.async_engine.failed_steps == 0


# ---- 3. abandoned work stops ------------------------------------------------------------------
def test_abandoned_non_streaming_requests_stop_and_free_their_slots(enforced):
    url, stack, _, _, records = enforced
    before = stack.app.state.counters.disconnects
    long_body = {"model": MODEL, "prompt": "Write a very long story.", "max_tokens": 900, "temperature": 0,
                 "ignore_eos": True}

    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(long_body).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    clients = [socket.create_connection((host, int(port))) for _ in range(4)]
    try:
        for client in clients:
            client.sendall(head + body)  # every admission slot, each for 900 tokens
        # Each client hangs up once its request runs (a fixed client timeout raced admission on a
        # loaded machine: a request not yet admitted when its client left is never counted aborted).
        wait_until(lambda: len(stack.engine.scheduler.running) >= 4, 60, what="the four requests running")
    finally:
        for client in clients:
            client.close()
    short = post(url, {"model": MODEL, "prompt": "Say hi.", "max_tokens": 5, "temperature": 0}, timeout=120)
    assert short.status_code == 200  # 3,600 abandoned tokens would take minutes; the timeout is a hang guard
    wait_idle(stack, 10)
    assert stack.app.state.counters.disconnects - before == 4
    assert stack.engine.manager.make_stats().requests_finished_total.get("aborted", 0) >= 4
    assert records.tracebacks() == []


def test_a_queued_streaming_request_whose_client_leaves_is_aborted(enforced):
    url, stack, *_ = enforced
    before = stack.app.state.counters.disconnects
    body = {"model": MODEL, "prompt": "Count to a thousand.", "max_tokens": 900, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200  # hang up before reading a single token
    wait_until(lambda: stack.app.state.counters.disconnects > before, 10, what="the disconnect noticed")
    wait_idle(stack, 10)


# ---- 2. bounded bodies, a responsive event loop -----------------------------------------------
def test_an_oversized_body_gets_413_before_it_is_parsed(enforced):
    url, *_ = enforced
    huge = json.dumps({"model": MODEL, "prompt": "word " * (1_000_000)})
    response = post(url, huge)
    assert response.status_code == 413
    assert "limit" in response.json()["error"]["message"]

    def chunks():  # no content-length: the limit holds for a chunked upload too
        yield huge[:1000].encode()
        for _ in range(6):
            yield b" " * 1_000_000

    chunked = httpx.post(f"{url}/v1/completions", content=chunks(), timeout=60,
                         headers={"content-type": "application/json"})
    assert chunked.status_code == 413


def test_a_prompt_too_long_for_the_context_is_refused_before_tokenizing(enforced, monkeypatch):
    url, stack, *_ = enforced
    tokenized = []
    encode = stack.engine.tokenizer.encode
    monkeypatch.setattr(stack.engine.tokenizer, "encode", lambda *args, **kwargs: tokenized.append(args) or encode(
        *args, **kwargs))
    body = json.dumps({"model": MODEL, "prompt": "word " * 780_000, "max_tokens": 1})  # ~3.9 MB, under the limit
    response = post(url, body)
    assert response.status_code == 400 and "context" in response.json()["error"]["message"]
    assert tokenized == []  # refused by its length alone: no CPU spent tokenizing what cannot fit
    assert httpx.get(f"{url}/health", timeout=30).status_code == 200


def test_health_answers_while_a_prompt_is_being_tokenized(enforced, monkeypatch):
    """Tokenization runs off the event loop: held open, it must not keep /health from answering.

    The tokenizer is held until /health has answered, so a tokenizer on the event loop would
    deadlock /health; the waits below only bound how long such a failure takes to show.
    """
    url, stack, *_ = enforced
    tokenizing, release = threading.Event(), threading.Event()
    encode = stack.engine.tokenizer.encode

    def held_encode(*args, **kwargs):
        tokenizing.set()
        release.wait(timeout=60)
        return encode(*args, **kwargs)

    monkeypatch.setattr(stack.engine.tokenizer, "encode", held_encode)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, url, {"model": MODEL, "prompt": "Say hi.", "max_tokens": 2, "temperature": 0})
        assert tokenizing.wait(timeout=60), "the request never reached the tokenizer"
        try:
            health = httpx.get(f"{url}/health", timeout=30)
            still_tokenizing = not pending.done()
        finally:
            release.set()
        assert health.status_code == 200 and still_tokenizing
        assert pending.result().status_code == 200


# ---- 9, 10. a 400 that names the field, never a 500 or a silent 200 -------------------------------
@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "hi", "seed": 2**70}, "seed"),
    ("/v1/completions", {"prompt": "\ud800"}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "stop": ["\ud800"]}, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages.content"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 1}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "echo": True}, "echo"),
    ("/v1/completions", {"prompt": "hi", "best_of": 2}, "best_of"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                              "top_logprobs": 2}, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ("/v1/completions", {"prompt": "hi", "frequency_penalty": 0.5}, "frequency_penalty"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": CONTEXT}, "max_tokens"),
])
def test_bad_or_unsupported_fields_get_a_400_naming_them(enforced, path, body, param):
    url, *_ = enforced
    response = post(url, json.dumps({"model": MODEL, **body}), path=path)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and param.split(".")[0] in error["message"]
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200


def test_neutral_values_of_unsupported_fields_are_accepted(enforced):
    url, *_ = enforced
    response = post(url, {"model": MODEL, "prompt": "hi", "max_tokens": 2, "logprobs": None, "echo": False,
                          "best_of": 1, "frequency_penalty": 0, "n": 1})
    assert response.status_code == 200, response.text


def test_default_max_tokens_fits_the_context(enforced, tokenizer):
    url, *_ = enforced
    prompt = "word " * (CONTEXT - 8)
    room = CONTEXT - len(tokenizer.encode(prompt))
    response = post(url, {"model": MODEL, "prompt": prompt, "temperature": 0, "ignore_eos": True})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == room


# ---- 8. the operator decides what a client may choose -------------------------------------------
def test_an_enforced_deployment_ignores_and_counts_client_opt_outs(enforced):
    url, stack, *_ = enforced
    counters = stack.app.state.counters
    decisions_before = sum(stack.engine.manager.make_stats().decisions_total.values())
    body = {"model": MODEL, "prompt": "Tell a long story.", "max_tokens": 150, "temperature": 0, "ignore_eos": True,
            "namespace": "vip"}
    response = post(url, body, headers={"x-growpage-mode": "off"})
    assert response.status_code == 200
    assert counters.mode_overrides["ignored"] >= 1 and counters.mode_overrides["honoured"] == 0
    assert counters.client_namespaces["ignored"] >= 1 and counters.client_namespaces["honoured"] == 0
    # It ran enforced: past its 4-page grant GrowPage decided (an "off" request decides nothing).
    assert sum(stack.engine.manager.make_stats().decisions_total.values()) > decisions_before
    post(url, {"model": MODEL, "prompt": "hi", "max_tokens": 2}, headers={"x-growpage-namespace": "team-a"})
    assert counters.header_namespaces >= 1


def test_an_operator_may_allow_mode_lowering(llama_model, tokenizer, prepared_model_dir):
    settings = ServerSettings(allow_mode_override=True, client_namespaces=True)
    with live(llama_model, tokenizer, prepared_model_dir, settings=settings) as (url, stack, *_):
        decisions_before = sum(stack.engine.manager.make_stats().decisions_total.values())
        response = post(url, {"model": MODEL, "prompt": "Tell a long story.", "max_tokens": 150, "temperature": 0,
                              "ignore_eos": True, "user": "alice"}, headers={"x-growpage-mode": "off"})
        assert response.status_code == 200
        assert sum(stack.engine.manager.make_stats().decisions_total.values()) == decisions_before
        assert stack.app.state.counters.mode_overrides["honoured"] == 1
        assert stack.app.state.counters.client_namespaces["honoured"] == 1


# ---- 7. nobody gets in who should not -----------------------------------------------------------
def test_the_api_key_guards_everything_but_the_public_endpoints(llama_model, tokenizer, prepared_model_dir):
    key = "test-key-0123456789"
    with live(llama_model, tokenizer, prepared_model_dir, settings=ServerSettings(api_key=key)) as (url, *_):
        assert httpx.get(f"{url}/v1/models", timeout=5).status_code == 401
        wrong = httpx.get(f"{url}/v1/models", headers={"authorization": "Bearer nope-nope-nope"}, timeout=5)
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        assert post(url, {"model": MODEL, "prompt": "hi", "max_tokens": 1}).status_code == 401
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        from openai import OpenAI

        answer = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0).completions.create(
            model=MODEL, prompt="hi", max_tokens=2, temperature=0)
        assert answer.choices[0].text is not None
        for page in ("/docs", "/redoc", "/openapi.json"):
            assert httpx.get(f"{url}{page}", headers={"authorization": f"Bearer {key}"}, timeout=5).status_code == 404
    closed = ServerSettings(api_key=key, public=(), api_docs=True)
    with live(llama_model, tokenizer, prepared_model_dir, settings=closed) as (url, *_):
        assert httpx.get(f"{url}/health", timeout=5).status_code == 401
        docs = httpx.get(f"{url}/openapi.json", headers={"authorization": f"Bearer {key}"}, timeout=5)
        assert docs.status_code == 200


# ---- 4. bounded shutdown --------------------------------------------------------------------------
def _first_token(lines) -> None:
    for line in lines:
        if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
            return


def test_sigterm_drains_within_the_deadline_and_tells_the_request_why(llama_model, tokenizer, prepared_model_dir):
    settings = ServerSettings.for_mode("enforce", shutdown_timeout_s=1.5)
    with live(llama_model, tokenizer, prepared_model_dir, settings=settings) as (url, stack, server, thread, _):
        body = {"model": MODEL, "prompt": "Write a long story.", "max_tokens": 900, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            _first_token(lines)
            server.handle_exit(signal.SIGTERM, None)
            rest = "\n".join(lines)
        # 900 tokens would outlast the 1.5 s drain: the stream ends with the error, not "length"
        assert "shutting down" in rest and '"finish_reason": "length"' not in rest
        thread.join(timeout=60)  # a hang guard, not a measured duration
        assert not thread.is_alive()
        assert stack.async_engine.shutdown_failed_requests == 1


def test_a_second_signal_exits_at_once(llama_model, tokenizer, prepared_model_dir):
    settings = ServerSettings.for_mode("enforce", shutdown_timeout_s=300)
    with live(llama_model, tokenizer, prepared_model_dir, settings=settings) as (url, _, server, thread, _):
        body = {"model": MODEL, "prompt": "Write a long story.", "max_tokens": 900, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()  # kept: dropping it would close the stream
            _first_token(lines)
            server.handle_exit(signal.SIGTERM, None)
            time.sleep(0.5)
            assert thread.is_alive()  # draining: the request may still finish
            server.handle_exit(signal.SIGTERM, None)
            thread.join(timeout=60)  # a hang guard far below the 300 s drain a second signal cuts short
            assert not thread.is_alive()


def _listen_addresses(port: int) -> set[str]:
    """Local addresses listening on ``port`` (IPv4), from /proc/net/tcp."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.add(".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_the_metrics_listener_binds_where_it_is_told(llama_model, tokenizer, prepared_model_dir):
    port = free_port()
    stack = build_stack(EngineConfig(model_dir=str(prepared_model_dir), num_pages=64, max_model_len=CONTEXT),
                        GrowPageConfig(mode="monitor"), model=llama_model, tokenizer=tokenizer, metrics_port=port)
    try:
        assert _listen_addresses(port) == {"127.0.0.1"}  # not 0.0.0.0: the default follows --host
    finally:
        stack.close()
