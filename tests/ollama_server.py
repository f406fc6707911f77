"""A loopback HTTP server speaking the Ollama API, backed by real local models.

Only what ragpipe calls: ``GET /api/tags``, ``POST /api/embed``. Requests
are recorded, and ``fail_next`` makes the next requests answer with the given
HTTP status codes (to exercise retries).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ragpipe.embed import Embedder


@dataclass
class OllamaState:
    embedders: dict[str, Embedder]
    requests: list[dict[str, Any]] = field(default_factory=list)
    fail_next: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(state: OllamaState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep test output clean
            pass

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _fault(self) -> bool:
            with state.lock:
                status = state.fail_next.pop(0) if state.fail_next else None
            if status is None:
                return False
            self._send(status, {"error": f"injected failure {status}"})
            return True

        def do_GET(self) -> None:
            if self.path == "/api/tags":
                models = [{"name": f"{n}:latest", "model": f"{n}:latest"} for n in state.embedders]
                self._send(200, {"models": models})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            with state.lock:
                state.requests.append(
                    {"path": self.path, "body": body, "auth": self.headers.get("Authorization")}
                )
            if self._fault():
                return
            if self.path != "/api/embed":
                self._send(404, {"error": f"{self.path} not served"})
                return
            name = str(body.get("model", "")).removesuffix(":latest")
            embedder = state.embedders.get(name)
            if embedder is None:
                self._send(404, {"error": f"model '{name}' not found, try pulling it first"})
                return
            inputs = body.get("input", [])
            texts = [inputs] if isinstance(inputs, str) else list(inputs)
            vectors = embedder.embed_documents(texts)
            self._send(
                200,
                {"model": body["model"], "embeddings": vectors.tolist(), "prompt_eval_count": 0},
            )

    return Handler


@contextmanager
def ollama_server(embedders: dict[str, Embedder]) -> Iterator[tuple[str, OllamaState]]:
    """Serve the Ollama API on a free loopback port; yields (host URL, state)."""
    state = OllamaState(embedders)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
