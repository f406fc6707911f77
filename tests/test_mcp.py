"""`ragpipe mcp` (stdio) and /mcp on `ragpipe serve` (streamable HTTP), driven by the MCP
SDK's own client (issue 34): the tools listed, a search equal to `ragpipe search --format
json`, an answer, the index version as a resource, bad arguments answered as tool errors."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

from flows.cli import app as cli
from ragpipe.config import RagpipeConfig
from ragpipe.ingest.pipeline import run_ingest
from ragpipe.serve.app import create_app
from ragpipe.serve.server import running
from ragpipe.store import published
from tests.support.paths import QUERY_CORPUS, REPO
from tests.support.readers import reader_copies

pytestmark = [pytest.mark.slow, pytest.mark.integration]

BREAD = "How long should bread bake?"


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> tuple[RagpipeConfig, Path]:
    base = tmp_path_factory.mktemp("mcp")
    for name, text in QUERY_CORPUS.items():
        (base / "corpus" / name).parent.mkdir(parents=True, exist_ok=True)
        (base / "corpus" / name).write_text(text, encoding="utf-8")
    settings = {
        "discover": {"roots": [str(base / "corpus")]},
        "chunk": {"size": 200, "overlap": 20},
        "embed": {"provider": "onnx"},
        "store": {"path": str(base / "store")},
        "paths": {"work_dir": str(base / "work")},
        "llm": {"model": "smollm2-135m", "max_tokens": 24},
        "serve": {"max_k": 20},
    }
    cfg = RagpipeConfig.model_validate(settings)
    assert run_ingest(cfg).failed == 0
    config_file = base / "ragpipe.yaml"
    config_file.write_text(json.dumps(settings), encoding="utf-8")  # JSON is YAML
    return cfg, config_file


def _cli_search(config_file: Path, query: str, k: int) -> dict[str, Any]:
    done = CliRunner().invoke(
        cli, ["search", query, "--format", "json", "-k", str(k), "--config", str(config_file)]
    )
    assert done.exit_code == 0, done.output
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def _ranking(found: dict[str, Any]) -> list[tuple[str, str, float]]:
    return [(h["point_id"], h["file_path"], round(h["score"], 6)) for h in found["hits"]]


def _text(result: Any) -> str:
    (content,) = result.content
    return str(content.text)


async def _exercise(client: Any, cfg: RagpipeConfig, config_file: Path) -> None:
    """What every transport must do, checked against the CLI and the store."""
    tools = await client.list_tools()
    assert sorted(t.name for t in tools.tools) == ["ask", "search"]
    search = next(t for t in tools.tools if t.name == "search")
    assert search.input_schema["required"] == ["query"]
    assert search.input_schema["properties"]["k"]["anyOf"][0]["maximum"] == 20  # serve.max_k

    found = await client.call_tool("search", {"query": BREAD, "k": 3})
    assert not found.is_error, _text(found)
    body = json.loads(_text(found))
    version = published.current(cfg.store.path)
    assert body["index_version"] == version
    assert _ranking(body) == _ranking(_cli_search(config_file, BREAD, 3))
    assert body["hits"][0]["file_path"].endswith("bread.md") and len(body["hits"]) == 3
    narrowed = json.loads(_text(await client.call_tool(
        "search", {"query": BREAD, "file": "computing.md", "mode": "dense"})))  # fmt: skip
    assert narrowed["hits"] and all(
        h["file_path"].endswith("history/computing.md") for h in narrowed["hits"]
    )
    spaced = json.loads(_text(await client.call_tool(
        "search", {"query": BREAD, "file": " computing.md ", "mode": "dense"})))  # fmt: skip
    assert _ranking(spaced) == _ranking(narrowed)  # stripped, as the CLI strips it

    index = await client.read_resource("ragpipe://index")
    (content,) = index.contents
    described = json.loads(content.text)
    assert described["version"] == version and described["files"] == len(QUERY_CORPUS)

    asked = await client.call_tool("ask", {"question": BREAD, "k": 2})
    assert not asked.is_error, _text(asked)
    reply = json.loads(_text(asked))
    assert reply["question"] == BREAD and reply["index_version"] == version
    assert reply["model"] and reply["sources"][0]["file_path"].endswith("bread.md")

    for arguments, reason in [
        ({"query": "", "k": 3}, "at least 1 character"),
        ({"query": BREAD, "k": 0}, "greater than or equal to 1"),
        ({"query": BREAD, "k": 21}, "less than or equal to 20"),
        ({"query": BREAD, "k": True}, "valid integer"),  # as /search refuses them
        ({"query": BREAD, "k": "2"}, "valid integer"),
        ({"query": BREAD, "k": 2.5}, "fraction"),
        ({"query": BREAD, "mode": "fuzzy"}, "'dense', 'sparse' or 'hybrid'"),
        ({"k": 3}, "query"),
        ({"query": "   "}, "the query is empty"),
        # An empty filter filtered nothing: every chunk came back (the CLI refuses it).
        ({"query": BREAD, "file": ""}, "at least 1 character"),
        ({"query": BREAD, "heading": "  "}, "at least 1 character"),
    ]:
        refused = await client.call_tool("search", arguments)
        assert refused.is_error and reason in _text(refused), (arguments, _text(refused))
    # An argument a tool does not take is refused, as /search refuses it (422): it was
    # dropped, and a search "filtered" to x.md answered with unfiltered hits.
    assert all(t.input_schema["additionalProperties"] is False for t in tools.tools)
    for name, arguments, said in [
        ("search", {"query": "bread", "top_k": 1, "filters": {"file": "x.md"}},
         "unknown argument(s) 'filters', 'top_k': search takes query, k, mode, file, heading"),
        ("ask", {"question": BREAD, "stream": "sse"},
         "unknown argument(s) 'stream': ask takes question, k, mode, file, heading"),
    ]:  # fmt: skip
        refused = await client.call_tool(name, arguments)
        assert refused.is_error and said in _text(refused), _text(refused)
    unknown = await client.call_tool("delete_everything", {})
    assert unknown.is_error and "delete_everything" in _text(unknown)


def _run(session: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(session())


def test_ragpipe_mcp_over_stdio(indexed: tuple[RagpipeConfig, Path]) -> None:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    cfg, config_file = indexed
    server = StdioServerParameters(
        command=str(Path(sys.executable).parent / "ragpipe"),
        args=["mcp", "--config", str(config_file)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])},
        cwd=str(REPO),
    )

    async def session() -> None:
        async with Client(server, read_timeout_seconds=300) as client:
            await _exercise(client, cfg, config_file)

    _run(session)


def test_serve_offers_mcp_over_http_behind_its_token(
    indexed: tuple[RagpipeConfig, Path],
) -> None:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    cfg, config_file = indexed
    key = SecretStr("mcp-key")
    keyed = cfg.model_copy(update={"serve": cfg.serve.model_copy(update={"api_key": key})})
    with running(create_app(keyed)) as url:
        refused = httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert refused.status_code == 401 and "Bearer" in refused.headers["WWW-Authenticate"]
        wrong = httpx.post(f"{url}/mcp", json={}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert "/mcp" not in httpx.get(f"{url}/openapi.json").json()["paths"]

        async def session() -> None:
            headers = {"Authorization": "Bearer mcp-key"}
            async with (
                httpx2.AsyncClient(headers=headers, timeout=300) as http,
                Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client,
            ):
                await _exercise(client, cfg, config_file)
                # the same ranking /search gives
                found = json.loads(_text(await client.call_tool("search", {"query": BREAD})))
            over_http = httpx.post(f"{url}/search", json={"query": BREAD}, headers=headers)
            assert _ranking(found) == _ranking(over_http.json())

        _run(session)


def _stdio_server(config_file: Path) -> subprocess.Popen[bytes]:
    """A real `ragpipe mcp` on pipes (the test's checkout first on its path)."""
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "ragpipe"), "mcp", "--config", str(config_file)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])},
    )  # fmt: skip
    assert process.stdin is not None and process.stdout is not None
    return process


