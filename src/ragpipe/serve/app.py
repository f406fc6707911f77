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
* ``/mcp``: the MCP server (streamable HTTP) for agents, tools ``search`` and
  ``ask`` (``ragpipe.serve.mcp_tools``); not in the OpenAPI document.
* ``GET /docs``: the OpenAPI documentation.

Limits (``serve.*``): body size (413), body read time (408), query length and k
(422); a missing index or model is 503. A bearer token, when configured, is
required everywhere but /healthz and the docs. CORS only for the configured
origins.

The OpenAPI document tells the truth (tests/test_serve.py runs schemathesis
against it): the request models carry this server's limits, the bearer scheme
is declared only when a key is set, every 422 has pydantic's shape and every
other error ``{"detail": "..."}``, and each response names its real media type.
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from anyio import to_thread
from fastapi import Depends, FastAPI, HTTPException, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    create_model,
)
from pydantic_core import PydanticCustomError
from starlette.concurrency import run_in_threadpool
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route

from ragpipe.config import LLM_RERANKER, RagpipeConfig, RetrievalMode, ServeConfig
from ragpipe.errors import ConfigError, RagpipeError
from ragpipe.models.embedders import embedder_name, known_dim, runtime_of
from ragpipe.models.llm import GenerationCancelled
from ragpipe.query.generate import (
    QuestionTooLong,
    Source,
    configured_answer,
    source_budget,
    source_json,
)
from ragpipe.query.render import search_json, to_text, to_xml
from ragpipe.query.retrieve import embeds_whole
from ragpipe.serve.cache import SemanticCache
from ragpipe.serve.fields import JSON_INTEGER
from ragpipe.serve.index import LiveIndex
from ragpipe.serve.metrics import CONTENT_TYPE_LATEST, ServeMetrics
from ragpipe.serve.reports import index_page, inside, trend_page

if TYPE_CHECKING:
    from ragpipe.models.embedders import Embedder
    from ragpipe.models.llm import LLM
    from ragpipe.query.results import RetrievalResult

logger = logging.getLogger(__name__)

ENDPOINTS = ("/healthz", "/search", "/ask", "/metrics")
# The headers an MCP client may send besides Authorization and Content-Type.
MCP_HEADERS = ("Mcp-Protocol-Version", "Mcp-Session-Id", "Last-Event-ID")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])
T = TypeVar("T")


# -- requests ------------------------------------------------------------------------


# Python's whitespace (str.isspace, what str.strip removes), spelt out so that the JSON
# Schema, pydantic's regex engine and client-side generators agree: a query must hold one
# character outside it.
NOT_ONLY_SPACE = r"[^\t-\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"


def _stripped(value: str) -> str:
    value = value.strip()
    if not value:
        raise ValueError("a filter must hold more than spaces (it would filter nothing)")
    return value


# As the schema says (a client's generator makes what it allows), and stripped.
_Named = Annotated[
    str,
    Field(json_schema_extra={"minLength": 1, "pattern": NOT_ONLY_SPACE}),
    AfterValidator(_stripped),
]


class Filters(BaseModel):
    """Payload filters, combined with AND (the CLI's --filter)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # Stripped, and never empty (as the CLI's --filter): "" filtered nothing at all.
    file: _Named | None = Field(
        default=None,
        description="Only chunks of a file whose stored path ends with these whole path parts "
        "(a file name, or dir/name): bread.md and kitchen/bread.md match kitchen/bread.md, "
        "read.md and .md match nothing.",
    )
    heading: _Named | None = Field(default=None, description="A heading on the chunk's path.")
    sha: _Named | None = Field(default=None, description="The source file's SHA-256.")


class _Query(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: RetrievalMode | None = Field(default=None, description="dense, sparse or hybrid.")
    k: Annotated[int, Field(ge=1), JSON_INTEGER] | None = Field(
        default=None, description="Chunks returned (retrieve.top_k)."
    )
    rerank: bool | None = Field(
        default=None,
        strict=True,
        description="Rerank with retrieve.reranker (a cross-encoder, or llm).",
    )
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


def request_models(serve: ServeConfig) -> tuple[type[SearchRequest], type[AskRequest]]:
    """The request bodies with this server's limits in them: the OpenAPI document states
    every limit the server enforces (the schemathesis test holds the two together), and a
    request over one gets 422 saying which setting it broke."""
    max_chars, max_k = serve.max_query_chars, serve.max_k

    def text_ok(text: str) -> str:
        if not text.strip():
            raise PydanticCustomError("empty_query", "the query is empty")
        if len(text) > max_chars:
            raise PydanticCustomError(
                "query_too_long",
                "the query has {length} characters; serve.max_query_chars is {limit}",
                {"length": len(text), "limit": max_chars},
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate (\ud800) JSON lets through
            raise PydanticCustomError(
                "not_unicode", "the query is not valid Unicode text: {reason} at {at}",
                {"reason": exc.reason, "at": exc.start},
            ) from exc  # fmt: skip
        return text

    def k_ok(k: int) -> int:
        if k > max_k:
            raise PydanticCustomError(
                "k_too_large", "k={k} is over serve.max_k ({limit})", {"k": k, "limit": max_k}
            )
        return k

    text_limits = {"minLength": 1, "maxLength": max_chars, "pattern": NOT_ONLY_SPACE}
    text_type = Annotated[str, Field(json_schema_extra=text_limits), AfterValidator(text_ok)]
    k: Any = (
        Annotated[int, Field(ge=1, json_schema_extra={"maximum": max_k}), JSON_INTEGER,
                  AfterValidator(k_ok)] | None,
        Field(default=None, description=f"Chunks returned (retrieve.top_k); at most "
              f"serve.max_k ({max_k})."),
    )  # fmt: skip
    limits = f"At most serve.max_query_chars ({max_chars}) characters, not only whitespace."
    search = create_model(
        "SearchRequest",
        __base__=SearchRequest,
        query=(text_type, Field(description=f"The question or keywords. {limits}")),
        k=k,
    )
    ask = create_model(
        "AskRequest",
        __base__=AskRequest,
        question=(text_type, Field(description=f"The question to answer from the index. {limits}")),
        k=k,
    )
    return search, ask


class ErrorBody(BaseModel):
    """Every error but 422: what went wrong and, where there is one, the fix."""

    detail: str


def _unprocessable(field: str, message: str) -> RequestValidationError:
    """A 422 in the same shape as pydantic's (the declared HTTPValidationError)."""
    return RequestValidationError([{"loc": ("body", field), "msg": message, "type": "value_error"}])


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
                async with asyncio.timeout(deadline - time.monotonic()):
                    message = await receive()
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


