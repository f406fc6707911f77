"""Calling an OpenAI-compatible server: vLLM, TGI, LM Studio, llama.cpp's server, OpenAI.

One small client over httpx for ``/chat/completions`` (whole or streamed as
server-sent events) and ``/embeddings``: a bearer key that is never logged,
a timeout per request, retries with backoff on 429 and 5xx (honouring
``Retry-After``) and on lost connections, at most ``max_concurrency``
requests in flight, and errors that name the setting to fix.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import httpx
from pydantic import SecretStr

from ragpipe.errors import StageError

logger = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE = {429, 500, 502, 503, 504}
MAX_RETRY_AFTER_S = 30.0


def api_key(configured: SecretStr | None) -> str | None:
    """The configured key, else ``OPENAI_API_KEY`` from the environment (the variable every
    OpenAI client reads), else None (local servers usually need none)."""
    if configured is not None:
        return configured.get_secret_value()
    return os.environ.get("OPENAI_API_KEY") or None


class OpenAIClient:
    """Requests to one OpenAI-compatible base URL (``https://host/v1``).

    Args:
        base_url: The server's OpenAI-compatible root, ending in ``/v1`` for most servers.
        key: Bearer token, or None.
        timeout_s: Seconds per request (connect, and between bytes of a reply).
        retries: Retries of a request that got 429/5xx or lost its connection.
        max_concurrency: Requests in flight at most, across threads.
        section: The config section, for the messages (``llm``, ``embed``).
    """

    def __init__(
        self,
        base_url: str,
        key: str | None,
        timeout_s: float,
        retries: int,
        max_concurrency: int,
        section: str,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=headers)
        self.retries = retries
        self.section = section
        self._slots = threading.BoundedSemaphore(max_concurrency)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` as JSON; the JSON reply."""

        def request() -> dict[str, Any]:
            with self._slots:
                response = self._http.post(path, json=body)
            self._check(response, path, body)
            try:
                reply = response.json()
            except ValueError:
                reply = None
            if not isinstance(reply, dict):  # a proxy's HTML page, a body cut short
                raise StageError(
                    f"the server at {self.base_url} answered {path} with something that is "
                    f"not a JSON object (HTTP {response.status_code}): "
                    f"{response.text[:200]!r}; is {self.section}.base_url its /v1 address?"
                )
            if reply.get("error"):  # some servers send their errors with status 200
                raise StageError(
                    f"the server at {self.base_url} failed {path}: {_event_error(reply)}"
                )
            return reply

        return self._with_retries(request, path)

    @contextmanager
    def stream(self, path: str, body: dict[str, Any]) -> Iterator[Iterator[dict[str, Any]]]:
        """POST ``body`` with ``stream: true``; yields the server-sent events' JSON data. Only
        the request is retried, never a stream that has started (its text went out)."""

        def opened() -> tuple[Any, httpx.Response]:
            slot = self._slots
            slot.acquire()
            try:
                request = self._http.build_request("POST", path, json={**body, "stream": True})
                response = self._http.send(request, stream=True)
                if response.status_code >= 400:
                    response.read()
                    response.close()
                    self._check(response, path, body)
            except BaseException:
                slot.release()
                raise
            return slot, response

        slot, response = self._with_retries(opened, path)
        try:
            yield _events(response, self.base_url)
        finally:
            response.close()  # a reader that stops early stops the server generating
            slot.release()

    def _with_retries(self, request: Callable[[], T], path: str) -> T:
        delay = 0.5
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            wait = delay
            try:
                return request()
            except _Retryable as exc:
                last, wait = exc, max(delay, exc.retry_after or 0.0)
            except httpx.TransportError as exc:  # refused, reset, timed out
                last = exc
            if attempt == self.retries:
                break
            logger.warning(
                "%s%s failed (%s); retry %d/%d in %.1fs",
                self.base_url, path, last, attempt + 1, self.retries, wait,
            )  # fmt: skip
            time.sleep(wait)
            delay *= 2
        raise StageError(
            f"the OpenAI-compatible server at {self.base_url} failed after {self.retries + 1} "
            f"attempt(s) on {path}: {last}. Is it running, and is {self.section}.base_url "
            f"(RAGPIPE_{self.section.upper()}__BASE_URL) its /v1 address?"
        ) from last

    def _check(self, response: httpx.Response, path: str, body: dict[str, Any]) -> None:
        status = response.status_code
        if status < 400:
            return
        detail = _error_message(response)
        if status in RETRYABLE:
            raise _Retryable(f"HTTP {status}: {detail}", _retry_after(response))
        if status in (401, 403):
            raise StageError(
                f"the server at {self.base_url} refused the API key (HTTP {status}: {detail}); "
                f"set {self.section}.api_key through RAGPIPE_{self.section.upper()}__API_KEY or "
                "OPENAI_API_KEY"
            )
        if status == 404:
            raise StageError(
                f"the server at {self.base_url} has no {path} or no model "
                f"{body.get('model')!r} (HTTP 404: {detail}); check {self.section}.base_url "
                f"(usually ending in /v1) and {self.section}.model (the server lists its models "
                "at /v1/models)"
            )
        raise RequestRefused(
            f"the server at {self.base_url} refused {path}: HTTP {status}: {detail}", status
        )

    def close(self) -> None:
        self._http.close()


class RequestRefused(StageError):
    """The server answered a request with a client error other than 401/403/404 (400, 422:
    a field it does not take)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        return min(float(value), MAX_RETRY_AFTER_S)
    except ValueError:
        return None


def _error_message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:300]
    return json.dumps(data)[:300]


def _events(response: httpx.Response, base_url: str) -> Iterator[dict[str, Any]]:
    """The JSON data of each server-sent event until ``[DONE]``.

    Raises:
        StageError: The connection broke or timed out mid-stream, or the stream ended
            with neither ``[DONE]`` nor a ``finish_reason``: the text so far is part of
            an answer, never one. (A stream that said why it finished and then closed is
            whole: llama.cpp's server before September 2024, TGI before July 2024 and
            ik_llama.cpp send no ``[DONE]``.)
    """
    lines = response.iter_lines()
    finished = False
    while True:
        try:
            line = next(lines, None)
        except httpx.HTTPError as exc:  # reset, closed mid-chunk, no byte for timeout_s
            raise StageError(f"the server at {base_url} broke off its stream: {exc!r}") from exc
        if line is None:
            if finished:
                return
            raise StageError(
                f"the server at {base_url} ended its stream before it said the answer was "
                "finished (no finish_reason, no [DONE]): the answer may be cut short, so it "
                "is not used"
            )
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError as exc:
            raise StageError(f"the server sent an event that is not JSON: {data[:200]}") from exc
        if isinstance(event, dict) and event.get("error"):
            raise StageError(f"the server stopped the answer: {_event_error(event)}")
        if isinstance(event, dict) and any(
            isinstance(c, dict) and c.get("finish_reason") for c in event.get("choices") or []
        ):
            finished = True
        yield event


def _event_error(event: dict[str, Any]) -> str:
    error = event["error"]
    return str(error.get("message") if isinstance(error, dict) else error)