def test_stdio_writes_only_protocol_and_sigterm_cleans_up(
    indexed: tuple[RagpipeConfig, Path],
) -> None:
    """The SDK's client skips stdout lines that are not JSON, so a stray print would pass
    the test above: here every line is read raw. SIGTERM (a client or systemd stopping it)
    must remove the server's private copy of the index version."""
    cfg, config_file = indexed
    readers = published.root(cfg.store.path) / published.READERS
    before = set(readers.iterdir()) if readers.exists() else set()
    process = _stdio_server(config_file)
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "search", "arguments": {"query": BREAD, "k": 2}}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "ask", "arguments": {"question": BREAD, "k": 1}}},
    ]  # fmt: skip
    for message in messages:
        process.stdin.write((json.dumps(message) + "\n").encode())
    process.stdin.flush()
    replies: dict[int, Any] = {}
    lines = []
    while len(replies) < 3:
        line = process.stdout.readline()
        assert line, process.stderr.read().decode()[-3000:] if process.stderr else ""
        lines.append(line)
        reply = json.loads(line)  # every line of stdout is a JSON-RPC message
        if "id" in reply:
            replies[reply["id"]] = reply
    assert len(reader_copies(readers) - before) == 1  # its own copy of the version
    found = json.loads(replies[2]["result"]["content"][0]["text"])
    assert found["hits"][0]["file_path"].endswith("bread.md") and len(found["hits"]) == 2
    assert json.loads(replies[3]["result"]["content"][0]["text"])["question"] == BREAD
    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=60)
    assert all(json.loads(line) for line in rest.splitlines())
    assert set(readers.iterdir()) == before  # removed on the way out