# The status counted for a response whose client left before its end (nginx's "client
# closed request"): a stream it stopped reading, an /ask or /mcp call it gave up waiting for.
# Such requests were counted nowhere, in no status and no latency. (Elsewhere a client that
# leaves a whole response is not seen: the server's send drops it silently.)
CLIENT_LEFT = "499"


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
        counted = False

        async def measured(message: Message) -> None:
            nonlocal status, counted
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                counted = True
                self.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
                self.metrics.requests.labels(endpoint, str(status)).inc()

        try:
            await self.app(scope, receive, measured)
        except Exception:
            if not counted:
                counted = True
                self.metrics.requests.labels(endpoint, "500").inc()
            raise
        finally:
            if not counted:  # the client left before the last byte (a streamed answer)
                self.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
                self.metrics.requests.labels(endpoint, CLIENT_LEFT).inc()


# -- the app -------------------------------------------------------------------------


# What a 429 asks a client to wait: about one answer's generation on CPU.
RETRY_AFTER_S = 30
# Threads that embed queries side by side (an embedding runs outside the GIL; the store is
# searched by one at a time): measured with bench/serve.py on 2 cores.
SEARCH_THREADS = 2
# Threads for searches that ask the LLM (an LLM rerank, HyDE, the LLM filter): minutes
# each on a CPU, and one model call at a time; on the search threads two of them left no
# thread for a plain search.
LLM_SEARCH_THREADS = 2
WARM_UP_QUERY = "warm-up query"


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
        try:
            self.worker = ThreadPoolExecutor(SEARCH_THREADS, thread_name_prefix="ragpipe-search")
            self.llm_worker = ThreadPoolExecutor(
                LLM_SEARCH_THREADS, thread_name_prefix="ragpipe-llm-search"
            )
            self.cache.clear(self.index.version)
            self.metrics.index_points.set(self.index.describe()["points"])
            self.warm_up_ms, self.warm_up_error = self._warm_up()
        except BaseException:  # Ctrl-C or SIGTERM while loading: no server will close it
            self.index.close()  # and its private copy of the index with it
            raise
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

    def _switched(self, version: str, points: int) -> None:
        """Under the index's lock: quick, and never back into the index."""
        self.cache.clear(version)
        self.metrics.switches.inc()
        self.metrics.index_points.set(points)

    def check(self, text: str, k: int | None, field: str = "query") -> str:
        """The stripped query, or 422 with the limit it breaks. The request models state
        (and enforce) the same limits; this is the server's own guard behind them."""
        serve = self.config.serve
        text = text.strip()
        if not text:
            raise _unprocessable(field, "the query is empty")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate (\ud800) JSON lets through
            raise _unprocessable(
                field, f"the query is not valid Unicode text: {exc.reason} at {exc.start}"
            ) from exc
        if len(text) > serve.max_query_chars:
            raise _unprocessable(
                field, f"the query has {len(text)} characters; serve.max_query_chars is "
                f"{serve.max_query_chars}",
            )  # fmt: skip
        if k is not None and k > serve.max_k:
            raise _unprocessable("k", f"k={k} is over serve.max_k ({serve.max_k})")
        return text

    def caches(self, endpoint: str) -> bool:
        """Whether answers of ``endpoint`` go through the semantic cache."""
        serve = self.config.serve
        return serve.cache and (endpoint == "ask" or serve.cache_search)

    def lookup(
        self, endpoint: str, vector: Any, scope: str, version: str, text: str, whole: bool
    ) -> Any:
        """A cached answer for ``text``; ``whole``: the embedder read all of it, else only
        the same text's answer is taken (a question past the window, after a long pasted
        log, embeds as every other question with that log does)."""
        if not self.caches(endpoint):
            return None
        hit = self.cache.get(vector, scope, version, text, exact=not whole)
        self.metrics.cache.labels(endpoint, "hit" if hit else "miss").inc()
        self.metrics.cache_entries.set(len(self.cache))
        return hit

    def store(
        self, endpoint: str, vector: Any, scope: str, version: str, text: str, value: Any
    ) -> None:
        if self.caches(endpoint):
            whole = embeds_whole(self.index.embedder, text)
            self.cache.put(vector, scope, version, text, value, whole)
            self.metrics.cache_entries.set(len(self.cache))

    def _warm_up(self) -> tuple[float | None, str | None]:
        """One search before the first request, so that no user pays the query embedder's
        first call (graph optimisation, thread pools) or the store's first query:
        (milliseconds, None), or (None, why) when it failed (logged; the server starts, and
        the same error reaches the first request)."""
        started = time.perf_counter()
        # The LLM's parts of a search (a rerank judging every candidate, HyDE's passages, the
        # filter's scores) take minutes on a CPU: the warm-up is the embedder's and store's.
        retrieve = self.config.retrieve
        skip: dict[str, Any] = {"rerank": False} if retrieve.reranker == LLM_RERANKER else {}
        if retrieve.hyde.value != "off":
            skip["hyde"] = "off"
        if retrieve.llm_filter:
            skip["llm_filter"] = False
        try:
            with self.index.reader() as (retriever, _):
                retriever.search(WARM_UP_QUERY, **skip)
        except Exception as exc:  # an embedding server not up yet: answered per request
            logger.warning("warm-up search failed: %s", exc)
            return None, f"{type(exc).__name__}: {exc}"
        return round((time.perf_counter() - started) * 1e3, 1), None

    def asks_llm(self, request: _Query) -> bool:
        """Whether a search of ``request`` asks the LLM: an LLM rerank, HyDE or the filter."""
        retrieve = self.config.retrieve
        rerank = retrieve.rerank if request.rerank is None else request.rerank
        return (
            (rerank and retrieve.reranker == LLM_RERANKER)
            or retrieve.hyde.value != "off"
            or retrieve.llm_filter
        )

    async def on_search_thread(self, work: Callable[..., T], *args: Any, llm: bool = False) -> T:
        """``work(*args)`` on the search threads (``SEARCH_THREADS``, not the web server's
        rotating pool): queries are embedded side by side, searches of one open store run one
        at a time (but while an LLM works), and /search's response is built there too. With
        ``llm`` (a search that asks the LLM: ``asks_llm``), on threads of its own."""
        pool = self.llm_worker if llm else self.worker
        return await asyncio.get_running_loop().run_in_executor(pool, work, *args)

    async def retrieve(
        self, endpoint: str, text: str, request: _Query, extra: dict[str, Any]
    ) -> tuple[str, Any, str, Any, RetrievalResult | None]:
        """``retrieved`` on the search threads."""
        return await self.on_search_thread(self.retrieved, endpoint, text, request, extra,
                                           llm=self.asks_llm(request))  # fmt: skip

    def retrieved(
        self, endpoint: str, text: str, request: _Query, extra: dict[str, Any]
    ) -> tuple[str, Any, str, Any, RetrievalResult | None]:
        """Look the query up in the cache, else retrieve: (version, vector, scope, hit, result)."""
        overrides = request.overrides()
        scope = json.dumps({"endpoint": endpoint, **overrides, **extra}, sort_keys=True)
        try:
            with self.index.holding() as held:
                retriever, version = held.retriever, held.version
                # Embedded side by side, with no lock: the query, and the sentences it is
                # also searched by unless a cached answer may make them needless.
                cached = self.caches(endpoint)
                vector = retriever.query_vector(text, overrides, fragments=not cached)
                whole = cached and embeds_whole(retriever.embedder, text)
                hit = self.lookup(endpoint, vector, scope, version, text, whole)
                # The search holds the store's lock but while an LLM works (an LLM rerank,
                # HyDE, the LLM filter): it blocked every other search for minutes.
                result = None if hit else retriever.search(text, **overrides)
        except ValidationError as exc:  # an override this server's retrieve.* refuses
            errors = [
                {"loc": ("body", *err["loc"]), "msg": err["msg"], "type": err["type"]}
                for err in exc.errors()
            ]
            raise RequestValidationError(errors) from exc
        return version, vector, scope, hit, result


