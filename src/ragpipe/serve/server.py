"""Running the API: in the foreground (``ragpipe serve``) or in a background thread."""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from ragpipe.errors import StageError


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
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=30)


@contextmanager
def running(app: Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """The app served on ``host`` in a daemon thread; yields its base URL (``port=0``: a
    free port). Stopped, gracefully, on exit. For tests, benchmarks and notebooks."""
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
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