def test_stdio_answers_a_line_it_cannot_read(indexed: tuple[RagpipeConfig, Path]) -> None:
    """A line the SDK could not read (a lone surrogate in the arguments, JSON cut short, JSON
    that is no JSON-RPC message) got no reply and no log: the client waited until it timed
    out. Each is answered with a JSON-RPC error (to the request's id where the line names
    one) and a warning on stderr, and the server goes on serving."""
    _, config_file = indexed
    process = _stdio_server(config_file)
    search = {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
              "params": {"name": "search", "arguments": {"query": BREAD, "k": 1}}}  # fmt: skip
    lines = [
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}),
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        '{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "search", '
        '"arguments": {"query": "\\ud800 bread"}}}',
        '{"jsonrpc": "2.0", "id": 3, "meth',
        "[1, 2, 3]",
        json.dumps(search),
    ]  # fmt: skip
    assert "\\ud800" in lines[2]  # the escape itself, as a client's JSON writer sends it
    process.stdin.write("".join(line + "\n" for line in lines).encode())
    process.stdin.flush()
    replies = []
    while not any(r.get("id") == 4 for r in replies):
        line = process.stdout.readline()
        assert line, process.stderr.read().decode()[-3000:] if process.stderr else ""
        replies.append(json.loads(line))
    _, errors = process.communicate(timeout=60)  # stdin closed: the server ends
    assert process.returncode == 0, errors.decode()[-3000:]
    by_id = [(r.get("id"), r.get("error", {}).get("code")) for r in replies]
    assert by_id == [(1, None), (2, -32700), (None, -32700), (None, -32600), (4, None)]
    assert "lone surrogate (such as \\ud800)" in replies[1]["error"]["message"]
    assert "not JSON: Invalid JSON" in replies[2]["error"]["message"]
    assert "not a JSON-RPC 2.0" in replies[3]["error"]["message"]
    found = json.loads(replies[4]["result"]["content"][0]["text"])
    assert found["hits"][0]["file_path"].endswith("bread.md")
    warned = [li for li in errors.decode().splitlines() if "could not be read" in li]
    assert warned == [
        "MCP: a message on stdin could not be read (a string holds a lone surrogate (such as "
        "\\ud800): not Unicode text); answered with JSON-RPC error -32700 (id 2)",
        "MCP: a message on stdin could not be read (not JSON: Invalid JSON: control character "
        "(\\u0000-\\u001F) found while parsing a string at line 2 column 0); answered with "
        "JSON-RPC error -32700 (id null)",
        "MCP: a message on stdin could not be read (not a JSON-RPC 2.0 request, notification "
        "or response); answered with JSON-RPC error -32600 (id null)",
    ], errors.decode()[-3000:]


