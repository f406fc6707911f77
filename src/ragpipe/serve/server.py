"""Running the API: in the foreground (``ragpipe serve``) or in a background thread."""

from __future__ import annotations

import asyncio
import ipaddress
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ragpipe.errors import StageError

# Pending bytes that go out at once rather than at the end of the turn: a producer that
# never yields still meets the transport's flow control.
FLUSH_AT_BYTES = 65_536


class _OneWrite:
    """A connection's transport whose writes in one turn of the event loop go out as one at
    its end: a response's head and body (two ASGI messages, sent in the same turn) reach the
    kernel in one send, and wake the client once, not twice. Nothing waits longer than that
    turn (or than ``FLUSH_AT_BYTES``); a stream's events go out as they come."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))
        self._size += len(data)
        if self._size >= FLUSH_AT_BYTES:
            self.flush()

    def writelines(self, lines: Iterable[bytes | bytearray | memoryview]) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            self._size = 0
            if not self._transport.is_closing():
                self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._size + self._transport.get_write_buffer_size()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._size = 0
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # the rest is the transport's own
        return getattr(self._transport, name)


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, writing through ``_OneWrite``: a ``POST /search``
    answered in one send instead of two (bench/serve.py)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_OneWrite(transport, self.loop))  # type: ignore[arg-type]


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the API on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_forever(app: Any, host: str, port: int) -> None:
    """Serve until SIGINT or SIGTERM; requests in flight finish first, then the index
    copy is closed and removed."""
    uvicorn.run(
        app, host=host, port=port, http=HttpProtocol, log_level="info", timeout_graceful_shutdown=30
    )


@contextmanager
def running(app: Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """The app served on ``host`` in a daemon thread; yields its base URL (``port=0``: a
    free port). Stopped, gracefully, on exit. For tests, benchmarks and notebooks."""
    config = uvicorn.Config(app, host=host, port=port, http=HttpProtocol, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="ragpipe-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise StageError(f"the API did not start on {host}:{port}")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
