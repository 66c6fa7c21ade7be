"""OpenAI-compatible HTTP server over one EagleSpec (FastAPI; `eaglespec serve` runs it with uvicorn).

Endpoints: POST /v1/chat/completions, POST /v1/completions (server-sent events with "stream":
true), GET /v1/models, GET /health, GET /metrics (Prometheus). With an API key, /v1/* needs
`Authorization: Bearer KEY` (401 otherwise); /health and /metrics stay open.

Every request becomes a Job on one FIFO queue served by one worker thread that owns the engine. With
max_batch > 1 (EngineConfig.batch_size) the BatchWorker runs the batched engine (engine/batch.py): jobs join
between rounds and leave when finished, and each gets its text as its rounds are accepted; with max_batch 1 the
Worker runs one job at a time on the one-sequence engine (the fast path on a GPU). A job whose client went away
(a closed stream, or a non-streaming client that disconnected) is cancelled: its sequence stops after the current
round (its KV freed), or is skipped if it has not started. More than max_queue waiting jobs get 429. Bad requests
get an OpenAI-style error body `{"error": {"message", "type", "param", "code"}}` with a 4xx status.

Sampling fields (temperature, top_p, top_k, seed) pass straight through to EagleSpec.stream;
an omitted or zero temperature means greedy decoding (unlike OpenAI's default of 1).
"""

from __future__ import annotations

import asyncio
import json
import queue
import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from eaglespec.errors import EagleSpecError

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError
except ImportError:  # pragma: no cover - the server extra is not installed
    FastAPI = None  # type: ignore[assignment,misc]

    class BaseModel:  # type: ignore[no-redef]
        """Placeholder so the module imports without the server extra."""

    def Field(*_a, **_k):  # type: ignore[no-redef]
        return None

    ConfigDict = dict  # type: ignore[assignment,misc]
    StrictBool = bool  # type: ignore[misc]
    StrictInt = int  # type: ignore[misc]
    StrictStr = str  # type: ignore[misc]


# -- request schemas ----------------------------------------------------------------------------
class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields are ignored (clients send many)


class ContentPart(_Lenient):
    type: StrictStr
    text: StrictStr | None = None


class Message(_Lenient):
    role: StrictStr
    content: StrictStr | list[ContentPart] | None = None


class StreamOptions(_Lenient):
    include_usage: StrictBool = False


class _Common(_Lenient):
    model: StrictStr | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2, strict=True)
    top_p: float | None = Field(None, gt=0, le=1, strict=True)
    top_k: StrictInt | None = Field(None, ge=0)
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = Field(1, ge=1, le=1)
    presence_penalty: float | None = Field(None, strict=True)
    frequency_penalty: float | None = Field(None, strict=True)
    user: StrictStr | None = None


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)


class CompletionRequest(_Common):
    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    echo: StrictBool = False


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


RATE_WINDOW_S = 10.0  # eaglespec_tokens_per_second counts the requests finished in this many seconds


# -- the worker ---------------------------------------------------------------------------------
@dataclass
class Job:
    """One request's generation. Events go to `events` (an asyncio queue on the server's loop)."""

    prompt_ids: list[int]
    max_tokens: int
    stop: list[str]
    sampling: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def send(self, kind: str, value: Any = None) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Worker:
    """One thread owns the one-sequence engine and runs the queued jobs in order."""

    def __init__(self, es, telemetry: Telemetry, max_queue: int = 256):
        self.es, self.telemetry, self.max_queue = es, telemetry, max_queue
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="eaglespec-worker", daemon=True)
        self.thread.start()

    @property
    def waiting(self) -> int:
        """Jobs not yet started."""
        return self.jobs.qsize()

    def submit(self, job: Job) -> None:
        if self.waiting >= self.max_queue:
            raise APIError(429, f"the server is busy: {self.max_queue} requests are queued; retry later",
                           code="server_busy", kind="server_error")
        self.jobs.put(job)
        self.telemetry.queue_depth.set(self.waiting)

    def stop(self) -> None:
        self.jobs.put(None)

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            self.telemetry.queue_depth.set(self.jobs.qsize())
            if job is None:
                return
            if job.cancelled.is_set():
                self.telemetry.cancelled.inc()
                continue
            try:
                self._generate(job)
            except EagleSpecError as exc:
                job.send("error", APIError(400, str(exc)))
            except Exception as exc:  # keep serving: report the failure to this request only
                job.send("error", _failed(exc))

    def _generate(self, job: Job) -> None:
        self.telemetry.running.set(1)
        try:
            st = self.es.stream(job.prompt_ids, job.max_tokens, stop=job.stop, **job.sampling)
            for piece in st:
                if job.cancelled.is_set():
                    st.close()
                    self.telemetry.cancelled.inc()
                    break
                job.send("text", piece)
            self.telemetry.observe(st.result)
            job.send("done", st.output())
        finally:
            self.telemetry.running.set(0)


