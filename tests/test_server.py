"""The OpenAI-compatible server, started for real (uvicorn on a loopback port) on tiny models."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import uvicorn

from eaglespec import EagleSpec
from eaglespec.server import create_app

from conftest import BYTE_VOCAB, byte_tokenizer, cycle_target, reference_greedy, tiny_drafter, tiny_target

KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def serve(app):
    """Run uvicorn in a daemon thread on a free 127.0.0.1 port; returns (base url, server, thread)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started:
        assert time.time() < deadline, "server did not start"
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}", server, thread


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def rand(tok):
    """A random tiny Llama behind a server with an API key; yields (url, EagleSpec, reference model)."""
    model = tiny_target(vocab=BYTE_VOCAB, seed=11)
    es = EagleSpec(model, tok, tiny_drafter(model))
    app = create_app(es, "tiny", api_key=KEY, max_tokens_limit=450)
    url, server, thread = serve(app)
    yield url, es, tiny_target(vocab=BYTE_VOCAB, seed=11), app
    server.should_exit = True
    thread.join(5)


@pytest.fixture(scope="module")
def cycle(tok):
    model = cycle_target(tok)
    es = EagleSpec(model, tok, tiny_drafter(model))
    url, server, thread = serve(create_app(es, "cycle"))
    yield url
    server.should_exit = True
    thread.join(5)


def client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def test_openai_client_chat_and_completions(rand, tok):
    url, _es, ref_model, _ = rand
    c = client(url)
    assert [m.id for m in c.models.list().data] == ["tiny"]
    msgs = [{"role": "user", "content": "Tell me a story"}]
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=24)
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)  # (4.x returns a list)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ref = reference_greedy(ref_model, ids, 24, eos=2)
    assert r.choices[0].message.content == tok.decode(ref, skip_special_tokens=True)  # greedy == the target's own
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == len(ref)
    assert r.choices[0].finish_reason == ("stop" if 2 in ref else "length")
    chunks = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=24, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == r.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == r.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    # completions: raw prompt, streamed and not
    p = c.completions.create(model="tiny", prompt="Once upon a time", max_tokens=16)
    ref = reference_greedy(ref_model, tok.encode("Once upon a time"), 16, eos=2)
    assert p.choices[0].text == tok.decode(ref, skip_special_tokens=True)
    s = "".join(ch.choices[0].text for ch in c.completions.create(model="tiny", prompt="Once upon a time",
                                                                  max_tokens=16, stream=True))
    assert s == p.choices[0].text


def test_multibyte_stream_equals_non_stream(cycle):
    c = client(cycle, key="unused")
    for n in (9, 30):  # 9 ends in the middle of the emoji
        full = c.completions.create(model="cycle", prompt="a", max_tokens=n).choices[0].text
        chunks = [ch.choices[0].text for ch in c.completions.create(model="cycle", prompt="a", max_tokens=n,
                                                                     stream=True)]
        assert "".join(chunks) == full
        assert all("\ufffd" not in piece for piece in chunks[:-2])  # never a split character mid-stream
        assert "中😀" in full
        chat = c.chat.completions.create(model="cycle", messages=[{"role": "user", "content": "é"}], max_tokens=n)
        chat_s = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model="cycle", messages=[{"role": "user", "content": "é"}], max_tokens=n, stream=True))
        assert chat_s == chat.choices[0].message.content