def test_a_full_answer_queue_and_a_foreign_host_are_refused_with_reasons(
    indexed: tuple[RagpipeConfig, Path],
) -> None:
    from mcp import Client

    from ragpipe.serve.index import LiveIndex
    from ragpipe.serve.mcp_tools import IndexTools, build_server

    cfg, _ = indexed
    index = LiveIndex(cfg)
    try:
        full = build_server(IndexTools(index, cfg, admit=lambda: False, done=lambda: None))

        async def session() -> None:
            async with Client(full) as client:
                busy = await client.call_tool("ask", {"question": BREAD})
                assert busy.is_error and "too many answers waiting" in _text(busy)

        _run(session)
    finally:
        index.close()
    # On loopback without a token the transport pins Host and Origin (DNS rebinding), and
    # accepts localhost without a port and serve.public_url's host (a reverse proxy).
    public = cfg.model_copy(update={"serve": cfg.serve.model_copy(
        update={"public_url": "http://ragpipe.internal:8080"})})  # fmt: skip
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    accept = {"Accept": "application/json, text/event-stream"}
    with running(create_app(public)) as url:
        for host, status in [("localhost", 200), ("ragpipe.internal:8080", 200),
                             ("ragpipe.internal", 200), ("evil.example:8080", 421)]:  # fmt: skip
            got = httpx.post(f"{url}/mcp", json=ping, headers={**accept, "Host": host})
            assert got.status_code == status, (host, got.status_code, got.text)
        page = httpx.post(f"{url}/mcp", json=ping,
                          headers={**accept, "Origin": "https://evil.example"})  # fmt: skip
        assert page.status_code == 403
        # A host's name in any case, as DNS reads it, on /mcp as on /search (421 and 403).
        port = url.rsplit(":", 1)[1]
        for shouted in [{"Host": f"LOCALHOST:{port}"}, {"Host": "Ragpipe.Internal:8080"},
                        {"Origin": f"HTTP://LocalHost:{port}"}]:  # fmt: skip
            got = httpx.post(f"{url}/mcp", json=ping, headers={**accept, **shouted})
            assert got.status_code == 200, (shouted, got.status_code, got.text)
            found = httpx.post(f"{url}/search", json={"query": BREAD}, headers=shouted)
            assert found.status_code == 200, (shouted, found.text)
        # ... and so does every other endpoint: a rebound page read /search and the reports.
        evil = {"Host": "evil.example:8080"}
        for method, path in [("POST", "/search"), ("POST", "/ask"), ("GET", "/reports/"),
                             ("GET", "/metrics"), ("GET", "/healthz")]:  # fmt: skip
            got = httpx.request(method, f"{url}{path}", json={"query": BREAD}, headers=evil)
            assert got.status_code == 421 and "Invalid Host header" in got.text, path
            sent = httpx.request(method, f"{url}{path}", json={"query": BREAD},
                                 headers={"Origin": "http://evil.example"})  # fmt: skip
            assert sent.status_code == 403, path
        assert httpx.post(f"{url}/search", json={"query": BREAD},
                          headers={"Host": "localhost"}).status_code == 200  # fmt: skip
        # A GET's event stream could never carry a message (stateless, JSON): 405.
        assert httpx.get(f"{url}/mcp", headers=accept, timeout=10).status_code == 405


def test_hostile_mcp_requests_get_clear_answers_and_the_server_keeps_serving(
    indexed: tuple[RagpipeConfig, Path],
) -> None:
    """/mcp sits behind the same body limits as the API; malformed and oversized requests
    are answered, not crashed on, and a search still works after them."""
    cfg, _ = indexed
    small = cfg.model_copy(update={"serve": cfg.serve.model_copy(update={"max_body_bytes": 4096})})
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    with running(create_app(small)) as url:
        broken = httpx.post(f"{url}/mcp", content=b'{"jsonrpc": "2.0", "id": 1, "meth',
                            headers=accept)  # fmt: skip
        assert broken.status_code == 400 and broken.json()["error"]["code"] == -32700
        huge = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "search", "arguments": {"query": "x" * 10_000}}}  # fmt: skip
        too_big = httpx.post(f"{url}/mcp", json=huge, headers=accept)
        assert too_big.status_code == 413
        not_json = httpx.post(f"{url}/mcp", content=b"\xff\xfe\x00", headers=accept)
        assert 400 <= not_json.status_code < 500
        wrong_type = httpx.post(f"{url}/mcp", json=[1, 2, 3], headers=accept)
        assert 400 <= wrong_type.status_code < 500
        found = httpx.post(f"{url}/search", json={"query": BREAD})
        assert found.status_code == 200 and found.json()["hits"]


