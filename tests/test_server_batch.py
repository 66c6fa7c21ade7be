"""The server under load: 64 concurrent streaming clients on the batched engine, clients that leave, a full queue,
and the one-sequence worker (max_batch 1)."""

from __future__ import annotations

import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from eaglespec import EagleSpec
from eaglespec.config import EngineConfig
from eaglespec.engine.batch import BatchRequest
from eaglespec.server import BatchWorker, Worker, create_app
from test_server import metric, serve

from conftest import BYTE_VOCAB, byte_tokenizer, tiny_drafter, tiny_target


@pytest.fixture(scope="module")
def tiny():
    tok = byte_tokenizer()
    model = tiny_target(vocab=BYTE_VOCAB, seed=21)
    return model, tok, tiny_drafter(model, seed=2)


@contextlib.contextmanager
def running(app):
    """The app served on a loopback port for the block; yields its base url."""
    url, server, thread = serve(app)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(5)


def _stream(url: str, ids: list[int], max_tokens: int, leave_after: int | None = None) -> tuple[str, dict | None]:
    """A streaming completion: (the text, the usage); with leave_after, the client goes away after that many
    events."""
    body = {"prompt": ids, "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    text, usage = "", None
    with httpx.Client(timeout=60) as h, h.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        for n, line in enumerate(r.iter_lines()):
            if leave_after is not None and n >= leave_after:
                return text, None
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                text += choice.get("text") or ""
    return text, usage


def test_64_streaming_clients_no_cross_talk(tiny):
    model, tok, drafter = tiny
    es = EagleSpec(model, tok, drafter, config=EngineConfig(max_batch=16, prefill_chunk=8))
    app = create_app(es, "tiny")
    assert isinstance(app.state.worker, BatchWorker)
    with running(app) as url:
        prompts = [[3 + (7 * i + j * 13) % 250 for j in range(2 + i % 11)] for i in range(64)]
        lengths = [6 + i % 9 for i in range(64)]
        solo = [es.generate(p, n) for p, n in zip(prompts, lengths)]  # the one-sequence engine
        leaving = set(range(5, 64, 9))  # these clients disconnect mid-stream
        with ThreadPoolExecutor(max_workers=64) as pool:
            futures = [pool.submit(_stream, url, p, n if i not in leaving else 300, 3 if i in leaving else None)
                       for i, (p, n) in enumerate(zip(prompts, lengths))]
            got = [f.result(timeout=120) for f in futures]
        for i, ((text, usage), ref) in enumerate(zip(got, solo)):
            if i in leaving:
                continue
            assert text == ref.text, f"client {i} got another stream's text"
            assert usage["completion_tokens"] == len(ref.token_ids), f"client {i}: tokens lost or duplicated"
        deadline = time.time() + 30
        while httpx.get(url + "/health").json()["queued"] or metric(url, "eaglespec_running"):
            assert time.time() < deadline, "the slots of the clients that left were not freed"
            time.sleep(0.05)
        assert es.batch_engine.target.batch == 0 and not es.batch_engine.live
        assert metric(url, "eaglespec_cancelled_requests_total") >= 1
        assert metric(url, "eaglespec_mean_acceptance_length") >= 1
        assert httpx.get(url + "/health").json()["worker_alive"]


def test_full_queue_gets_429(tiny):
    model, tok, drafter = tiny
    es = EagleSpec(model, tok, drafter, config=EngineConfig(max_batch=2))
    with running(create_app(es, "tiny", max_queue=0)) as url:
        r = httpx.post(url + "/v1/completions", json={"prompt": [5, 6], "max_tokens": 2})
        assert r.status_code == 429 and r.json()["error"]["code"] == "server_busy"


def test_one_sequence_worker(tiny):
    """max_batch 1: the Worker runs the one-sequence engine, one request at a time."""
    model, tok, drafter = tiny
    es = EagleSpec(model, tok, drafter, config=EngineConfig(max_batch=1))
    app = create_app(es, "tiny")
    assert type(app.state.worker) is Worker
    with running(app) as url:
        ref = es.generate([9, 8, 7], 8)
        with ThreadPoolExecutor(max_workers=3) as pool:
            texts = list(pool.map(lambda _: _stream(url, [9, 8, 7], 8)[0], range(3)))
        assert texts == [ref.text] * 3


def test_request_beyond_the_kv_budget_gets_400(tiny):
    """A request whose KV can never fit the batched engine's budget is refused with a 400 naming the sizes; the
    server goes on serving the others."""
    model, tok, drafter = tiny
    es = EagleSpec(model, tok, drafter, config=EngineConfig(max_batch=2, adaptive=False))
    engine = es.batch_engine
    engine.kv_budget = engine.kv_bytes([engine.submit(BatchRequest([5, 6], 16))])
    engine.abort()
    with running(create_app(es, "tiny")) as url:
        r = httpx.post(url + "/v1/completions", json={"prompt": [5, 6], "max_tokens": 200})
        assert r.status_code == 400 and "MiB of KV" in r.json()["error"]["message"]
        ok = httpx.post(url + "/v1/completions", json={"prompt": [5, 6], "max_tokens": 8})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 8