def _readable(render: Callable[..., T], *args: Any) -> T:
    """A reports page, or 503 naming the file when the history cannot be read."""
    try:
        return render(*args)
    except (OSError, ValueError, RagpipeError) as exc:  # pyarrow's: ValueErrors (ArrowInvalid)
        raise HTTPException(503, f"cannot read the reports' history: {exc}") from exc


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
    (so a missing index fails here, not on the first request). An app runs one lifespan:
    serve it once (its search threads, index and MCP sessions end with it)."""
    service = Service(config, embedder, llm)
    try:
        return _app(config, service)
    except BaseException:  # Ctrl-C or SIGTERM while building it: the index copy goes too
        service.worker.shutdown(wait=False)
        service.llm_worker.shutdown(wait=False)
        service.index.close()
        raise


def _app(config: RagpipeConfig, service: Service) -> FastAPI:
    agents = _mcp_route(service)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.index.start()
        try:
            async with agents.session_manager.run():
                yield
        finally:
            service.worker.shutdown(wait=True)
            service.llm_worker.shutdown(wait=True)
            service.index.close()

    app = FastAPI(
        title="ragpipe",
        summary="Search and cited answers over the published ragpipe index.",
        lifespan=lifespan,
    )
    app.state.service = service
    guarded, denied = _authorisation(config.serve.api_key)

    @app.exception_handler(ConfigError)
    async def _misconfigured(request: Request, exc: ConfigError) -> JSONResponse:
        # The request was valid; this server cannot serve it (e.g. rerank: true with a
        # cross-encoder it cannot load): the fix is in its configuration.
        return JSONResponse({"detail": str(exc)}, status_code=503)

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

    search_body, ask_body = request_models(config.serve)
    posted = {**denied, **_POSTED}

    reports = config.eval.reports_dir
    # Errors are JSON on these HTML and file routes too; 503: an unreadable history.
    report_errors = _as_json({**denied, 404: _error("No such report."),
                              503: _error("The reports' history cannot be read.")})  # fmt: skip
    report_routes: dict[str, Any] = {"dependencies": guarded, "responses": report_errors}
    report_files = {
        **report_errors,
        200: {"description": "The file as stored (report.html, summary.json, parquet, ...).",
              "content": {"text/html": {}, "application/json": {}, "text/markdown": {},
                          "application/octet-stream": {}}},
    }  # fmt: skip

    @app.get("/reports", include_in_schema=False, dependencies=guarded)
    def reports_root() -> Response:
        return RedirectResponse("/reports/")

    @app.get("/reports/", response_class=HTMLResponse, **report_routes)
    def reports_index() -> HTMLResponse:
        """The evaluation runs in eval.reports_dir by golden set, each linked to its
        report, newest first; read-only."""
        return HTMLResponse(_readable(index_page, reports))

    @app.get("/reports/trend/{golden:path}", response_class=HTMLResponse, **report_routes)
    def reports_trend(golden: str) -> HTMLResponse:
        """Every metric of one golden set's runs over time, with 95% CIs."""
        page = _readable(trend_page, reports, golden)
        if page is None:
            raise HTTPException(404, f"no runs of golden set {golden!r} in eval.reports_dir")
        return HTMLResponse(page)

    @app.head("/reports/{path:path}", dependencies=guarded, include_in_schema=False)
    @app.get("/reports/{path:path}", dependencies=guarded, responses=report_files)
    def report_file(path: str) -> Response:
        """A file under eval.reports_dir (a run's report.html, summary.json, ...)."""
        found = inside(reports, path)
        if found is None:
            raise HTTPException(404, "no such file under eval.reports_dir")
        return FileResponse(found)

    key = config.serve.api_key
    expected = key.get_secret_value().encode() if key is not None else None

    # HEAD too (not in the OpenAPI document): a load balancer's check may send it (405).
    @app.head("/healthz", include_in_schema=False)
    @app.get("/healthz", response_model=Health)
    def healthz(request: Request) -> dict[str, Any]:
        """Liveness and what is served: index version, points, embedder, uptime, cache.
        With serve.api_key set, the store's location and the text of errors only with the
        token."""
        index = service.index.describe()
        service.metrics.index_points.set(index["points"])
        embedder = service.index.embedder
        warm_up_error = service.warm_up_error
        # Open to any probe: without the token, no path of this machine, and no error's
        # text (paths, a server's address, an exception's message).
        header = next((v for k, v in request.scope["headers"] if k == b"authorization"), None)
        if not bearer_matches(header, expected):
            index.pop("store")
            if index["last_reload_error"] is not None:
                index["last_reload_error"] = f"last reload failed; {WITH_THE_TOKEN}"
            if warm_up_error is not None:
                warm_up_error = f"the warm-up search failed; {WITH_THE_TOKEN}"
        return {
            "status": "ok",
            "index": index,
            "embedder": embedder_name(config.embed),
            "query_embedder": {
                "name": embedder.name,
                "runtime": runtime_of(embedder),
                "dim": known_dim(embedder),  # never a call to an embedding server
                "max_tokens": embedder.max_tokens,
                "warm_up_ms": service.warm_up_ms,
                "warm_up_error": warm_up_error,
            },
            "uptime_s": round(time.monotonic() - service.started, 3),
            "cache": {
                "enabled": config.serve.cache,
                "threshold": config.serve.cache_threshold,
                "entries": len(service.cache),
                "hits": service.cache.hits,
                "misses": service.cache.misses,
            },
        }

    @app.post(
        "/search",
        dependencies=guarded,
        responses={**posted, 200: {"content": _SEARCH_MEDIA, "description": "The ranked chunks."}},
    )
    @_body(search_body)
    async def search(request: SearchRequest) -> Response:
        """Ranked chunks for the query, with every stage's score and the trace."""
        text = service.check(request.query, request.k, "query")
        return await service.on_search_thread(searched, text, request,
                                              llm=service.asks_llm(request))  # fmt: skip

    def searched(text: str, request: SearchRequest) -> Response:
        # The response is built here, on the search thread, while the result is in the
        # CPU's caches: the event loop only sends it (bench/serve.py).
        version, vector, scope, hit, result = service.retrieved(
            "search", text, request, {"format": request.format}
        )
        if hit is not None:
            body, media = hit.value
        else:
            assert result is not None
            body, media = _render(result, request.format, version)
            service.store("search", vector, scope, version, text, (body, media))
        if request.format == "json":  # a hit's ranking is the cached query's; the query is this one
            return JSONResponse({**body, "query": text, "cache": _cache_info(hit)})
        headers = {"X-Ragpipe-Cache": "hit" if hit else "miss", "X-Ragpipe-Index": version}
        return Response(body, media_type=media, headers=headers)

    # Ahead of FastAPI's route, which declares /search (the OpenAPI document) and answers
    # every request the fast path passes on.
    (declared,) = [r for r in app.router.routes if isinstance(r, APIRoute) and r.path == "/search"]
    # The fast path does what the route's dependencies do (the token check) and no more: a
    # dependency added to the route must not be passed by unnoticed.
    calls = [d.call for d in declared.dependant.dependencies]
    if calls != [d.dependency for d in guarded]:
        raise RuntimeError(f"FastSearch checks the token only; /search depends on {calls}")
    fast = FastSearch(search, search_body, config.serve.api_key, declared, app)
    app.state.fast_search = fast
    app.router.routes.insert(0, Route("/search", fast, methods=["POST"]))

    @app.post(
        "/ask",
        dependencies=guarded,
        responses={**posted, 200: {"content": _ASK_MEDIA, "description": _ASK_200}, 429: _BUSY},
    )
    @_body(ask_body)
    async def ask(request: AskRequest) -> Response:
        """A cited answer from the index (streamed when asked), or "not found".

        One answer is generated at a time; ``serve.max_queued_answers`` more may wait, and
        beyond that the request gets 429 with Retry-After. An answer whose client goes away,
        streamed or not, stops being generated.
        """
        text = service.check(request.question, request.k, "question")
        try:  # a question the model's window cannot hold is the client's to shorten
            await run_in_threadpool(source_budget, text, service.index.llm,
                                    config.generate.context_tokens, quiet=True)  # fmt: skip
        except QuestionTooLong as exc:
            raise _unprocessable("question", str(exc)) from exc
        version, vector, scope, hit, result = await service.retrieve("ask", text, request, {})
        cancelled = threading.Event()
        slot: _Slot | None = None
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
            slot = _Slot(service.answer_done)
            events = _generate(service, text, result, version, vector, scope, cancelled, slot)
        if request.stream == "none":
            try:  # the model takes seconds; a client that leaves cancels this (see below)
                final = await to_thread.run_sync(_last, events, abandon_on_cancel=True)
            finally:  # done, or the client went away: the model stops at its next token
                cancelled.set()
                # Cancelled before the generation began: its place is given back.
                if slot is not None:
                    slot.give_back_unless_started()
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
                # Gone before the model's thread began (before the first event, or just
                # after it): nothing else would give its place back, and a few such
                # clients used to fill the queue for good (every /ask then got 429).
                if slot is not None:
                    slot.give_back_unless_started()

        return StreamingResponse(
            body(),
            media_type=media,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.get(
        "/metrics",
        dependencies=guarded,
        response_class=PlainTextResponse,
        responses={**_as_json(denied),
                   200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                         "description": "Prometheus text exposition format."}},
    )  # fmt: skip
    def metrics() -> Response:
        """Requests, latency histogram, cache hits and the index, in Prometheus text format."""
        service.metrics.cache_entries.set(len(service.cache))
        return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # MCP for agents (streamable HTTP), behind the same token; not in the OpenAPI document.
    # POST only: the transport is stateless and answers in JSON, so a GET's event stream
    # could never carry a message; it was held open (a connection each, without a token
    # where none is set) and kept a shutdown waiting. The spec allows 405. Each POST is its
    # own session, so a cancel notification (another POST) cannot reach a call: a client
    # cancels by closing the request, and that cancels its handler.
    mcp = _CancelOnDisconnect(_LowerCaseHost(agents.endpoint))
    app.router.routes.append(Route("/mcp", _Bearer(mcp, config.serve.api_key), methods=["POST"]))

    # Outermost last: a client that leaves /ask cancels it (a whole JSON answer's handler
    # never reads the request again, and its model wrote on to the last token: 20 s with the
    # queue full and every other /ask 429), every request is measured, a loopback server's
    # Host and Origin are pinned, CORS answers preflights, bodies are capped.
    app.add_middleware(_CancelOnDisconnect, paths=("/ask",))
    app.add_middleware(
        _BodyLimit, limit=config.serve.max_body_bytes, timeout_s=config.serve.body_timeout_s
    )
    if config.serve.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=config.serve.cors_origins,
            allow_methods=["GET", "POST"],
            # MCP's client sends its protocol version (and a session's id, the last event
            # it saw): without them a browser's preflight for /mcp failed.
            allow_headers=["Authorization", "Content-Type", *MCP_HEADERS],
        )
    pinned = pinned_hosts(config.serve)
    if pinned is not None:
        app.add_middleware(_PinnedHost, hosts=pinned[0], origins=pinned[1])
    app.add_middleware(_Measured, metrics=service.metrics)
    return app


