"""A loopback HTTP server speaking the Ollama API, backed by real local models.

Only what ragpipe calls: ``GET /api/tags``, ``POST /api/embed`` and
``POST /api/chat`` (streamed NDJSON or one JSON object; ``format`` as a JSON
schema; ``logprobs``/``top_logprobs`` answered in the first chunk, as Ollama
does). Requests are recorded; ``fail_next`` makes the next requests answer with
the given HTTP status codes (to exercise retries), and ``down_after`` fails every
request after the first N (a server that dies mid-run); ``cut_streams`` ends a streamed
chat without its final line.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from ragpipe.models.embedders import Embedder
from ragpipe.models.llm import LLM
from tests.support.loopback import serve


@dataclass
class OllamaState:
    embedders: dict[str, Embedder]
    llms: dict[str, LLM] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    fail_next: list[int] = field(default_factory=list)
    down_after: int | None = None  # from this many requests on, every one answers 503
    hang_s: float = 0.0  # with down_after: hang this long instead of answering 503
    cut_streams: bool = False  # a streamed chat ends without its final (done) line
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
            hang = 0.0
            with state.lock:
                status = state.fail_next.pop(0) if state.fail_next else None
                if state.down_after is not None and len(state.requests) > state.down_after:
                    status = 503
                    hang = state.hang_s
            if status == 503 and state.down_after is not None and hang:
                time.sleep(hang)  # a server that stopped answering: the client times out
                return True
            if status is None:
                return False
            self._send(status, {"error": f"injected failure {status}"})
            return True

        def do_GET(self) -> None:
            if self.path == "/api/tags":
                names = [*state.embedders, *state.llms]
                models = [{"name": f"{n}:latest", "model": f"{n}:latest"} for n in names]
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
            if self.path == "/api/chat":
                self._chat(body)
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

        def _chat(self, body: dict[str, Any]) -> None:
            model = str(body.get("model", ""))
            llm = state.llms.get(model.removesuffix(":latest"))
            if llm is None:
                self._send(404, {"error": f"model '{model}' not found, try pulling it first"})
                return
            options = body.get("options") or {}
            schema = body.get("format") if isinstance(body.get("format"), dict) else None
            kwargs: dict[str, Any] = {
                "schema": schema,
                "max_tokens": options.get("num_predict"),
                "temperature": options.get("temperature"),
                "seed": options.get("seed"),
            }
            if not body.get("stream", True):
                reply = llm.chat(body["messages"], **kwargs)
                self._send(200, _final(model, reply.text, reply))
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.end_headers()

            def piece(text: str, logprobs: list[dict[str, Any]] | None = None) -> None:
                line = {"model": model, "message": {"role": "assistant", "content": text},
                        "done": False}  # fmt: skip
                if logprobs is not None:
                    line["logprobs"] = logprobs
                self.wfile.write(json.dumps(line).encode() + b"\n")
                self.wfile.flush()

            if body.get("logprobs"):  # the whole reply in one chunk, with its first token's
                reply = llm.chat(body["messages"], top_logprobs=body.get("top_logprobs"), **kwargs)
                alts = [{"token": t, "logprob": lp} for t, lp in (reply.top_logprobs or {}).items()]
                piece(reply.text, [{"token": reply.text, "logprob": 0.0, "top_logprobs": alts}])
            else:
                reply = llm.chat(body["messages"], on_token=piece, **kwargs)
            if state.cut_streams:  # a proxy's timeout, a server restarted mid-answer
                self.close_connection = True
                return
            self.wfile.write(json.dumps(_final(model, "", reply)).encode() + b"\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


def _final(model: str, content: str, reply: Any) -> dict[str, Any]:
    return {
        "model": model,
        "message": {"role": "assistant", "content": content},
        "done": True,
        "done_reason": reply.finish_reason or "stop",
        "prompt_eval_count": reply.tokens_in,
        "eval_count": reply.tokens_out,
    }


@contextmanager
def ollama_server(
    embedders: dict[str, Embedder], llms: dict[str, LLM] | None = None
) -> Iterator[tuple[str, OllamaState]]:
    """Serve the Ollama API on a free loopback port; yields (host URL, state)."""
    state = OllamaState(embedders, dict(llms or {}))
    with serve(_handler(state)) as url:
        yield url, state
