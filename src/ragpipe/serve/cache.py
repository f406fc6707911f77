"""A semantic cache: a new question gets a stored answer when it means the same.

Entries are keyed on the normalised query embedding. A lookup is a hit when
the cosine between the new query's vector and a stored one is at least the
threshold, and both were asked in the same *scope* (the endpoint and every
request option that changes the result: mode, k, filters, ...) against the
same index *version*. A new version empties the cache; the size is bounded
(least recently used out first); an optional TTL drops old entries.

The threshold is the whole safety of it: too low, and a different question
gets someone else's answer. ``bench/cache_threshold.py`` measures, on both dev
golden sets, the highest cosine between two different questions and the
lowest between a question and its trivial rewrites; the default sits between.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class CacheHit:
    """A cached value and why it was served."""

    value: Any
    similarity: float
    query: str  # the question the value was computed for
    age_s: float


@dataclass
class _Entry:
    vector: npt.NDArray[np.float32]
    scope: str
    query: str
    value: Any
    stored_at: float


def unit(vector: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """``vector`` scaled to length 1 (a zero vector stays zero)."""
    v = np.asarray(vector, dtype=np.float32).reshape(-1)
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


class SemanticCache:
    """Bounded, thread-safe, version-scoped nearest-question cache."""

    def __init__(
        self, threshold: float, max_entries: int, ttl_seconds: float | None = None
    ) -> None:
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        self.threshold = threshold
        self.max_entries = max_entries
        self.ttl_seconds = ttl_seconds
        self.version: str | None = None
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def _expired(self, entry: _Entry, now: float) -> bool:
        return self.ttl_seconds is not None and now - entry.stored_at > self.ttl_seconds

    def _follow(self, version: str | None) -> None:
        """Empty the cache when the index version it was filled from is not ``version``."""
        if version != self.version:
            self._entries.clear()
            self.version = version

    def get(
        self, vector: npt.NDArray[np.float32], scope: str, version: str | None
    ) -> CacheHit | None:
        """The closest entry of ``scope`` at or above the threshold, or None (a miss)."""
        query = unit(vector)
        now = time.monotonic()
        with self._lock:
            self._follow(version)
            if self.ttl_seconds is not None:
                for key in [k for k, e in self._entries.items() if self._expired(e, now)]:
                    del self._entries[key]
            keys = [k for k, e in self._entries.items() if e.scope == scope]
            if not keys:
                self.misses += 1
                return None
            similarities = np.stack([self._entries[k].vector for k in keys]) @ query
            best_at = int(np.argmax(similarities))
            best_key, best = keys[best_at], float(similarities[best_at])
            if best < self.threshold:
                self.misses += 1
                return None
            entry = self._entries[best_key]
            self._entries.move_to_end(best_key)
            self.hits += 1
            return CacheHit(entry.value, min(best, 1.0), entry.query, now - entry.stored_at)

    def put(
        self,
        vector: npt.NDArray[np.float32],
        scope: str,
        version: str | None,
        query: str,
        value: Any,
    ) -> None:
        """Store ``value`` for ``query``; dropped when the index moved on meanwhile."""
        with self._lock:
            if version != self.version:  # computed on a version the cache has left
                return
            self._entries[self._next] = _Entry(unit(vector), scope, query, value, time.monotonic())
            self._next += 1
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self, version: str | None = None) -> None:
        """Drop every entry and follow ``version`` from now on."""
        with self._lock:
            self._entries.clear()
            self.version = version