WITH_THE_TOKEN = "details with the token"


class Health(BaseModel):
    """What /healthz reports."""

    status: Literal["ok"]
    index: dict[str, Any] = Field(
        description="version, points, published_at, files, store, switches; last_reload_error "
        "and failed_version: why the newest published version could not be opened, and which "
        "(null once one opens). With serve.api_key set and no token sent, no store, and "
        f"last_reload_error only says 'last reload failed; {WITH_THE_TOKEN}'."
    )
    embedder: str = Field(description="The index's embedder (the stored vectors' model).")
    query_embedder: dict[str, Any] = Field(
        description="What embeds this server's queries: name (the index's embedder), runtime "
        "(onnxruntime, torch, ollama or openai), dim (null while an embedding server has not "
        "answered), max_tokens, and the warm-up search run at start (warm_up_ms; warm_up_error "
        "when it failed, its text only with the token when serve.api_key is set)."
    )
    uptime_s: float
    cache: dict[str, Any]


def _body(model: type[BaseModel]) -> Callable[[Endpoint], Endpoint]:
    """Read the request body as ``model`` (a subclass of the annotated one, with this
    server's limits): FastAPI takes the model, and with it the schema, from the annotation."""

    def annotate(endpoint: Endpoint) -> Endpoint:
        endpoint.__annotations__["request"] = model
        return endpoint

    return annotate