class BatchWorker(Worker):
    """One thread owns the batched engine: between steps it admits new jobs and cancels the ones whose client went
    away; each step advances every live sequence by one round and sends each job its newly final text."""

    def __init__(self, es, telemetry: Telemetry, max_queue: int = 256):
        self.engine = es.batch_engine
        self.running: dict[int, tuple[Job, Any]] = {}  # id(request) -> (job, its BatchText)
        super().__init__(es, telemetry, max_queue)

    @property
    def waiting(self) -> int:
        return self.jobs.qsize() + len(self.engine.waiting)

    def _run(self) -> None:
        while True:
            if not self._admit(block=self.engine.idle):
                return
            for job, text in self.running.values():
                if job.cancelled.is_set():
                    self.engine.cancel(text.request)
            try:
                events = self.engine.step()
            except Exception as exc:  # keep serving: the jobs in the engine fail, the queue goes on
                self._fail_all(exc)
                continue
            for req, tokens in events:
                job, text = self.running[id(req)]
                piece = text.push(tokens)
                if piece:
                    job.send("text", piece)
                if text.detok.stopped:  # a stop string: the text is complete
                    self.engine.cancel(req)
            self._finish()

    def _admit(self, block: bool) -> bool:
        """Move queued jobs into the engine (waiting for one when `block`); False once stop() was called."""
        while True:
            try:
                job = self.jobs.get(block=block)
            except queue.Empty:
                break
            block = False
            if job is None:
                return False
            if job.cancelled.is_set():
                self.telemetry.cancelled.inc()
                continue
            try:
                text = self.es.request(job.prompt_ids, job.max_tokens, stop=job.stop, **job.sampling)
                self.engine.submit(text.request)  # refused when its KV can never fit
            except EagleSpecError as exc:
                job.send("error", APIError(400, str(exc)))
                continue
            self.running[id(text.request)] = (job, text)
        self._gauges()
        return True

    def _finish(self) -> None:
        """Jobs whose sequence is done get their output (or nothing, when their client went away)."""
        for key, (job, text) in list(self.running.items()):
            if not text.request.done:
                continue
            del self.running[key]
            if job.cancelled.is_set() and not text.detok.stopped:
                self.telemetry.cancelled.inc()
            else:
                piece = text.flush()  # the held-back tail (an incomplete character, a partial stop string)
                if piece:
                    job.send("text", piece)
                self.telemetry.observe(text.request.result)
                job.send("done", text.output())
        self._gauges()

    def _fail_all(self, exc: Exception) -> None:
        for job, _ in self.running.values():
            job.send("error", _failed(exc))
        self.running.clear()
        self.engine.abort()
        self._gauges()

    def _gauges(self) -> None:
        self.telemetry.queue_depth.set(self.waiting)
        self.telemetry.running.set(len(self.engine.live))


def _failed(exc: Exception) -> APIError:
    return APIError(500, f"generation failed: {type(exc).__name__}: {exc}", kind="server_error")


