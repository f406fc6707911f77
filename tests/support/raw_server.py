"""A raw-socket server on loopback for hostile-server tests: each connection is handed to
a function that writes whatever bytes it likes, as slowly as it likes (bounded)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress


@contextmanager
def raw_server(handle: Callable[[socket.socket], None]) -> Iterator[str]:
    """Serve on 127.0.0.1 until the block ends; yields ``http://127.0.0.1:PORT``.

    ``handle`` gets each accepted connection after its request has been read; the
    connection is closed when it returns. Stopping the server closes open connections.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()
    open_conns: list[socket.socket] = []

    def serve_one(conn: socket.socket) -> None:
        with conn, suppress(OSError):
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            handle(conn)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            open_conns.append(conn)
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        for conn in open_conns:
            with suppress(OSError):
                conn.close()
        listener.close()
        thread.join(5)