def _error(description: str, **headers: str) -> dict[str, Any]:
    response: dict[str, Any] = {"model": ErrorBody, "description": description}
    if headers:
        response["headers"] = {
            name: {"description": text, "schema": {"type": "string"}}
            for name, text in headers.items()
        }
    return response


def _as_json(responses: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """Error responses for a route whose own media type is not JSON (FastAPI would file a
    ``model`` under the route's media type; errors are JSON everywhere)."""
    schema = {"$ref": "#/components/schemas/ErrorBody"}  # registered by /search and /ask
    return {
        status: {
            **{key: value for key, value in response.items() if key != "model"},
            "content": {"application/json": {"schema": schema}},
        }
        for status, response in responses.items()
    }


_POSTED: dict[int | str, dict[str, Any]] = {
    400: _error("The body is not JSON text (e.g. not UTF-8)."),
    408: _error("The request body was not complete within serve.body_timeout_s."),
    413: _error("The request body is over serve.max_body_bytes."),
    503: _error("The index or a model this request needs cannot be used (the detail says why)."),
}
_BUSY = _error(
    "serve.max_queued_answers answers are already waiting for the model.",
    **{"Retry-After": "Seconds to wait before asking again."},
)
_SEARCH_MEDIA = {
    "application/json": {"schema": {"type": "object"}},
    "application/xml": {"schema": {"type": "string"}},
    "text/plain": {"schema": {"type": "string"}},
}
_EVENTS = ["retrieval", "sources", "token", "answer", "error"]
_ASK_MEDIA = {
    "application/json": {"schema": {"type": "object"}},
    "text/event-stream": {  # before OpenAPI 3.2's itemSchema, the schema of one event
        "schema": {
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "event": {"enum": _EVENTS},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {"type": "object"},
                },
            },
        }
    },
    "application/x-ndjson": {  # one JSON object per line
        "schema": {"type": "string"},
        "itemSchema": {
            "type": "object",
            "required": ["event"],
            "properties": {"event": {"enum": _EVENTS}},
        },
    },
}
_ASK_200 = "The answer (stream none), or its events (sse, ndjson)."


