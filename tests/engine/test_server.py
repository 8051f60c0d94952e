"""The OpenAI-compatible server, driven by the official ``openai`` client over real HTTP."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
import uvicorn

from growpage.config import GrowPageConfig
from growpage.engine.engine import EngineConfig
from growpage.engine.serving import build_stack
from support.promstack import free_port, run_tool, wait_until

MODEL = "smollm2-test"


@pytest.fixture(scope="module")
def server(llama_model, tokenizer, prepared_model_dir):
    """A live server on a loopback port (the real uvicorn, the real engine thread)."""
    stack = build_stack(EngineConfig(model_dir=str(prepared_model_dir), num_pages=400, max_num_seqs=32,
                                     served_model_name=MODEL),
                        GrowPageConfig(mode="enforce", base_pages=4, recent_window_tokens=16, sink_tokens=4),
                        model=llama_model, tokenizer=tokenizer)
    port = free_port()
    config = uvicorn.Config(stack.app, host="127.0.0.1", port=port, log_level="warning")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200, 60, what="server health")
    yield url, stack
    uv.should_exit = True
    thread.join(timeout=30)


def client(url):
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_health_and_completions_with_the_openai_client(server):
    url, _ = server
    openai = client(url)
    assert [m.id for m in openai.models.list().data] == [MODEL]
    completion = openai.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                           temperature=0)
    assert completion.choices[0].text and completion.usage.completion_tokens <= 8
    chat = openai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
                                          max_tokens=12, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    assert chat.choices[0].finish_reason in ("stop", "length")


def test_streaming_matches_the_non_streamed_answer(server):
    url, _ = server
    openai = client(url)
    messages = [{"role": "user", "content": "Name two planets."}]
    whole = openai.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    pieces, finish = [], None
    for chunk in openai.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        else:
            assert chunk.usage.completion_tokens == whole.usage.completion_tokens
    assert "".join(pieces) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    text = "".join(c.choices[0].text for c in openai.completions.create(
        model=MODEL, prompt="One, two,", max_tokens=6, temperature=0, stream=True))
    whole = openai.completions.create(model=MODEL, prompt="One, two,", max_tokens=6, temperature=0)
    assert text == whole.choices[0].text


def test_32_concurrent_clients_each_get_their_own_answer(server):
    url, stack = server

    async def run():
        from openai import AsyncOpenAI

        openai = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        prompts = [f"Repeat the number {i} three times." for i in range(32)]
        answers = await asyncio.gather(*(openai.completions.create(
            model=MODEL, prompt=p, max_tokens=6, temperature=0) for p in prompts))
        return prompts, answers

    prompts, answers = asyncio.run(run())
    assert len(answers) == 32 and all(a.choices[0].text is not None for a in answers)
    assert all(a.usage.prompt_tokens > 0 and 0 < a.usage.completion_tokens <= 6 for a in answers)
    # Each answer is the one its own prompt gets alone (greedy): nothing crossed between requests.
    openai = client(url)
    for index in (0, 17, 31):
        alone = openai.completions.create(model=MODEL, prompt=prompts[index], max_tokens=6, temperature=0)
        assert alone.choices[0].text == answers[index].choices[0].text
    wait_until(lambda: not stack.engine.has_unfinished_requests(), 30, what="engine idle")
    assert stack.engine.manager.pool.num_free == stack.engine.manager.pool.num_pages


@pytest.mark.parametrize("body, status, fragment", [
    ("{not json", 400, "not valid JSON"),
    ({"model": "gpt-4", "prompt": "hi"}, 404, "does not exist"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "temperature": -1}, 400, "temperature"),
    ({"model": MODEL, "prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ({"model": MODEL, "prompt": "word " * 9000, "max_tokens": 1}, 400, "context"),
    ({"model": MODEL}, 400, "prompt"),
    ({"model": MODEL, "prompt": "hi", "growpage_mode": "turbo"}, 400, "growpage_mode"),
])
def test_bad_input_gets_a_clear_4xx_and_the_server_keeps_serving(server, body, status, fragment):
    url, _ = server
    content = body if isinstance(body, str) else json.dumps(body)
    response = httpx.post(f"{url}/v1/completions", content=content, headers={"content-type": "application/json"},
                          timeout=60)
    assert response.status_code == status, response.text
    assert fragment in response.json()["error"]["message"]
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200


def test_a_client_that_disconnects_mid_stream_frees_its_pages(server):
    url, stack = server
    manager = stack.engine.manager
    body = {"model": MODEL, "prompt": "Write a long story about a dragon.", "max_tokens": 400,
            "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                break  # got the first token: hang up
    wait_until(lambda: manager.pool.num_free == manager.pool.num_pages, 30, what="pages returned after disconnect")
    assert manager.make_stats().requests_finished_total.get("aborted", 0) >= 1


def test_metrics_route_serves_growpage_series_that_promtool_accepts(server):
    url, _ = server
    client(url).completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0)
    response = httpx.get(f"{url}/metrics/growpage", timeout=10)
    assert response.status_code == 200
    text = response.text
    assert "growpage_kv_page_allocations_total" in text and "growpage_build_info" in text
    assert not any(line.startswith("vllm") for line in text.splitlines())
    result = run_tool("promtool", "check", "metrics", input_text=text, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
