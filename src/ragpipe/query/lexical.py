"""BM25 computed in the client (rank_bm25), for stores or settings without Qdrant's sparse leg."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

from ragpipe.store import Hit, VectorStore, Where

logger = logging.getLogger(__name__)


_WORD = re.compile(r"\w+", re.UNICODE)


def _tokens(text: str) -> list[str]:
    return [t.lower() for t in _WORD.findall(text)]


# -- components ----------------------------------------------------------------------


class ClientBM25:
    """rank-bm25 (Okapi) over every stored chunk text, rebuilt when the store changes."""

    def __init__(self, store: VectorStore, state: Callable[[], str]) -> None:
        self._store = store
        self._state = state
        self._built_at: str | None = None
        self._ids: list[str] = []
        self._payloads: list[dict[str, Any]] = []
        self._index: Any = None

    def _refresh(self) -> None:
        state = self._state()
        if state == self._built_at:
            return
        from rank_bm25 import BM25Okapi

        started = time.perf_counter()
        hits = list(self._store.scroll())
        self._ids = [h.point_id for h in hits]
        self._payloads = [h.payload for h in hits]
        corpus = [_tokens(str(h.payload.get("text", ""))) for h in hits]
        self._index = BM25Okapi(corpus) if corpus else None
        self._built_at = state
        logger.info(
            "client BM25 index: %d chunks in %.2fs", len(hits), time.perf_counter() - started
        )

    def query(self, text: str, limit: int, where: Where | None = None) -> list[Hit]:
        self._refresh()
        if self._index is None:
            return []
        scores = self._index.get_scores(_tokens(text))
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], self._ids[i]))
        out = []
        for i in order:
            if scores[i] <= 0:
                break
            if where is None or where.matches(self._payloads[i]):
                out.append(Hit(self._ids[i], float(scores[i]), self._payloads[i]))
                if len(out) == limit:
                    break
        return out