@dataclass
class _Agents:
    endpoint: ASGIApp
    session_manager: Any


def _mcp_route(service: Service) -> _Agents:
    """The MCP server's streamable-HTTP endpoint over ``service``'s index (stateless, JSON
    responses) and the session manager the app's lifespan runs."""
    from ragpipe.serve.mcp_tools import IndexTools, build_server

    tools = IndexTools(service.index, service.config, service.admit_answer, service.answer_done)
    server = build_server(tools)
    inner = server.streamable_http_app(
        streamable_http_path="/mcp",
        stateless_http=True,
        json_response=True,
        transport_security=_mcp_security(service.config.serve),
    )
    (route,) = [r for r in inner.routes if isinstance(r, Route) and r.path == "/mcp"]
    return _Agents(route.app, server.session_manager)


def pinned_hosts(serve: ServeConfig) -> tuple[list[str], list[str]] | None:
    """The Host and Origin values a server on loopback without a token answers (a
    ``name:*`` entry: any port), against DNS rebinding: a web page whose name came to point
    at 127.0.0.1 may send same-origin requests, and read the documents through /search and
    /ask. ``localhost`` without a port, ``serve.public_url``'s host (a reverse proxy) and
    ``serve.cors_origins`` are accepted. None, no pinning, with a token (a rebound page
    cannot send it) or on another address (no host to pin)."""
    from urllib.parse import urlsplit

    from ragpipe.serve.server import is_loopback

    if serve.api_key is not None or not is_loopback(serve.host):
        return None
    own = f"[{serve.host}]" if ":" in serve.host else serve.host  # 127.0.0.2, ::1
    loopback = list(dict.fromkeys(["127.0.0.1", "localhost", "[::1]", own.lower()]))
    hosts = [*loopback, *(f"{h}:*" for h in loopback)]
    origins = [*(f"http://{h}" for h in loopback), *(f"http://{h}:*" for h in loopback)]
    if serve.public_url:
        public = urlsplit(serve.public_url)
        name = (public.hostname or "").lower()
        name = f"[{name}]" if ":" in name else name
        default = {"http": 80, "https": 443}.get(public.scheme)
        port = public.port if public.port not in (None, default) else None
        hosts += [name, f"{name}:{port or default}"]  # as the MCP SDK's guard took it
        origins.append(f"{public.scheme}://{name}" + (f":{port}" if port else ""))
    return hosts, [*origins, *(o.lower().rstrip("/") for o in serve.cors_origins)]


def _mcp_security(serve: ServeConfig) -> Any:
    """The MCP transport's DNS-rebinding guard (``pinned_hosts``), as the SDK checks it;
    ``_PinnedHost`` checks the same for every other endpoint."""
    from mcp.server.transport_security import TransportSecuritySettings

    pinned = pinned_hosts(serve)
    if pinned is None:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts, origins = pinned
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


def _allowed(value: str, allowed: list[str]) -> bool:
    """Whether ``value`` is one of ``allowed`` (``*`` any; ``name:*`` with any port), in
    any case (a host's name is; browsers send it in lower case)."""
    value = value.lower()
    for entry in allowed:
        if entry in ("*", value):
            return True
        if entry.endswith(":*"):
            head, _, port = value.rpartition(":")
            if head == entry[:-2] and port.isdigit():
                return True
    return False


