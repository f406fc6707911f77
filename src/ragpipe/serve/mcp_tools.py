"""The index for agents: an MCP server (the Model Context Protocol, through the official
``mcp`` SDK) with ``search`` and ``ask`` as tools and the index version as a resource.

``ragpipe mcp`` serves it over stdio (an agent's client starts it as a subprocess);
``ragpipe serve`` mounts its streamable-HTTP transport at ``/mcp``, behind
``serve.api_key``. Both answer from a :class:`~ragpipe.serve.index.LiveIndex`: the
published version, switched to the next one when an ingest publishes it, one version per
search. A search is what ``ragpipe search --format json`` prints (plus ``index_version``);
an answer is what ``ragpipe ask --json`` prints. Bad arguments and expected failures (no
index, a setting the server refuses, the model queue full) come back as tool errors with
the reason, never as a crash of the server.
"""

# No ``from __future__ import annotations``: the SDK reads the tools' signatures, whose
# types are made in ``build_server`` from this server's limits.
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, cast

from pydantic import (
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ragpipe.errors import RagpipeError
from ragpipe.models.embedders import embedder_name
from ragpipe.models.llm import GenerationCancelled
from ragpipe.query.generate import configured_answer
from ragpipe.query.render import search_json
from ragpipe.serve.fields import JSON_INTEGER

if TYPE_CHECKING:
    from types import TracebackType

    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.tools import Tool
    from mcp.shared.message import SessionMessage

    from ragpipe.config import RagpipeConfig
    from ragpipe.serve.index import LiveIndex

logger = logging.getLogger(__name__)

T = TypeVar("T")
Offload = Callable[[Callable[[], T]], Awaitable[T]]
INDEX_URI = "ragpipe://index"
INSTRUCTIONS = (
    "Search a document index maintained by ragpipe. `search` returns ranked chunks (file, "
    "heading, page, score, text); `ask` returns an answer that cites the chunks it used, or "
    "says the index does not hold it. Read ragpipe://index for the version being served."
)


class Busy(RagpipeError):
    """More answers are waiting for the model than ``serve.max_queued_answers`` allows."""


class IndexTools:
    """What the tools do, synchronously, on a live index (run them off the event loop).

    ``admit`` and ``done`` bound the answers waiting for the model (``serve``'s own queue);
    without them every ``ask`` waits its turn.
    """

    def __init__(
        self,
        index: "LiveIndex",
        config: "RagpipeConfig",
        admit: Callable[[], bool] | None = None,
        done: Callable[[], None] | None = None,
    ) -> None:
        self.index, self.config = index, config
        self._admit, self._done = admit, done

    @staticmethod
    def _overrides(
        k: int | None, mode: str | None, file: str | None, heading: str | None
    ) -> dict[str, Any]:
        values = {"top_k": k, "mode": mode, "filter_file": file, "filter_heading": heading}
        return {key: value for key, value in values.items() if value is not None}

    def search(
        self, query: str, k: int | None, mode: str | None, file: str | None, heading: str | None
    ) -> dict[str, Any]:
        with self.index.reader() as (retriever, version):
            result = retriever.search(query, **self._overrides(k, mode, file, heading))
        return {**search_json(result), "index_version": version}

    def ask(
        self,
        question: str,
        k: int | None,
        mode: str | None,
        file: str | None,
        heading: str | None,
        cancelled: threading.Event | None = None,
    ) -> dict[str, Any]:
        """The cited answer; setting ``cancelled`` (the caller went away) stops the model at
        its next token (``GenerationCancelled``)."""
        with self.index.reader() as (retriever, version):
            result = retriever.search(question, **self._overrides(k, mode, file, heading))
        if self._admit is not None and not self._admit():
            raise Busy("too many answers waiting for the model; retry later")

        def on_token(_: str) -> None:
            if cancelled is not None and cancelled.is_set():
                raise GenerationCancelled("the MCP request was cancelled")

        try:
            on_token("")  # cancelled while waiting for the model
            reply = configured_answer(question, result.hits, self.index.llm,
                                      self.config.generate, embedder_name(self.config.embed),
                                      on_token)  # fmt: skip
        finally:
            if self._done is not None:
                self._done()
        return {**reply.as_dict(), "retrieval": result.trace, "index_version": version}

    def describe(self) -> dict[str, Any]:
        """The version served, its points and files, and the embedder queries use."""
        return {**self.index.describe(), "embedder": embedder_name(self.config.embed)}


async def in_thread(call: Callable[[], T]) -> T:
    """``call`` on a worker thread; a cancelled request stops waiting for it at once (an
    answer then stops at the model's next token, see ``IndexTools.ask``)."""
    import anyio.to_thread

    return await anyio.to_thread.run_sync(call, abandon_on_cancel=True)


def _strict(fn: Callable[..., Any]) -> "Tool":
    """The tool of ``fn``, refusing arguments it does not take, and saying so in its input
    schema (``additionalProperties: false``). The SDK dropped them silently: a search with
    ``filters`` (the HTTP API's name) answered unfiltered, where /search answers 422."""
    from mcp.server.mcpserver.tools import Tool

    tool = Tool.from_function(fn)
    loose = tool.fn_metadata.arg_model
    accepted = list(loose.model_fields)

    class Strict(loose):  # type: ignore[valid-type,misc]  # the SDK's model of fn's arguments
        model_config = ConfigDict(extra="forbid")

        @model_validator(mode="before")
        @classmethod
        def _known(cls, data: Any) -> Any:
            unknown = sorted(set(data) - set(accepted)) if isinstance(data, dict) else []
            if unknown:
                raise PydanticCustomError(
                    "unknown_argument",
                    "unknown argument(s) {unknown}: {tool} takes {accepted}",
                    {"unknown": ", ".join(map(repr, unknown)), "tool": tool.name,
                     "accepted": ", ".join(accepted)},
                )  # fmt: skip
            return data

    tool.fn_metadata.arg_model = create_model(loose.__name__, __base__=Strict)  # its name
    tool.parameters = {**tool.parameters, "additionalProperties": False}
    return tool


def build_server(tools: IndexTools, offload: Offload[Any] = in_thread) -> "MCPServer":
    """The MCP server over ``tools``; ``offload`` runs a blocking call off the event loop."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    from ragpipe import __version__

    serve = tools.config.serve
    Text = Annotated[str, Field(min_length=1, max_length=serve.max_query_chars)]
    K = Annotated[
        int,
        Field(ge=1, le=serve.max_k, description="Chunks returned (retrieve.top_k)."),
        JSON_INTEGER,  # as over HTTP: never true or "2"
    ]
    Mode = Literal["dense", "sparse", "hybrid"]
    # Stripped, and never empty: "" filtered nothing (every chunk matched) and " bread.md"
    # matched no file, where the CLI's --filter refuses the one and strips the other.
    Named = StringConstraints(strip_whitespace=True, min_length=1)
    File = Annotated[
        str,
        Named,
        Field(
            description="Only chunks of a file whose stored path ends with these whole path "
            "parts (a file name, or dir/name): bread.md and kitchen/bread.md match "
            "kitchen/bread.md, read.md and .md match nothing."
        ),
    ]
    Heading = Annotated[
        str, Named, Field(description="Only chunks with this heading on their path.")
    ]

    async def run(
        call: Callable[[], dict[str, Any]], cancelled: threading.Event | None = None
    ) -> dict[str, Any]:
        try:
            found: dict[str, Any] = await offload(call)
            return found
        except (RagpipeError, ValidationError) as exc:  # the reason reaches the agent
            raise ToolError(str(exc)) from exc
        finally:  # done, failed, or cancelled by the client: the model stops
            if cancelled is not None:
                cancelled.set()

    async def search(
        query: Annotated[Text, Field(description="The question or keywords.")],
        k: K | None = None,
        mode: Mode | None = None,
        file: File | None = None,
        heading: Heading | None = None,
    ) -> dict[str, Any]:
        """Ranked chunks of the index for a query: file, page, heading, text and every
        stage's score, best first (what `ragpipe search --format json` prints)."""
        text = query.strip()
        if not text:
            raise ToolError("the query is empty")
        return await run(lambda: tools.search(text, k, mode, file, heading))

    async def ask(
        question: Annotated[Text, Field(description="The question to answer from the index.")],
        k: K | None = None,
        mode: Mode | None = None,
        file: File | None = None,
        heading: Heading | None = None,
    ) -> dict[str, Any]:
        """An answer from the index that cites its sources as [n] (`cited`, with file and
        heading), or `not_found` when the index does not hold it; `flags` say why an answer
        should not be trusted as it stands (uncited, truncated, ...)."""
        text = question.strip()
        if not text:
            raise ToolError("the question is empty")
        cancelled = threading.Event()
        return await run(lambda: tools.ask(text, k, mode, file, heading, cancelled), cancelled)

    # The SDK configures the root logger when none is: not above WARNING for library callers.
    server: MCPServer = MCPServer(
        name="ragpipe",
        version=__version__,
        instructions=INSTRUCTIONS,
        log_level="WARNING",
        tools=[_strict(search), _strict(ask)],
    )

    @server.resource(
        INDEX_URI,
        name="index",
        mime_type="application/json",
        description="The index version served: version, points, files, published_at, embedder.",
    )
    async def index() -> str:
        return json.dumps(await offload(tools.describe))

    return server


# -- stdio ---------------------------------------------------------------------------


def serve_stdio(server: "MCPServer") -> None:
    """``server`` on stdin and stdout, as ``server.run("stdio")`` serves it, but a line the
    SDK cannot read is answered: a JSON-RPC error (-32700, or -32600 for JSON that is not
    a JSON-RPC message), to the request's id where the line names one, and a warning on
    stderr. The SDK dropped such a line with a DEBUG log (a lone surrogate, ``\\ud800``, in
    a tool's arguments): its client waited for the reply until it timed out."""
    import anyio

    anyio.run(_serve_stdio, server)


async def _serve_stdio(server: "MCPServer") -> None:
    from mcp.server.stdio import stdio_server

    lowlevel = server._lowlevel_server  # what MCPServer.run_stdio_async serves
    async with stdio_server() as (read_stream, write_stream):
        await lowlevel.run(
            _Answered(read_stream, write_stream),
            write_stream,
            lowlevel.create_initialization_options(),
        )


class _Answered:
    """The SDK's stream of messages read from stdin, where a line it could not read (an
    exception in the stream, which its dispatcher drops) is answered and logged instead."""

    def __init__(self, inner: Any, replies: Any) -> None:
        self._inner, self._replies = inner, replies

    @property
    def last_context(self) -> Any:  # the sender's context, as the SDK's own stream keeps it
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> "SessionMessage":
        while True:
            item = await self._inner.receive()
            if not isinstance(item, Exception):
                return cast("SessionMessage", item)
            await self._answer(item)

    async def _answer(self, exc: Exception) -> None:
        from mcp.shared.message import SessionMessage
        from mcp_types import ErrorData, JSONRPCError

        if _blank(exc):  # a client's empty line between messages: nothing to answer
            return
        code, reason, request_id = unreadable(exc)
        logger.warning(
            "MCP: a message on stdin could not be read (%s); answered with JSON-RPC error %d "
            "(id %s)", reason, code, json.dumps(request_id),
        )  # fmt: skip
        error = ErrorData(code=code, message=f"cannot read the message: {reason}")
        await self._replies.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=request_id,
                                                             error=error)))  # fmt: skip

    def __aiter__(self) -> "_Answered":
        return self

    async def __anext__(self) -> "SessionMessage":
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> "_Answered":
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: "TracebackType | None",
    ) -> None:
        await self.aclose()