def test_a_cancelled_ask_stops_the_model_at_its_next_token(
    indexed: tuple[RagpipeConfig, Path], smollm: Any
) -> None:
    """An agent that gives up on an `ask` (the client cancels the call) frees the model: the
    real model, counted token by token, stops right after the cancellation."""
    import anyio
    from mcp import Client

    from ragpipe.models.llm import GenerationCancelled
    from ragpipe.serve.index import LiveIndex
    from ragpipe.serve.mcp_tools import IndexTools, build_server

    cfg, _ = indexed
    cfg = cfg.model_copy(update={"generate": cfg.generate.model_copy(
        update={"min_relevance": "off"})})  # fmt: skip
    tokens: list[str] = []
    ended: list[str] = []

    class Counted:  # the real model, its tokens counted
        name, takes_grammar = smollm.name, smollm.takes_grammar

        def count_tokens(self, text: str) -> int:
            return int(smollm.count_tokens(text))

        def chat(self, messages: Any, on_token: Any = None, **options: Any) -> Any:
            def counted(text: str) -> None:
                tokens.append(text)
                if on_token is not None:
                    on_token(text)

            try:
                reply = smollm.chat(messages, on_token=counted, **{**options, "max_tokens": 400})
            except GenerationCancelled:
                ended.append("cancelled")
                raise
            ended.append("finished")
            return reply

    index = LiveIndex(cfg, llm=Counted())  # type: ignore[arg-type]
    server = build_server(IndexTools(index, cfg))

    async def session() -> None:
        async with Client(server) as client:
            question = "Write a very long essay on baking bread and its whole history."
            with anyio.fail_after(120):
                async with anyio.create_task_group() as group:
                    group.start_soon(client.call_tool, "ask", {"question": question})
                    while not tokens:
                        await anyio.sleep(0.01)
                    group.cancel_scope.cancel()  # the agent gives up
            at_cancel = len(tokens)
            await anyio.sleep(2)
            assert ended == ["cancelled"]
            assert len(tokens) <= at_cancel + 2 < 400

    try:
        _run(session)
    finally:
        index.close()


class Slow:
    """A scripted model that writes one token every 20 ms, up to ``limit``, and counts them."""

    name = "slow"
    takes_grammar = False  # a scripted reply: nothing to constrain

    def __init__(self, limit: int = 1000) -> None:
        self.limit, self.written = limit, 0
        self.ended: list[str] = []

    def chat(self, messages: Any, on_token: Any = None, **options: Any) -> Any:
        from ragpipe.models.llm import Completion, GenerationCancelled

        # Distinct words without digits (a loop check reads "word1 word2" as one word again)
        syllables = ("ba", "ke", "li", "mo", "nu", "pa", "re", "si", "to", "vu")
        words = ["".join(w) + " " for w in itertools.product(syllables, repeat=3)][: self.limit]
        try:
            for word in words:
                time.sleep(0.02)
                self.written += 1
                if on_token is not None:
                    on_token(word)
        except GenerationCancelled:
            self.ended.append("cancelled")
            raise
        self.ended.append("finished")
        return Completion("".join(words), 10, self.limit, self.name, 0.02 * self.limit)

    def count_tokens(self, text: str) -> int:
        return len(text) // 4