class _PinnedHost:
    """``pinned_hosts`` in front of every endpoint: a request naming another Host is 421,
    another Origin 403 (only /mcp was guarded: a rebound page read /search, /ask and the
    reports of a developer's server)."""

    def __init__(self, app: ASGIApp, hosts: list[str], origins: list[str]) -> None:
        self.app, self.hosts, self.origins = app, hosts, origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            # The first of each header, as Starlette and the MCP SDK read them.
            host, origin = (
                next((v.decode("latin-1") for k, v in scope["headers"] if k == name), None)
                for name in (b"host", b"origin")
            )
            refused = None
            # No Host at all is HTTP/1.0 (a load balancer's check): no browser sends that.
            if host is not None and not _allowed(host, self.hosts):
                refused = 421, f"Invalid Host header {host!r}"
            elif origin is not None and not _allowed(origin, self.origins):
                refused = 403, f"Invalid Origin header {origin!r}"
            if refused is not None:
                status, said = refused
                detail = (f"{said}: this server listens on loopback without serve.api_key "
                          "and answers only to its own address, localhost, 127.0.0.1 or [::1] (set "
                          "serve.public_url for a proxy's name, serve.cors_origins for a "
                          "page's origin)")  # fmt: skip
                await JSONResponse({"detail": detail}, status_code=status)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class FastSearch:
    """``POST /search`` without FastAPI's work per request (dependency solving, body parsing
    and validation through its layers: about 0.25 ms of event-loop CPU a search, measured
    from inside the server), for the requests FastAPI's route would accept as they are: a
    whole body sent as ``application/json`` that the request model accepts, with the token
    FastAPI would accept when one is set, goes straight to the same endpoint function (its
    errors to the same exception handlers). Anything else goes on to FastAPI's route, body
    replayed, so every refusal of a request (401, 400, 422, ...) is the one FastAPI writes;
    so does every request while ``app.dependency_overrides`` is set. ``served`` and
    ``passed_on`` count the two."""

    def __init__(self, endpoint: Callable[[Any], Awaitable[Response]], model: type[BaseModel],
                 key: SecretStr | None, route: APIRoute, app: FastAPI) -> None:  # fmt: skip
        self.endpoint, self.model, self.route, self.app = endpoint, model, route, app
        self.expected = key.get_secret_value().encode() if key is not None else None
        self.served = self.passed_on = 0

    def _takes(self, scope: Scope) -> bool:
        content_type = authorization = None
        for name, value in scope["headers"]:  # the first of each, as Starlette reads them
            if name == b"content-type" and content_type is None:
                content_type = value
            elif name == b"authorization" and authorization is None:
                authorization = value
        if content_type is None or content_type.lower() != b"application/json":
            return False
        return bearer_matches(authorization, self.expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # What FastAPI's router would have set, for whatever reads it (instrumentation).
        scope["route"], scope["endpoint"] = self.route, self.route.endpoint
        messages: list[Message] = []
        request = None
        if self._takes(scope) and not self.app.dependency_overrides:
            body, whole = b"", False
            while True:  # the body limit has read it already: this is its replay
                message = await receive()
                messages.append(message)
                if message["type"] != "http.request":
                    break  # the client went away: FastAPI says 400
                body += message.get("body", b"")
                if not message.get("more_body", False):
                    whole = True
                    break
            try:  # as FastAPI reads it; whatever fails, it answers
                payload = json.loads(body) if whole else None
                if isinstance(payload, dict):
                    request = self.model.model_validate(payload)
            except Exception:
                request = None
        if request is None:
            self.passed_on += 1

            async def replay() -> Message:
                return messages.pop(0) if messages else await receive()

            await self.route.handle(scope, replay, send)
            return
        self.served += 1
        response = await self.endpoint(request)
        await response(scope, receive, send)


def bearer_matches(header: bytes | None, expected: bytes | None) -> bool:
    """Whether an Authorization header carries the token ``expected`` (None: no token asked),
    by FastAPI's HTTPBearer and ``authorised``, step by step: the header as Latin-1, the
    scheme before the first space (any case), the rest stripped. The one rule of /search's
    fast path, FastAPI's routes and /mcp."""
    if expected is None:
        return True
    scheme, _, param = (header or b"").decode("latin-1").partition(" ")
    given = param.strip()
    return (
        bool(scheme and given)
        and scheme.lower() == "bearer"
        and hmac.compare_digest(given.encode(), expected)
    )


class _Bearer:
    """``serve.api_key`` in front of an ASGI app that is not a FastAPI route (MCP), by the
    rule of FastAPI's routes (``bearer_matches``, the first Authorization header)."""

    def __init__(self, app: ASGIApp, key: SecretStr | None) -> None:
        self.app = app
        self.expected = key.get_secret_value().encode() if key is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.expected is not None:
            header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            if not bearer_matches(header, self.expected):
                denied = JSONResponse(
                    {"detail": "missing or wrong bearer token: send Authorization: Bearer "
                     "<serve.api_key>"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )  # fmt: skip
                await denied(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _LowerCaseHost:
    """Host and Origin in lower case for the MCP SDK's DNS-rebinding guard, which compares
    them as sent: ``LOCALHOST:8080`` got 421 from /mcp and ``http://LOCALHOST:8080`` 403,
    where every other endpoint (``_PinnedHost``) takes a host's name in any case, as DNS
    does."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            folded = [
                (k, v.lower() if k in (b"host", b"origin") else v) for k, v in scope["headers"]
            ]
            scope = {**scope, "headers": folded}
        await self.app(scope, receive, send)


class _CancelOnDisconnect:
    """A handler cancelled when its client goes away before the answer. MCP's stateless
    JSON transport reads the request's body and never ``receive()`` again, so it never saw
    a client that gave up: an ``ask`` ran to the model's last token, holding the model and
    a place in the answer queue (``/ask`` got 429 meanwhile); so did ``/ask`` with
    ``stream: none``. Once the body is read, this reads ``receive()`` for the disconnect and
    cancels the handler; the offloaded call is then abandoned and the model stops at its
    next token. Nothing is sent, so the request counts as the client's leaving (499).
    ``paths``: only these (None: every request)."""

    def __init__(self, app: ASGIApp, paths: tuple[str, ...] | None = None) -> None:
        self.app, self.paths = app, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.paths is not None and scope["path"] not in self.paths):
            await self.app(scope, receive, send)
            return
        import anyio

        messages: list[Message] = []
        while True:  # the body limit has read it already: this is its replay
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        gone = anyio.Event()
        if messages[-1]["type"] == "http.disconnect":  # gone before its body ended
            gone.set()
        answered = False

        async def replay() -> Message:
            if messages:
                return messages.pop(0)
            await gone.wait()  # what the handler would have read next
            return {"type": "http.disconnect"}

        async def sending(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True
            await send(message)

        try:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    while not gone.is_set():
                        if (await receive())["type"] == "http.disconnect":
                            gone.set()
                    if not answered:
                        logger.info("%s: the client went away; its request is cancelled",
                                    scope.get("path"))  # fmt: skip
                        group.cancel_scope.cancel()

                if not gone.is_set():
                    group.start_soon(watch)
                await self.app(scope, replay, sending)
                group.cancel_scope.cancel()  # answered: the watch ends
        except BaseExceptionGroup as raised:  # the task group wraps the handler's error:
            if len(raised.exceptions) == 1:  # raised as is, the app's handlers match it
                raise raised.exceptions[0] from None
            raise


def _authorisation(key: SecretStr | None) -> tuple[list[Any], dict[int | str, dict[str, Any]]]:
    """The dependencies that guard an endpoint and the responses they add: a bearer security
    scheme in the OpenAPI document only when serve.api_key is set (a scheme the server does
    not enforce would tell clients something untrue)."""
    if key is None:
        return [], {}
    bearer = HTTPBearer(auto_error=False, scheme_name="bearer", description="serve.api_key")
    expected = key.get_secret_value().encode()

    async def authorised(
        credentials: HTTPAuthorizationCredentials | None = Security(bearer),  # noqa: B008
    ) -> None:
        given = credentials.credentials if credentials is not None else ""
        if not hmac.compare_digest(given.encode(), expected):
            raise HTTPException(
                401,
                "missing or wrong bearer token: send Authorization: Bearer <serve.api_key>",
                headers={"WWW-Authenticate": "Bearer"},
            )

    denied = _error(
        "Missing or wrong bearer token.", **{"WWW-Authenticate": "The scheme to use: Bearer."}
    )
    return [Depends(authorised)], {401: denied}


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


class _Slot:
    """One answer's place in the model's queue (``Service.admit_answer``), given back once:
    by the thread that generates the answer, or, when that thread never began (the client
    left first), by whoever ends the response."""

    def __init__(self, give_back: Callable[[], None]) -> None:
        self._give_back = give_back
        self._lock = threading.Lock()
        self._started = self._given = False

    def start(self) -> bool:
        """Claim the place for the model's thread; False once it was given back."""
        with self._lock:
            self._started = not self._given
            return self._started

    def give_back(self) -> None:
        with self._lock:
            if not self._given:
                self._given = True
                self._give_back()

    def give_back_unless_started(self) -> None:
        with self._lock:
            if not self._started and not self._given:
                self._given = True
                self._give_back()


def _generate(
    service: Service,
    question: str,
    result: RetrievalResult,
    version: str,
    vector: Any,
    scope: str,
    cancelled: threading.Event,
    slot: _Slot,
) -> Iterator[Event]:
    """retrieval, the tokens as the model writes them, then the answer (cached). Setting
    ``cancelled`` stops the model at its next token. The model's thread gives ``slot``
    back when it ends."""
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

    def on_sources(given: list[Source]) -> None:
        tokens.put(("sources", [source_json(s) for s in given]))

    def work() -> None:
        try:
            if cancelled.is_set():  # left while waiting for the model
                raise GenerationCancelled("the client went away")
            reply = configured_answer(question, result.hits, service.index.llm,
                                      service.config.generate,
                                      embedder_name(service.config.embed), on_token,
                                      on_sources)  # fmt: skip
            if reply.first_token_s is not None:
                service.metrics.first_token.observe(reply.first_token_s)
            for flag in reply.flags:
                service.metrics.flagged.labels(flag).inc()
            tokens.put(("done", reply))
        except GenerationCancelled:
            logger.info("answer not finished: the client went away")
            service.metrics.answers_cancelled.inc()
            tokens.put(("error", "the client went away"))
        except Exception as exc:  # reported to the client as an error event
            logger.warning("generation failed: %s", exc)
            tokens.put(("error", exc))
        finally:
            slot.give_back()

    if not slot.start():  # the client left before the model's turn came
        yield "error", {"detail": "generation failed: the client went away"}
        return
    threading.Thread(target=work, name="ragpipe-generate", daemon=True).start()
    streamed: list[str] = []
    while True:
        kind, value = tokens.get()
        if kind == "token":
            streamed.append(value)
            yield "token", {"text": value}
        elif kind == "sources":
            yield "sources", {"sources": value}
        elif kind == "error":
            yield "error", {"detail": f"generation failed: {value}"}
            return
        else:
            data = {**value.as_dict(), "retrieval": result.trace, "index_version": version}
            if not value.flags:  # a flagged answer is shown with its flags, never served again
                service.store("ask", vector, scope, version, question,
                              {**data, "_hits": _sources(result)})  # fmt: skip
            # The checked answer, when it is not what was streamed (an invalid citation taken
            # out, an answer withdrawn as not found): show it instead.
            replaces = "".join(streamed).strip() != value.text
            yield "answer", {**data, "cache": {"hit": False}, "replaces_stream": replaces}
            return


def _replay(
    cached: dict[str, Any], question: str, version: str, info: dict[str, Any]
) -> Iterator[Event]:
    """A cached answer as the same events: retrieval, the sources, its text as one token,
    the answer."""
    hits = cached.pop("_hits", [])
    yield (
        "retrieval",
        {
            "index_version": version,
            "cache": info,
            "hits": hits,
            "trace": cached.get("retrieval", {}),
        },
    )
    if cached["sources"]:  # as a fresh answer: none when the model was not asked
        yield "sources", {"sources": cached["sources"]}
    yield "token", {"text": cached["answer"]}
    # No model ran: the generation's own times and tokens are the cached answer's, kept
    # under cache.generated, not this reply's.
    generated = {k: cached.get(k) for k in ("seconds", "first_token_s", "tokens_in", "tokens_out")}
    yield "answer", {**cached, "question": question, "seconds": 0.0, "first_token_s": None,
                     "tokens_in": 0, "tokens_out": 0, "cache": {**info, "generated": generated},
                     "replaces_stream": False}  # fmt: skip


def _last(events: Iterator[Event]) -> Event:
    last: Event = ("error", {"detail": "no answer"})
    for event in events:
        last = event
    return last


def _sse(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


def _ndjson(name: str, data: dict[str, Any]) -> str:
    return json.dumps({"event": name, **data}) + "\n"
