"""The HTTP API of ``ragpipe serve``: search and answer over the published index.

``create_app(config)`` loads the embedder and opens the current index version
once; every request reuses them. Endpoints:

* ``GET /healthz``: index version, points, embedder, uptime, cache counters.
* ``POST /search``: ranked chunks with every stage's scores and the retriever's
  trace (the fields of ``ragpipe search --format json``); ``format`` xml or text
  gives the CLI's other forms.
* ``POST /ask``: a cited answer (or "not found"); ``stream`` none (one JSON
  object), sse (server-sent events) or ndjson (one JSON object per line). The
  events: ``retrieval`` (sources and version), ``token`` (text as it is
  generated), ``answer`` (the whole answer object), or ``error``.
* ``GET /metrics``: Prometheus text format.
* ``GET /docs``: the OpenAPI documentation.

Limits (``serve.*``): body size (413), query length and k (422), filters that
match no syntax (422); a missing index or model is 503. A bearer token, when
configured, is required everywhere but /healthz and the docs. CORS only for the
configured origins.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.middleware.cors import CORSMiddleware

from ragpipe.config import RagpipeConfig, RetrievalMode
from ragpipe.errors import ConfigError, RagpipeError
from ragpipe.models.embedders import embedder_name
from ragpipe.models.llm import GenerationCancelled
from ragpipe.query.generate import answer
from ragpipe.query.render import search_json, to_text, to_xml
from ragpipe.serve.cache import SemanticCache
from ragpipe.serve.index import LiveIndex
from ragpipe.serve.metrics import CONTENT_TYPE_LATEST, ServeMetrics

if TYPE_CHECKING:
    from ragpipe.models.embedders import Embedder
    from ragpipe.models.llm import LLM
    from ragpipe.query.results import RetrievalResult

logger = logging.getLogger(__name__)

ENDPOINTS = ("/healthz", "/search", "/ask", "/metrics")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# -- requests ------------------------------------------------------------------------


class Filters(BaseModel):
    """Payload filters, combined with AND (the CLI's --filter)."""

    model_config = ConfigDict(extra="forbid")

    file: str | None = Field(default=None, description="A stored file path ending in this.")
    heading: str | None = Field(default=None, description="A heading on the chunk's path.")
    sha: str | None = Field(default=None, description="The source file's SHA-256.")


class _Query(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: RetrievalMode | None = Field(default=None, description="dense, sparse or hybrid.")
    k: int | None = Field(default=None, ge=1, description="Chunks returned (retrieve.top_k).")
    rerank: bool | None = Field(default=None, description="Rerank with the cross-encoder.")
    filters: Filters = Field(default_factory=Filters)

    def overrides(self) -> dict[str, Any]:
        values = {
            "mode": self.mode,
            "top_k": self.k,
            "rerank": self.rerank,
            "filter_file": self.filters.file,
            "filter_heading": self.filters.heading,
            "filter_source_sha": self.filters.sha,
        }
        return {key: value for key, value in values.items() if value is not None}


class SearchRequest(_Query):
    query: str = Field(description="The question or keywords.")
    format: Literal["json", "xml", "text"] = Field(
        default="json",
        description="json: hits with every stage's scores and the trace; xml: a "
        "<retrieved_context> block for prompts; text: readable lines.",
    )


class AskRequest(_Query):
    question: str = Field(description="The question to answer from the index.")
    stream: Literal["none", "sse", "ndjson"] = Field(
        default="none",
        description="none: one JSON object when done; sse: server-sent events; ndjson: one "
        "JSON object per line. Events: retrieval, token, answer (or error).",
    )


# -- ASGI guards ---------------------------------------------------------------------


class _BodyLimit:
    """413 for a request body over the limit, declared or streamed (chunked); 408 for one
    not complete within ``timeout_s`` (a body sent a byte at a time held a connection open
    before the token was even checked)."""

    def __init__(self, app: ASGIApp, limit: int, timeout_s: float = 10.0) -> None:
        self.app, self.limit, self.timeout_s = app, limit, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._reject(scope, receive, send)
            return
        messages: list[Message] = []
        size = 0
        deadline = time.monotonic() + self.timeout_s
        while True:  # bodies are small (the limit is KiB): read, count, then replay
            try:
                message = await asyncio.wait_for(receive(), deadline - time.monotonic())
            except TimeoutError:
                detail = (
                    f"request body not complete within serve.body_timeout_s ({self.timeout_s:g} s)"
                )
                await JSONResponse({"detail": detail}, status_code=408)(scope, receive, send)
                return
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                await self._reject(scope, receive, send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = f"request body over serve.max_body_bytes ({self.limit} bytes)"
        await JSONResponse({"detail": detail}, status_code=413)(scope, receive, send)


class _Measured:
    """Counts requests by endpoint and status; times each to its last byte."""

    def __init__(self, app: ASGIApp, metrics: ServeMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = scope["path"] if scope["path"] in ENDPOINTS else "other"
        started = time.perf_counter()
        status = 500

        async def measured(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
                self.metrics.requests.labels(endpoint, str(status)).inc()

        try:
            await self.app(scope, receive, measured)
        except Exception:
            self.metrics.requests.labels(endpoint, "500").inc()
            raise


# -- the app -------------------------------------------------------------------------


# What a 429 asks a client to wait: about one answer's generation on CPU.
RETRY_AFTER_S = 30


class Service:
    """The loaded index, models, cache and metrics one server answers from."""

    def __init__(
        self, config: RagpipeConfig, embedder: Embedder | None = None, llm: LLM | None = None
    ) -> None:
        self.config = config
        self.started = time.monotonic()
        self.metrics = ServeMetrics()
        serve = config.serve
        self.cache = SemanticCache(serve.cache_threshold, serve.cache_size, serve.cache_ttl_seconds)
        self.index = LiveIndex(config, embedder, llm, on_switch=self._switched)
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragpipe-search")
        self.cache.clear(self.index.version)
        self.metrics.index_points.set(self.index.describe()["points"])
        self._answers = 0  # generating or waiting for the model
        self._answers_lock = threading.Lock()

    def admit_answer(self) -> bool:
        """Count one more answer to generate, unless the queue is full."""
        with self._answers_lock:
            if self._answers > self.config.serve.max_queued_answers:
                return False
            self._answers += 1
            return True

    def answer_done(self) -> None:
        with self._answers_lock:
            self._answers -= 1

    def _switched(self, version: str) -> None:
        self.cache.clear(version)
        self.metrics.switches.inc()
        self.metrics.index_points.set(self.index.describe()["points"])

    def check(self, text: str, k: int | None) -> str:
        """The stripped query, or 422 with the limit it breaks."""
        serve = self.config.serve
        text = text.strip()
        if not text:
            raise HTTPException(422, "the query is empty")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate (\ud800) JSON lets through
            raise HTTPException(
                422, f"the query is not valid Unicode text: {exc.reason} at {exc.start}"
            ) from exc
        if len(text) > serve.max_query_chars:
            raise HTTPException(
                422, f"the query has {len(text)} characters; serve.max_query_chars is "
                f"{serve.max_query_chars}",
            )  # fmt: skip
        if k is not None and k > serve.max_k:
            raise HTTPException(422, f"k={k} is over serve.max_k ({serve.max_k})")
        return text

    def caches(self, endpoint: str) -> bool:
        """Whether answers of ``endpoint`` go through the semantic cache."""
        serve = self.config.serve
        return serve.cache and (endpoint == "ask" or serve.cache_search)

    def lookup(self, endpoint: str, vector: Any, scope: str, version: str, text: str) -> Any:
        if not self.caches(endpoint):
            return None
        hit = self.cache.get(vector, scope, version, text)
        self.metrics.cache.labels(endpoint, "hit" if hit else "miss").inc()
        self.metrics.cache_entries.set(len(self.cache))
        return hit

    def store(
        self, endpoint: str, vector: Any, scope: str, version: str, text: str, value: Any
    ) -> None:
        if self.caches(endpoint):
            self.cache.put(vector, scope, version, text, value)
            self.metrics.cache_entries.set(len(self.cache))

    async def retrieve(
        self, endpoint: str, text: str, request: _Query, extra: dict[str, Any]
    ) -> tuple[str, Any, str, Any, RetrievalResult | None]:
        """Look the query up in the cache, else retrieve: (version, vector, scope, hit, result).

        On the one search thread: searches of one open store run one at a time anyway,
        and the embedder's thread pool stays with one caller thread. Measured with
        bench/serve.py: 40-46 requests/s at 4 and 16 clients on the web server's rotating
        pool threads, 57-65 on one thread.
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.worker, self._retrieve, endpoint, text, request, extra
        )

    def _retrieve(
        self, endpoint: str, text: str, request: _Query, extra: dict[str, Any]
    ) -> tuple[str, Any, str, Any, RetrievalResult | None]:
        overrides = request.overrides()
        scope = json.dumps({"endpoint": endpoint, **overrides, **extra}, sort_keys=True)
        try:
            with self.index.reader() as (retriever, version):
                vector = retriever.query_vector(text)
                hit = self.lookup(endpoint, vector, scope, version, text)
                result = None if hit else retriever.search(text, **overrides)
        except ValidationError as exc:  # an override RetrieveConfig refuses
            raise HTTPException(422, _first_error(exc)) from exc
        return version, vector, scope, hit, result


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"


def _cache_info(hit: Any) -> dict[str, Any]:
    if hit is None:
        return {"hit": False}
    return {
        "hit": True,
        "similarity": round(hit.similarity, 6),
        "cached_query": hit.query,
        "age_s": round(hit.age_s, 3),
    }


def create_app(
    config: RagpipeConfig, embedder: Embedder | None = None, llm: LLM | None = None
) -> FastAPI:
    """The API over ``config``'s index: models loaded and the index opened before it returns
    (so a missing index fails here, not on the first request)."""
    service = Service(config, embedder, llm)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.index.start()
        try:
            yield
        finally:
            service.worker.shutdown(wait=True)
            service.index.close()

    app = FastAPI(
        title="ragpipe",
        summary="Search and cited answers over the published ragpipe index.",
        lifespan=lifespan,
    )
    app.state.service = service
    bearer = HTTPBearer(auto_error=False, description="serve.api_key")
    token = config.serve.api_key

    async def authorised(
        credentials: HTTPAuthorizationCredentials | None = Depends(bearer),  # noqa: B008
    ) -> None:
        if token is None:
            return
        given = credentials.credentials if credentials is not None else ""
        if not hmac.compare_digest(given.encode(), token.get_secret_value().encode()):
            raise HTTPException(
                401,
                "missing or wrong bearer token: send Authorization: Bearer <serve.api_key>",
                headers={"WWW-Authenticate": "Bearer"},
            )

    @app.exception_handler(ConfigError)
    async def _bad_request(request: Request, exc: ConfigError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI echoes each bad input back; 1e400 (inf), NaN or a lone surrogate cannot be
        # written as JSON, which turned a 422 into a 500 with a traceback. The declared
        # HTTPValidationError shape needs only loc, msg and type.
        errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")),
                   "type": str(e.get("type", ""))} for e in exc.errors()]  # fmt: skip
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(RagpipeError)
    async def _unavailable(request: Request, exc: RagpipeError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        """Liveness and what is served: index version, points, embedder, uptime, cache."""
        index = service.index.describe()
        service.metrics.index_points.set(index["points"])
        return {
            "status": "ok",
            "index": index,
            "embedder": embedder_name(config.embed),
            "uptime_s": round(time.monotonic() - service.started, 3),
            "cache": {
                "enabled": config.serve.cache,
                "threshold": config.serve.cache_threshold,
                "entries": len(service.cache),
                "hits": service.cache.hits,
                "misses": service.cache.misses,
            },
        }

    @app.post("/search", dependencies=[Depends(authorised)])
    async def search(request: SearchRequest) -> Response:
        """Ranked chunks for the query, with every stage's score and the trace."""
        text = service.check(request.query, request.k)
        version, vector, scope, hit, result = await service.retrieve(
            "search", text, request, {"format": request.format}
        )
        if hit is not None:
            body, media = hit.value
        else:
            assert result is not None
            body, media = _render(result, request.format, version)
            service.store("search", vector, scope, version, text, (body, media))
        if request.format == "json":
            return JSONResponse({**body, "cache": _cache_info(hit)})
        headers = {"X-Ragpipe-Cache": "hit" if hit else "miss", "X-Ragpipe-Index": version}
        return Response(body, media_type=media, headers=headers)

    @app.post("/ask", dependencies=[Depends(authorised)])
    async def ask(request: AskRequest) -> Response:
        """A cited answer from the index (streamed when asked), or "not found".

        One answer is generated at a time; ``serve.max_queued_answers`` more may wait, and
        beyond that the request gets 429 with Retry-After. A streamed answer whose client
        goes away stops being generated.
        """
        text = service.check(request.question, request.k)
        version, vector, scope, hit, result = await service.retrieve("ask", text, request, {})
        cancelled = threading.Event()
        if hit is not None:
            cached = dict(hit.value)
            events = _replay(cached, text, version, _cache_info(hit))
        else:
            assert result is not None
            if not service.admit_answer():
                return JSONResponse(
                    {"detail": "too many answers waiting for the model; retry later"},
                    status_code=429,
                    headers={"Retry-After": str(RETRY_AFTER_S)},
                )
            events = _generate(service, text, result, version, vector, scope, cancelled)
        if request.stream == "none":
            final = await run_in_threadpool(_last, events)  # the model takes seconds
            return JSONResponse(final[1], status_code=503 if final[0] == "error" else 200)
        encode = _sse if request.stream == "sse" else _ndjson
        media = "text/event-stream" if request.stream == "sse" else "application/x-ndjson"

        async def body() -> AsyncIterator[str]:
            try:
                while True:
                    event = await run_in_threadpool(next, events, None)
                    if event is None:
                        return
                    yield encode(*event)
            finally:  # the client went away (the response task is cancelled) or we are done
                cancelled.set()

        return StreamingResponse(
            body(),
            media_type=media,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.get("/metrics", dependencies=[Depends(authorised)])
    def metrics() -> Response:
        """Requests, latency histogram, cache hits and the index, in Prometheus text format."""
        service.metrics.cache_entries.set(len(service.cache))
        return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # Outermost last: every request is measured, CORS answers preflights, bodies are capped.
    app.add_middleware(
        _BodyLimit, limit=config.serve.max_body_bytes, timeout_s=config.serve.body_timeout_s
    )
    if config.serve.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=config.serve.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(_Measured, metrics=service.metrics)
    return app


def _render(result: RetrievalResult, form: str, version: str) -> tuple[Any, str]:
    """The response body of a search (a dict for JSON, else text) and its media type."""
    if form == "xml":
        return to_xml(result), "application/xml"
    if form == "text":
        return to_text(result), "text/plain; charset=utf-8"
    return {**search_json(result), "index_version": version}, "application/json"


# -- answers -------------------------------------------------------------------------

Event = tuple[str, dict[str, Any]]


def _sources(result: RetrievalResult) -> list[dict[str, Any]]:
    return [
        {"rank": i, "point_id": h.point_id, "score": h.score, "file_path": h.file_path,
         "page": h.page, "heading": h.heading}
        for i, h in enumerate(result.hits, start=1)
    ]  # fmt: skip


def _generate(
    service: Service,
    question: str,
    result: RetrievalResult,
    version: str,
    vector: Any,
    scope: str,
    cancelled: threading.Event,
) -> Iterator[Event]:
    """retrieval, the tokens as the model writes them, then the answer (cached). Setting
    ``cancelled`` stops the model at its next token."""
    yield (
        "retrieval",
        {
            "index_version": version,
            "cache": {"hit": False},
            "hits": _sources(result),
            "trace": result.trace,
        },
    )
    tokens: queue.Queue[tuple[str, Any]] = queue.Queue()

    def on_token(text: str) -> None:
        if cancelled.is_set():
            raise GenerationCancelled("the client went away")
        tokens.put(("token", text))

    def work() -> None:
        try:
            if cancelled.is_set():  # left while waiting for the model
                raise GenerationCancelled("the client went away")
            reply = answer(
                question,
                result.hits,
                service.index.llm,
                service.config.generate.context_tokens,
                on_token,
            )
            tokens.put(("done", reply))
        except GenerationCancelled:
            logger.info("answer not finished: the client went away")
            service.metrics.answers_cancelled.inc()
            tokens.put(("error", "the client went away"))
        except Exception as exc:  # reported to the client as an error event
            logger.warning("generation failed: %s", exc)
            tokens.put(("error", exc))
        finally:
            service.answer_done()

    threading.Thread(target=work, name="ragpipe-generate", daemon=True).start()
    while True:
        kind, value = tokens.get()
        if kind == "token":
            yield "token", {"text": value}
        elif kind == "error":
            yield "error", {"detail": f"generation failed: {value}"}
            return
        else:
            data = {**value.as_dict(), "retrieval": result.trace, "index_version": version}
            service.store("ask", vector, scope, version, question, data)
            yield "answer", {**data, "cache": {"hit": False}}
            return


def _replay(
    cached: dict[str, Any], question: str, version: str, info: dict[str, Any]
) -> Iterator[Event]:
    """A cached answer as the same events: retrieval, its text as one token, the answer."""
    yield (
        "retrieval",
        {
            "index_version": version,
            "cache": info,
            "hits": cached["sources"],
            "trace": cached.get("retrieval", {}),
        },
    )
    yield "token", {"text": cached["answer"]}
    yield "answer", {**cached, "question": question, "cache": info}


def _last(events: Iterator[Event]) -> Event:
    last: Event = ("error", {"detail": "no answer"})
    for event in events:
        last = event
    return last


def _sse(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


def _ndjson(name: str, data: dict[str, Any]) -> str:
    return json.dumps({"event": name, **data}) + "\n"