def test_stop_strings(cycle):
    c = client(cycle, key="unused")
    r = c.completions.create(model="cycle", prompt="a", max_tokens=50, stop=["😀"])
    assert r.choices[0].text == "é中" and r.choices[0].finish_reason == "stop"
    chunks = list(c.completions.create(model="cycle", prompt="a", max_tokens=50, stop=["中😀 a", "zz"], stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == "é" and chunks[-1].choices[0].finish_reason == "stop"
    r = c.chat.completions.create(model="cycle", messages=[{"role": "user", "content": "x"}], max_tokens=50, stop=" ")
    assert r.choices[0].message.content == "aé中😀" and r.choices[0].finish_reason == "stop"


def test_auth_and_errors_keep_serving(rand):
    url = rand[0]
    chat = url + "/v1/chat/completions"
    ok = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.post(chat, json=ok, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(url + "/v1/models").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        client(url, key="nope").chat.completions.create(model="tiny", messages=ok["messages"], max_tokens=4)
    bad = [
        (b"{not json", 400, None),
        (json.dumps([1, 2]).encode(), 400, None),
        (json.dumps({**ok, "max_tokens": "5"}).encode(), 400, "max_tokens"),
        (json.dumps({**ok, "temperature": "hot"}).encode(), 400, "temperature"),
        (json.dumps({**ok, "stream": "yes"}).encode(), 400, "stream"),
        (json.dumps({**ok, "messages": "hi"}).encode(), 400, "messages"),
        (json.dumps({**ok, "messages": [{"role": "user", "content": 5}]}).encode(), 400, None),
        (json.dumps({"model": "tiny", "max_tokens": 4}).encode(), 400, "messages"),
        (json.dumps({**ok, "max_tokens": 451}).encode(), 400, "max_tokens"),
        (json.dumps({**ok, "max_tokens": 0}).encode(), 400, "max_tokens"),
        (json.dumps({**ok, "n": 2}).encode(), 400, "n"),
        (json.dumps({**ok, "messages": [{"role": "user", "content": "x" * 600}]}).encode(), 400, "messages"),
        (json.dumps({**ok, "messages": [{"role": "user", "content": "x" * 300}], "max_tokens": 400}).encode(),
         400, "max_tokens"),
        (json.dumps({**ok, "model": "gpt-4"}).encode(), 404, "model"),
    ]
    for body, status, param in bad:
        r = httpx.post(chat, content=body, headers={**AUTH, "Content-Type": "application/json"})
        assert r.status_code == status, (body[:60], r.text)
        err = r.json()["error"]
        assert err["message"] and err["type"]
        if param:
            assert err["param"] == param, (body[:60], err)
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": [3, 4, 999], "max_tokens": 3},
                   headers=AUTH)
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x" * 600}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert httpx.get(url + "/health").json()["status"] == "ok"
    assert httpx.post(chat, json=ok, headers=AUTH).status_code == 200
    assert metric(url, 'eaglespec_requests_total{endpoint="chat",status="400"}') >= 12


def _request(url: str, i: int, kind: str) -> str | None:
    """One client: 'chat' / 'chat-stream' / 'comp-stream' return the text; 'drop' / 'drop-wait' disconnect."""
    msgs = [{"role": "user", "content": f"{i * 7919 % 997} {chr(40 + i * 13 % 80) * (1 + i % 4)} {i}"}]
    if kind == "chat":
        r = client(url).chat.completions.create(model="tiny", messages=msgs, max_tokens=12)
        return r.choices[0].message.content
    if kind == "chat-stream":
        return "".join(ch.choices[0].delta.content or "" for ch in client(url).chat.completions.create(
            model="tiny", messages=msgs, max_tokens=12, stream=True))
    if kind == "comp-stream":
        return "".join(ch.choices[0].text for ch in client(url).completions.create(
            model="tiny", prompt=f"{chr(40 + i * 13 % 80)} {i * 31 % 101}", max_tokens=12, stream=True))
    body = {"model": "tiny", "messages": msgs, "max_tokens": 400}
    if kind == "drop":  # a streaming client that leaves after the first event
        with httpx.Client(timeout=30) as h, h.stream("POST", url + "/v1/chat/completions",
                                                     json={**body, "stream": True}, headers=AUTH) as r:
            next(r.iter_lines())
        return None
    with contextlib.suppress(httpx.TimeoutException):  # 'drop-wait': a non-streaming client that gives up
        httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=0.2)
    return None


def test_concurrent_mixed_clients(rand):
    url = rand[0]
    kinds = ["chat", "chat-stream", "comp-stream", "drop", "chat", "drop-wait"]
    jobs = [(i, kinds[i % len(kinds)]) for i in range(54)]
    alone = {i: _request(url, i, k) for i, k in jobs if not k.startswith("drop")}
    cancelled0 = metric(url, "eaglespec_cancelled_requests_total")
    tokens0 = metric(url, "eaglespec_generation_tokens_total")
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {i: pool.submit(_request, url, i, k) for i, k in jobs}
        together = {i: f.result(timeout=120) for i, f in futures.items()}
    for i, text in alone.items():
        assert together[i] == text, f"request {i} ({jobs[i][1]}) differs when run concurrently"
    assert len(set(alone.values())) > len(alone) // 3  # distinct prompts give distinct outputs
    deadline = time.time() + 30
    while httpx.get(url + "/health").json()["queued"] or metric(url, "eaglespec_running"):
        assert time.time() < deadline
        time.sleep(0.05)
    n_drop = sum(k.startswith("drop") for _, k in jobs)
    assert metric(url, "eaglespec_cancelled_requests_total") - cancelled0 >= n_drop // 2
    # the disconnected clients asked for 400 tokens each; cancelled, they did not all run to the end
    assert metric(url, "eaglespec_generation_tokens_total") - tokens0 < 12 * len(alone) + 400 * n_drop // 2
    assert _request(url, 0, "chat") == alone[0]  # still serving, same answer


def test_disconnect_mid_stream_frees_the_engine(rand):
    url = rand[0]
    tokens0 = metric(url, "eaglespec_generation_tokens_total")
    body = {"model": "tiny", "prompt": "a long one", "max_tokens": 440, "stream": True}
    with httpx.Client(timeout=30) as h, h.stream("POST", url + "/v1/completions", json=body, headers=AUTH) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    t0 = time.time()
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "next", "max_tokens": 2}, headers=AUTH)
    assert r.status_code == 200
    assert time.time() - t0 < 5
    while metric(url, "eaglespec_running"):
        time.sleep(0.02)
    assert metric(url, "eaglespec_generation_tokens_total") - tokens0 < 440


def test_metrics_endpoint(rand):
    url = rand[0]
    client(url).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "m"}], max_tokens=8)
    text = httpx.get(url + "/metrics").text
    for name in ("eaglespec_requests_total", "eaglespec_prompt_tokens_total", "eaglespec_generation_tokens_total",
                 "eaglespec_acceptance_length_bucket", "eaglespec_draft_seconds_total",
                 "eaglespec_verify_seconds_total", "eaglespec_queue_depth"):
        assert name in text
    assert metric(url, 'eaglespec_requests_total{endpoint="chat",status="200"}') >= 1
    assert metric(url, "eaglespec_acceptance_length_count") == metric(url, "eaglespec_verify_rounds_total") > 0
    assert metric(url, "eaglespec_verify_seconds_total") > 0
