"""Calling an Ollama server: bounded retries with backoff and errors that say what to do.

Shared by the Ollama embedder (``/api/embed``) and the Ollama LLM (``/api/chat``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ragpipe.errors import StageError

logger = logging.getLogger(__name__)

T = TypeVar("T")


def ollama_client(host: str, timeout_s: float, api_key: str | None) -> Any:
    """An ``ollama.Client`` for ``host``; an API key goes out as a Bearer token."""
    import ollama

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    return ollama.Client(host=host, timeout=timeout_s, headers=headers)


def call_with_retries(
    request: Callable[[], T],
    *,
    host: str,
    model: str,
    retries: int,
    section: str,
    model_field: str = "model",
    host_field: str = "host",
) -> T:
    """Run ``request``, retrying 5xx/429 answers and connection failures.

    Backoff 0.5 s, 1 s, 2 s, ... A missing model (404) is not retried: the
    error says to pull it. ``section``/``*_field`` name the config settings to
    fix in the messages (e.g. ``embed.ollama_host``).
    """
    import httpx
    import ollama

    delay = 0.5
    last: Exception | None = None
    for attempt in range(retries + 1):
        try:
            return request()
        except ollama.ResponseError as exc:
            if exc.status_code == 404:
                raise StageError(
                    f"Ollama at {host} has no model {model!r}: run `ollama pull {model}` there, "
                    f"or set {section}.{model_field}"
                ) from exc
            retryable = exc.status_code >= 500 or exc.status_code == 429
            last = exc
        except (ConnectionError, httpx.TransportError) as exc:
            retryable, last = True, exc
        except json.JSONDecodeError as exc:  # a proxy's page, a line cut short
            raise StageError(
                f"Ollama at {host} sent a reply that is not JSON ({exc}); is {section}."
                f"{host_field} the Ollama server's URL?"
            ) from exc
        if not retryable or attempt == retries:
            break
        logger.warning(
            "Ollama request failed (%s); retry %d/%d in %.1fs", last, attempt + 1, retries, delay
        )
        time.sleep(delay)
        delay *= 2
    raise StageError(
        f"Ollama at {host} failed after {attempt + 1} attempt(s): "
        f"{type(last).__name__}: {last}. Is the server running (`ollama serve`)? "
        f"Set {section}.{host_field} / RAGPIPE_{section.upper()}__{host_field.upper()} to its URL."
    ) from last