def _blank(exc: Exception) -> bool:
    """The line the SDK could not read held nothing but white space."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    text = errors[0].get("input") if errors and errors[0]["type"] == "json_invalid" else None
    return isinstance(text, str | bytes) and not text.strip()


def unreadable(exc: Exception) -> tuple[int, str, int | str | None]:
    """What a line the SDK could not read is answered with: the JSON-RPC error code, why,
    and the request's id when the line names one (so that its client stops waiting)."""
    from mcp_types import INVALID_REQUEST, PARSE_ERROR

    errors = exc.errors() if isinstance(exc, ValidationError) else []
    if not errors:
        return PARSE_ERROR, f"{type(exc).__name__}: {exc}", None
    first = errors[0]
    if first["type"] == "json_invalid":
        try:  # Python's parser reads what the SDK's refuses: a lone surrogate
            parsed = json.loads(first["input"])
        except (TypeError, ValueError, RecursionError):
            return PARSE_ERROR, f"not JSON: {first['msg']}", None
        try:
            json.dumps(parsed, ensure_ascii=False).encode("utf-8")
            reason = str(first["msg"])
        except UnicodeEncodeError:
            reason = "a string holds a lone surrogate (such as \\ud800): not Unicode text"
        return PARSE_ERROR, reason, _request_id(parsed)
    # JSON, but no JSON-RPC message: each error is one kind of message it is not.
    data = next((e["input"] for e in errors if isinstance(e.get("input"), dict)), None)
    return INVALID_REQUEST, "not a JSON-RPC 2.0 request, notification or response", (
        _request_id(data))  # fmt: skip


def _request_id(message: Any) -> int | str | None:
    """The id of a request (a message with a method): a response's id is one of this
    server's own, and an error sent under it would fail another of the client's calls."""
    if not isinstance(message, dict) or "method" not in message:
        return None
    found = message.get("id")
    return found if isinstance(found, str) or type(found) is int else None