def test_an_mcp_ask_over_http_stops_when_its_client_goes_away(
    indexed: tuple[RagpipeConfig, Path],
) -> None:
    """Each POST to /mcp is its own session, answered in JSON: the transport never read the
    connection again, so an `ask` whose client gave up ran to the model's last token and
    held the answer queue (/ask got 429 for 20 s). Now the disconnect cancels the call."""
    cfg, _ = indexed
    cfg = cfg.model_copy(update={"serve": cfg.serve.model_copy(
        update={"max_queued_answers": 0, "cache": False})})  # fmt: skip
    slow = Slow()
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "ask", "arguments": {"question": BREAD}}}  # fmt: skip
    accept = {"Accept": "application/json, text/event-stream"}
    import anyio

    with running(create_app(cfg, llm=slow)) as url:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up
            httpx.post(f"{url}/mcp", json=call, headers=accept, timeout=1.5)
        deadline = time.monotonic() + 10
        while not slow.ended and time.monotonic() < deadline:
            time.sleep(0.05)
        assert slow.ended == ["cancelled"]
        assert 0 < slow.written < 150, slow.written  # ~75 in 1.5 s; all 1,000 before
        slow.limit = 5
        asked = httpx.post(f"{url}/ask", json={"question": BREAD}, timeout=60)
        assert asked.status_code == 200, asked.text  # its place in the queue came back
        assert asked.json()["answer"] == "bababa babake babali babamo babanu"
        # A call its client waits for is answered in full, as before.
        whole = httpx.post(f"{url}/mcp", json=call, headers=accept, timeout=60)
        assert whole.status_code == 200, whole.text
        reply = json.loads(whole.json()["result"]["content"][0]["text"])
        assert reply["answer"] == "bababa babake babali babamo babanu"
        assert slow.ended == ["cancelled", "finished", "finished"]

        # The SDK's client closes the request of a call it cancels (its cancel notification,
        # another POST, is another session): the model stops there too.
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        slow.limit, slow.written = 1000, 0

        async def session() -> None:
            async with (
                httpx2.AsyncClient(timeout=300) as http,
                Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client,
            ):
                with anyio.fail_after(60):
                    async with anyio.create_task_group() as group:
                        group.start_soon(client.call_tool, "ask", {"question": BREAD})
                        while not slow.written:
                            await anyio.sleep(0.01)
                        group.cancel_scope.cancel()  # the agent gives up
                    at_cancel = slow.written
                    while len(slow.ended) < 4:
                        await anyio.sleep(0.05)
                assert slow.ended[-1] == "cancelled" and slow.written <= at_cancel + 5

        _run(session)


def _unreadable(line: str) -> Exception:
    """What the SDK's stdio reader raises on ``line`` (its own parse)."""
    import mcp_types

    try:
        mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except Exception as exc:
        return exc
    raise AssertionError(f"{line!r} was read")


def test_a_broken_response_and_a_blank_line_get_no_error_under_a_clients_id() -> None:
    """The review of the stdio answers: a broken *response* (to a request of this server's,
    whose ids count like the client's) was answered under its id, failing the client's own
    pending request 5; a blank line between messages drew an error and a warning."""
    from ragpipe.serve.mcp_tools import _blank, unreadable

    request = '{"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {"x": "\\ud800"}}'
    assert unreadable(_unreadable(request))[2] == 5  # a request: answered under its id
    response = '{"jsonrpc": "2.0", "id": 5, "result": {"x": "\\ud800"}}'
    assert unreadable(_unreadable(response))[2] is None
    assert _blank(_unreadable("\n")) and _blank(_unreadable("  \r\n"))
    assert not _blank(_unreadable("{"))


def test_an_error_behind_the_disconnect_watch_is_raised_as_itself() -> None:
    """The review: the watch's task group wrapped what the MCP app raised in an
    ExceptionGroup, which none of the app's exception handlers matches (a plain 500)."""
    import anyio

    from ragpipe.serve.app import _CancelOnDisconnect

    async def broken(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        raise ValueError("the handler's own error")

    async def receive() -> dict[str, Any]:
        await anyio.sleep(0)
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Any) -> None:
        raise AssertionError("nothing is sent")

    async def call() -> None:
        await _CancelOnDisconnect(broken)({"type": "http", "path": "/mcp"}, receive, send)

    with pytest.raises(ValueError, match="the handler's own error"):
        anyio.run(call)
