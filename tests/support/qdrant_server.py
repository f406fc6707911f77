"""A loopback HTTP server speaking Qdrant's REST API, backed by the real Qdrant
engine of qdrant-client's local mode, with switches to make it fail.

There is no Qdrant server binary here; this lets ragpipe's ``store.url`` path
(qdrant-client's REST transport, API key header, timeouts) run for real, and
lets tests take the "server" down mid-run: refuse connections, hang past the
client's timeout, or answer 503. Only the endpoints ragpipe calls are served.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from importlib.metadata import version
from typing import Any

from qdrant_client import QdrantClient
from qdrant_client.http import models as m

from tests.support.loopback import serve

_LOCK = threading.Lock()
_ENGINE_LOCK = threading.Lock()
_ROUTE = re.compile(r"^/collections/(?P<name>[^/]+)(?P<rest>/.*)?$")


@dataclass
class QdrantFake:
    """What a test controls: the engine, the key, and how the server fails."""

    engine: QdrantClient
    api_key: str | None = None
    # None: healthy. "refuse": drop the connection. "hang": answer after hang_s.
    # "503": answer 503. Applied to requests whose "METHOD path" matches fail_on.
    failure: str | None = None
    fail_on: str = ""
    fail_times: int | None = None  # heal after this many failed requests (None: never)
    hang_s: float = 5.0
    calls: Counter[str] = field(default_factory=Counter)
    keys_seen: list[str | None] = field(default_factory=list)
    url: str = ""

    def fail(self, how: str | None, on: str = "", times: int | None = None) -> None:
        self.failure, self.fail_on, self.fail_times = how, on, times

    def _should_fail(self, label: str) -> str | None:
        with _LOCK:
            if not self.failure or self.fail_on not in label:
                return None
            how = self.failure
            if self.fail_times is not None:
                self.fail_times -= 1
                if self.fail_times <= 0:
                    self.failure = None
            return how


def _dump(value: Any) -> Any:
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_none=True)
    return value


def _handle(fake: QdrantFake, method: str, path: str, body: dict[str, Any]) -> Any:
    engine = fake.engine
    if path == "/" and method == "GET":
        return {"title": "qdrant (ragpipe test server)", "version": version("qdrant-client")}
    if path == "/aliases" and method == "GET":
        return _dump(engine.get_aliases())
    match = _ROUTE.match(path)
    if match is None:
        raise KeyError(path)
    name, rest = match["name"], match["rest"] or ""
    route = (method, rest)
    if route == ("GET", "/exists"):
        return {"exists": engine.collection_exists(name)}
    if route == ("GET", ""):
        return _dump(engine.get_collection(name))
    if route == ("PUT", ""):
        spec = m.CreateCollection.model_validate(body)
        return engine.create_collection(
            name,
            vectors_config=spec.vectors,  # type: ignore[arg-type]
            sparse_vectors_config=spec.sparse_vectors,
            metadata=spec.metadata,
        )
    if route == ("PATCH", ""):
        update = m.UpdateCollection.model_validate(body)
        return engine.update_collection(name, metadata=update.metadata)
    if route == ("PUT", "/index"):
        return {"operation_id": 0, "status": "completed"}  # local mode has no payload indexes
    if route == ("PUT", "/points"):
        points = m.PointsList.model_validate(body).points
        return _dump(engine.upsert(name, points=points, wait=True))
    if route == ("POST", "/points/delete"):
        selector = m.FilterSelector.model_validate(body)
        return _dump(engine.delete(name, points_selector=selector, wait=True))
    if route == ("POST", "/points/count"):
        count = m.CountRequest.model_validate(body)
        return _dump(engine.count(name, count_filter=count.filter, exact=bool(count.exact)))
    if route == ("POST", "/points/scroll"):
        req = m.ScrollRequest.model_validate(body)
        records, offset = engine.scroll(
            name,
            scroll_filter=req.filter,
            limit=req.limit or 10,
            offset=req.offset,
            with_payload=req.with_payload if req.with_payload is not None else True,
            with_vectors=req.with_vector or False,
        )
        return {"points": _dump(records), "next_page_offset": offset}
    if route == ("POST", "/points/query"):
        query = m.QueryRequest.model_validate(body)
        response = engine.query_points(
            name,
            query=query.query,
            using=query.using,
            prefetch=query.prefetch,
            query_filter=query.filter,
            score_threshold=query.score_threshold,
            limit=query.limit or 10,
            with_payload=query.with_payload if query.with_payload is not None else True,
            with_vectors=query.with_vector or False,
        )
        return _dump(response)
    if route == ("POST", "/points"):
        req = m.PointRequest.model_validate(body)
        return _dump(
            engine.retrieve(
                name,
                ids=req.ids,
                with_payload=req.with_payload if req.with_payload is not None else True,
                with_vectors=req.with_vector or False,
            )
        )
    raise KeyError(f"{method} {path}")


def _handler(fake: QdrantFake) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep test output quiet
            pass

        def _serve(self, method: str) -> None:
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            label = f"{method} {path}"
            fake.calls[label] += 1
            fake.keys_seen.append(self.headers.get("api-key"))
            how = fake._should_fail(label)
            if how is not None:
                if how == "refuse":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if how == "hang":
                    time.sleep(fake.hang_s)
                else:
                    self._reply(503, {"status": {"error": "Service Unavailable"}})
                    return
            if fake.api_key is not None and self.headers.get("api-key") != fake.api_key:
                self._reply(403, {"status": {"error": "Invalid api-key"}})
                return
            try:
                body = json.loads(raw) if raw else {}
                with _ENGINE_LOCK:  # local mode is not thread-safe
                    result = _handle(fake, method, path, body)
            except KeyError as exc:
                self._reply(404, {"status": {"error": f"Not found: {exc}"}})
                return
            except ValueError as exc:  # the engine's own "not found" and validation errors
                self._reply(400, {"status": {"error": str(exc)}})
                return
            if path == "/":
                self._reply(200, result)
            else:
                self._reply(200, {"result": result, "status": "ok", "time": 0.0})

        def _reply(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # the client gave up (timeout)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

    return Handler


@contextmanager
def qdrant_server(
    engine: QdrantClient | None = None, api_key: str | None = None
) -> Iterator[QdrantFake]:
    """Serve ``engine`` (default: a fresh in-memory one) on a free loopback port."""
    fake = QdrantFake(engine or QdrantClient(location=":memory:"), api_key=api_key)
    with serve(_handler(fake)) as fake.url:
        yield fake


def closed_port_url() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


Check = Callable[[QdrantFake], bool]