class Telemetry:
    """Prometheus metrics on a registry of their own (one per app)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        self.requests = Counter("eaglespec_requests", "HTTP API requests", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("eaglespec_prompt_tokens", "prompt tokens processed", registry=r)
        self.generation_tokens = Counter("eaglespec_generation_tokens", "tokens generated", registry=r)
        self.rounds = Counter("eaglespec_verify_rounds", "target verification forwards", registry=r)
        self.drafted = Counter("eaglespec_draft_tokens", "draft tokens verified", registry=r)
        self.accepted = Counter("eaglespec_accepted_tokens", "draft tokens accepted", registry=r)
        self.acceptance = Histogram("eaglespec_acceptance_length", "tokens emitted per verification",
                                    buckets=(1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32), registry=r)
        self.draft_s = Counter("eaglespec_draft_seconds", "time spent drafting", registry=r)
        self.verify_s = Counter("eaglespec_verify_seconds", "time spent in target verification", registry=r)
        self.commit_s = Counter("eaglespec_commit_seconds", "time spent accepting + committing", registry=r)
        self.latency = Histogram("eaglespec_request_seconds", "request latency, queueing included", registry=r,
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.cancelled = Counter("eaglespec_cancelled_requests", "requests whose client went away", registry=r)
        self.queue_depth = Gauge("eaglespec_queue_depth", "requests waiting for the engine", registry=r)
        self.running = Gauge("eaglespec_running", "requests being generated (the live batch)", registry=r)
        self.tokens_per_second = Gauge("eaglespec_tokens_per_second",
                                       "tokens generated per second, over the requests finished lately", registry=r)
        self.tau = Gauge("eaglespec_mean_acceptance_length",
                         "tokens emitted per verification, over every finished request", registry=r)
        self._recent: list[tuple[float, int]] = []  # (finish time, tokens) of requests finished lately
        self._emitted = self._verifications = 0

    def observe(self, result) -> None:
        self.prompt_tokens.inc(len(result.prompt_ids))
        self.generation_tokens.inc(len(result.token_ids))
        now = time.perf_counter()
        self._recent = [(t, n) for t, n in self._recent if now - t < RATE_WINDOW_S] + [(now, len(result.token_ids))]
        self.tokens_per_second.set(sum(n for _, n in self._recent) / RATE_WINDOW_S)
        self._emitted += sum(r.emitted for r in result.rounds)
        self._verifications += len(result.rounds)
        if self._verifications:
            self.tau.set(self._emitted / self._verifications)
        for rnd in result.rounds:
            self.rounds.inc()
            self.drafted.inc(rnd.drafted)
            self.accepted.inc(rnd.accepted)
            self.acceptance.observe(rnd.accepted + 1)
            self.draft_s.inc(rnd.draft_s)
            self.verify_s.inc(rnd.verify_s)
            self.commit_s.inc(rnd.commit_s)

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


# -- the app ------------------------------------------------------------------------------------
def _error_response(err: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def _validation_message(exc: ValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0]
    tags = {"str", "int", "float", "bool", "list", "dict", "none"}  # union branches in pydantic's loc
    parts = [str(p) for p in first.get("loc", ()) if not (str(p) in tags or "[" in str(p) or "-" in str(p))]
    param = parts[0] if parts else None
    msg = first.get("msg", "invalid value")
    return (f"{'.'.join(parts)}: {msg}" if parts else msg), param


def create_app(es, model_name: str = "eaglespec", api_key: str | None = None, max_tokens_limit: int | None = None,
               default_max_tokens: int = 256, max_queue: int = 256):
    """The FastAPI app serving `es` (an EagleSpec). max_tokens_limit: largest max_tokens accepted
    (default: the context length)."""
    if FastAPI is None:
        raise EagleSpecError("the server needs fastapi, uvicorn and prometheus-client (the eaglespec[server] extra)")
    telemetry = Telemetry()
    batched = es.config.batch_size(es.model.device) > 1
    worker = (BatchWorker if batched else Worker)(es, telemetry, max_queue)
    context = es.context_length
    limit = max_tokens_limit or context
    vocab = es.target.vocab_size
    app = FastAPI(title="eaglespec", version="0.1.0")
    app.state.worker, app.state.telemetry = worker, telemetry

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key", kind="authentication_error")

    async def parse(request: Request, schema: type[BaseModel]) -> Any:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the request body is not valid JSON ({exc})") from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        try:
            req = schema.model_validate(body)
        except ValidationError as exc:
            msg, loc = _validation_message(exc)
            raise APIError(400, msg, param=loc) from None
        if req.model is not None and req.model != model_name:
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves {model_name!r}",
                           param="model", code="model_not_found")
        return req

    def prepare(req: _Common, ids: list[int], requested: int | None) -> Job:
        if not ids:
            raise APIError(400, "the prompt is empty", param="prompt")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", param="prompt")
        if requested is not None and requested > limit:
            raise APIError(400, f"max_tokens is {requested}, over this server's limit of {limit}",
                           param="max_tokens", code="max_tokens_exceeded")
        room = context - len(ids)
        if room < 1:
            raise APIError(400, f"the prompt is {len(ids)} tokens long; the model's context length is {context} "
                           "tokens", param="messages" if isinstance(req, ChatRequest) else "prompt",
                           code="context_length_exceeded")
        max_tokens = min(default_max_tokens, room, limit) if requested is None else requested
        if len(ids) + max_tokens > context:
            raise APIError(400, f"this model's maximum context length is {context} tokens; the prompt ({len(ids)}) "
                           f"+ max_tokens ({max_tokens}) exceed it", param="max_tokens",
                           code="context_length_exceeded")
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        sampling = {"temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "seed": req.seed}
        sampling = {k: v for k, v in sampling.items() if v is not None}
        if sampling.get("temperature", 0) == 0:
            sampling = {}  # greedy: the other processors do not change the argmax
        return Job(ids, max_tokens, stop, sampling, asyncio.get_running_loop())

    def encode_chat(req: ChatRequest) -> list[int]:
        messages = []
        for m in req.messages:
            content = m.content
            if isinstance(content, list):
                content = "".join(p.text or "" for p in content if p.type == "text")
            messages.append({"role": m.role, "content": content or ""})
        try:
            return es.encode(messages)
        except EagleSpecError:
            raise
        except Exception as exc:  # a chat template that rejects these messages (e.g. roles)
            raise APIError(400, f"the chat template rejected the messages: {exc}", param="messages") from None

    def encode_completion(req: CompletionRequest) -> list[int]:
        p = req.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            if len(p) != 1:
                raise APIError(400, "only one prompt per request is supported", param="prompt")
            p = p[0]
        if req.echo:
            raise APIError(400, "echo is not supported", param="echo")
        return es.encode(p, raw=True) if isinstance(p, str) else [int(t) for t in p]

    async def run(request: Request, endpoint: str, chat: bool):
        t0 = time.perf_counter()
        try:
            authorize(request)
            req = await parse(request, ChatRequest if chat else CompletionRequest)
            if chat:
                ids = encode_chat(req)
                requested = req.max_completion_tokens or req.max_tokens
            else:
                ids = encode_completion(req)
                requested = req.max_tokens
            job = prepare(req, ids, requested)
            worker.submit(job)
        except APIError as err:
            telemetry.requests.labels(endpoint, str(err.status)).inc()
            return _error_response(err)
        except EagleSpecError as exc:
            telemetry.requests.labels(endpoint, "400").inc()
            return _error_response(APIError(400, str(exc)))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            gen = _sse(job, chat, rid, created, model_name, include_usage, telemetry, endpoint, t0)
            return StreamingResponse(gen, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _complete(request, job, chat, rid, created, model_name, telemetry, endpoint, t0)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await run(request, "chat", chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await run(request, "completions", chat=False)

    @app.get("/v1/models")
    async def models(request: Request):
        try:
            authorize(request)
        except APIError as err:
            return _error_response(err)
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "eaglespec", "max_model_len": context}]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name, "queued": worker.waiting,
                "worker_alive": worker.thread.is_alive()}

    @app.get("/metrics")
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(telemetry.exposition(), media_type=CONTENT_TYPE_LATEST)

    return app


def _usage(out) -> dict:
    n_prompt, n_new = len(out.prompt_token_ids), len(out.token_ids)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_new, "total_tokens": n_prompt + n_new}


async def _complete(request: Request, job: Job, chat: bool, rid: str, created: int, model: str,
                    telemetry: Telemetry, endpoint: str, t0: float):
    """Wait for the job; cancel it if the client disconnects meanwhile."""
    while True:
        try:
            kind, value = await asyncio.wait_for(job.events.get(), timeout=0.25)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                job.cancelled.set()
                telemetry.requests.labels(endpoint, "499").inc()
                return Response(status_code=499)
            continue
        if kind == "text":
            continue
        if kind == "error":
            telemetry.requests.labels(endpoint, str(value.status)).inc()
            return _error_response(value)
        out = value
        break
    telemetry.requests.labels(endpoint, "200").inc()
    telemetry.latency.observe(time.perf_counter() - t0)
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": out.text}, "logprobs": None,
                  "finish_reason": out.finish_reason}
    else:
        choice = {"index": 0, "text": out.text, "logprobs": None, "finish_reason": out.finish_reason}
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": model, "choices": [choice], "usage": _usage(out), "eaglespec": out.stats}


async def _sse(job: Job, chat: bool, rid: str, created: int, model: str, include_usage: bool,
               telemetry: Telemetry, endpoint: str, t0: float) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's chunk format; a closed connection cancels the job."""
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(delta: str | None, finish: str | None = None, role: bool = False) -> str:
        if chat:
            d: dict = {}
            if role:
                d["role"] = "assistant"
            if delta is not None:
                d["content"] = delta
            choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
        return "data: " + json.dumps({"id": rid, "object": obj, "created": created, "model": model,
                                      "choices": [choice]}) + "\n\n"

    status = "200"
    try:
        if chat:
            yield chunk("", role=True)
        while True:
            kind, value = await job.events.get()
            if kind == "text":
                yield chunk(value)
            elif kind == "error":
                status = str(value.status)
                yield "data: " + json.dumps(value.body()) + "\n\n"
                break
            else:
                yield chunk(None if chat else "", finish=value.finish_reason)
                if include_usage:
                    yield "data: " + json.dumps({"id": rid, "object": obj, "created": created, "model": model,
                                                 "choices": [], "usage": _usage(value)}) + "\n\n"
                break
        yield "data: [DONE]\n\n"
        telemetry.latency.observe(time.perf_counter() - t0)
    except BaseException:
        status = "499"  # the client went away (the response task was cancelled)
        raise
    finally:
        job.cancelled.set()  # a no-op when the job is finished; frees the engine otherwise
        telemetry.requests.labels(endpoint, status).inc()
