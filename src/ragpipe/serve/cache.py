"""A semantic cache: a new question gets a stored answer when it means the same.

Entries are keyed on the normalised query embedding. A lookup is a hit when
the cosine between the new query's vector and a stored one is at least the
threshold, and both were asked in the same *scope* (the endpoint and every
request option that changes the result: mode, k, filters, ...) against the
same index *version*. A new version empties the cache; the size is bounded
(least recently used out first); an optional TTL drops old entries.

The threshold alone is not enough: too low, and a different question gets
someone else's answer, and one changed word in a long question moves the
embedding very little ("Is it safe to grant X to every user?" vs "... unsafe
..." scored 0.991). So a hit also needs the two questions to agree on what a
cosine cannot see (``meaning_conflict``): the same numbers and versions, the
same quoted phrases, as many negations, not the same words in another order,
and no word in one that is the other's with a negating prefix (safe/unsafe,
install/uninstall). ``bench/cache_threshold.py`` measures the threshold on both
dev golden sets and the guard on minimal pairs.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter, OrderedDict
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
    slot: int  # its row of SemanticCache._vectors
    scope: str
    query: str
    value: Any
    stored_at: float
    whole: bool = True  # the embedder read all of ``query``: else only ``query`` itself hits


_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_QUOTED = re.compile(r'"([^"]+)"|\u201c([^\u201d]+)\u201d')
_WORD = re.compile(r"[a-z0-9]+(?:['\u2019-][a-z0-9]+)*")
_POSSESSIVE = re.compile(r"['\u2019]s$")  # "the admin's files" / "a user's files"
_NEGATIONS = frozenset(
    ["not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "without", "cannot"]
)
# Prefixes that turn a word into its opposite, or two that oppose each other on one stem
# (enable/disable, upgrade/downgrade, import/export).
_OPPOSING_PREFIXES = ("", "un", "in", "im", "il", "ir", "dis", "non", "non-", "de", "en",
                      "up", "down", "ex", "over", "under")  # fmt: skip


# Words that mean the opposite of each other with no shared stem, which no prefix rule sees:
# "bread at high altitude" and "at low altitude" embed at 0.973 with all-MiniLM-L6-v2, over
# the cache's 0.97, and "encrypted before upload" / "after upload" at 0.985.
_PAIRS = """
        high/low higher/lower highest/lowest upper/lower min/max minimum/maximum
        minimal/maximal before/after first/last earlier/later early/late earliest/latest
        more/less more/fewer most/least increase/decrease increases/decreases
        increased/decreased increasing/decreasing large/small larger/smaller
        largest/smallest big/small bigger/smaller long/short longer/shorter
        longest/shortest fast/slow faster/slower fastest/slowest old/new older/newer
        oldest/newest start/stop start/end begin/end add/remove open/close on/off
        above/below over/under inside/outside inner/outer input/output read/write
        true/false success/failure succeed/fail accept/reject allow/deny include/exclude
        including/excluding internal/external public/private left/right top/bottom
        push/pull send/receive client/server ascending/descending forward/backward
        positive/negative plus/minus always/sometimes
"""
_ANTONYMS = {frozenset(pair.split("/")) for pair in _PAIRS.split()}


def _negations(words: list[str]) -> int:
    return sum(w in _NEGATIONS or w.endswith(("n't", "n\u2019t")) for w in words)


def meaning_conflict(a: str, b: str) -> str | None:
    """Why questions ``a`` and ``b`` cannot share an answer however close their embeddings,
    or None: a number, version or quoted phrase differs, one has more negations, the same
    words come in another order ("from A to B", "from B to A"), a word of
    one is a word of the other with a negating prefix, or the two hold a word and its
    opposite (``_ANTONYMS``: high/low, minimum/maximum, before/after, ...)."""
    if sorted(_NUMBER.findall(a)) != sorted(_NUMBER.findall(b)):
        return "a number or version differs"
    quoted = [sorted("".join(m) for m in _QUOTED.findall(t)) for t in (a, b)]
    if quoted[0] != quoted[1]:
        return "a quoted phrase differs"
    words_a, words_b = _WORD.findall(a.lower()), _WORD.findall(b.lower())
    if _negations(words_a) != _negations(words_b):
        return "a negation differs"
    # "from server A to server B" / "from B to A", "Python 2 to 3" / "3 to 2": a mean-pooled
    # embedding is close to a bag of words (0.99 and over), so one order hit the other's
    # answer. A rephrasing that only moves words ("On Windows, how ...") pays a miss.
    # The words both hold are compared in order, so "How can I copy ... from B to A" is
    # still another question than "How do I copy ... from A to B".
    plain_a, plain_b = ([_POSSESSIVE.sub("", w) for w in ws] for ws in (words_a, words_b))
    if _swapped(plain_a, plain_b):
        return "the same words in another order"
    only_a, only_b = set(words_a) - set(words_b), set(words_b) - set(words_a)
    for x in only_a:
        for y in only_b:
            if _opposed(x, y):
                return f"{x!r} and {y!r} mean the opposite"
    return None


def _shared_order(words: list[str], other: list[str]) -> list[str]:
    """``words`` with those ``other`` lacks left out (a repeated word as often as both have
    it: the first ones)."""
    left = Counter(words) & Counter(other)
    kept = []
    for word in words:
        if left[word] > 0:
            left[word] -= 1
            kept.append(word)
    return kept


# Longer differing stretches are not checked: a swap is told within this many shared words.
_SWAP_WORDS = 24


def _swapped(a: list[str], b: list[str]) -> bool:
    """Whether the words ``a`` and ``b`` share read as one with two of its parts swapped
    across a word or more ("from A to B" / "from B to A", "Python 2 to 3" / "3 to 2", "the
    admin ... a user" / "a user ... the admin"). Parts that only trade places side by side
    are a rephrasing ("In R, how can I remove a package?", "font size" / "size of the
    font"), and so is any other reordering: the cache served those before, and a miss
    costs a whole answer."""
    p, q = _shared_order(a, b), _shared_order(b, a)
    if p == q:
        return False
    start = next(i for i, (x, y) in enumerate(zip(p, q, strict=True)) if x != y)
    end = len(p) - next(i for i, (x, y) in enumerate(zip(p[::-1], q[::-1], strict=True)) if x != y)
    mid, other = p[start:end], q[start:end]
    if len(mid) > _SWAP_WORDS:
        return False
    n = len(mid)
    return any(
        other == mid[n - ly :] + mid[lx : n - ly] + mid[:lx]
        for lx in range(1, n - 1)
        for ly in range(1, n - lx)
    )


def _opposed(x: str, y: str) -> bool:
    """A pair of ``_ANTONYMS``, or one stem (3+ letters) under two different prefixes of
    ``_OPPOSING_PREFIXES``."""
    if frozenset((x, y)) in _ANTONYMS:
        return True
    stems_x = {x[len(p) :]: p for p in _OPPOSING_PREFIXES if x.startswith(p)}
    for p in _OPPOSING_PREFIXES:
        if y.startswith(p):
            stem = y[len(p) :]
            if len(stem) >= 3 and stem in stems_x and stems_x[stem] != p:
                return True
    return False


def unit(vector: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """``vector`` scaled to length 1 (a zero vector stays zero)."""
    v = np.asarray(vector, dtype=np.float32).reshape(-1)
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


# float32 cosines of unit vectors are off by up to a few 1e-7: a threshold is met within it.
SIMILARITY_ROUNDING = 1e-6


class SemanticCache:
    """Bounded, thread-safe, version-scoped nearest-question cache."""

    def __init__(
        self, threshold: float, max_entries: int, ttl_seconds: float | None = None
    ) -> None:
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.threshold = threshold
        self.max_entries = max_entries
        self.ttl_seconds = ttl_seconds
        self.version: str | None = None
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next = 0
        self._lock = threading.Lock()
        # Every entry's unit vector is a row of one matrix (grown as the cache fills), so a
        # lookup is one product; a free row is zero (cosine 0, below any threshold).
        self._vectors = np.zeros((0, 0), np.float32)
        self._used = np.zeros(0, np.int64)  # per row: when its entry was stored or last served
        self._clock = 0
        self._slot_keys: list[int | None] = []  # the entry in each row
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self._entries)

    def _expired(self, entry: _Entry, now: float) -> bool:
        return self.ttl_seconds is not None and now - entry.stored_at > self.ttl_seconds

    def _follow(self, version: str | None) -> None:
        """Empty the cache when the index version it was filled from is not ``version``."""
        if version != self.version:
            self._empty()
            self.version = version

    def _empty(self) -> None:
        self._entries.clear()
        self._vectors[:] = 0
        self._slot_keys = [None] * len(self._vectors)
        self._free = list(range(len(self._vectors) - 1, -1, -1))

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _grow(self, rows: int) -> None:
        """Room for ``rows`` entries (doubled as it fills, up to ``max_entries``)."""
        before = len(self._vectors)
        grown = np.zeros((rows, self._vectors.shape[1]), np.float32)
        grown[:before] = self._vectors
        self._vectors = grown
        self._used = np.concatenate([self._used, np.zeros(rows - before, np.int64)])
        self._slot_keys += [None] * (rows - before)
        self._free += range(rows - 1, before - 1, -1)

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self._vectors[entry.slot] = 0
        self._slot_keys[entry.slot] = None
        self._free.append(entry.slot)

    def get(
        self,
        vector: npt.NDArray[np.float32],
        scope: str,
        version: str | None,
        text: str | None = None,
        exact: bool = False,
    ) -> CacheHit | None:
        """The closest entry of ``scope`` at or above the threshold whose question does not
        conflict with ``text`` (``meaning_conflict``), or None (a miss). ``exact``: only an
        entry whose question is ``text`` itself (the embedder did not read all of it, so
        its vector does not stand for all of it); so too for an entry stored so."""
        query = unit(vector)
        now = time.monotonic()
        with self._lock:
            self._follow(version)
            if self.ttl_seconds is not None:
                for key in [k for k, e in self._entries.items() if self._expired(e, now)]:
                    self._drop(key)
            fits = self._entries and self._vectors.shape[1] == query.shape[0]
            similarities = self._vectors @ query if fits else np.empty(0, np.float32)
            # Closest first (of equals, the least recently used, as an LRU scan would find
            # it), among those at or above the threshold (less float32 rounding: an exact
            # repeat is a hit at 1.0); the question guard (a few regexes, ~10 us) runs only
            # on those, not on every entry.
            above = np.flatnonzero(similarities >= self.threshold - SIMILARITY_ROUNDING)
            for at in above[np.lexsort((self._used[above], -similarities[above]))]:
                held = self._slot_keys[int(at)]
                if held is None:
                    continue
                entry = self._entries[held]
                if entry.scope != scope:
                    continue
                if (exact or not entry.whole) and entry.query != text:
                    continue
                if text is not None and meaning_conflict(text, entry.query) is not None:
                    continue
                self._entries.move_to_end(held)
                self._used[at] = self._tick()
                self.hits += 1
                best = float(similarities[at])
                return CacheHit(entry.value, min(best, 1.0), entry.query, now - entry.stored_at)
            self.misses += 1
            return None

    def put(
        self,
        vector: npt.NDArray[np.float32],
        scope: str,
        version: str | None,
        query: str,
        value: Any,
        whole: bool = True,
    ) -> None:
        """Store ``value`` for ``query``; dropped when the index moved on meanwhile.
        ``whole``: the embedder read all of ``query`` (else its vector stands for its
        opening only, and only the same text is served it)."""
        with self._lock:
            if version != self.version:  # computed on a version the cache has left
                return
            v = unit(vector)
            if self._vectors.shape[1] != v.shape[0]:  # the first put (or another embedder)
                self._vectors = np.zeros((min(self.max_entries, 64), v.shape[0]), np.float32)
                self._used = np.zeros(len(self._vectors), np.int64)
                self._empty()
            if not self._free and len(self._vectors) < self.max_entries:
                self._grow(min(self.max_entries, 2 * len(self._vectors)))
            if not self._free:  # full: the least recently used goes
                self._drop(next(iter(self._entries)))
            slot = self._free.pop()
            self._vectors[slot] = v
            self._used[slot] = self._tick()
            self._slot_keys[slot] = self._next
            self._entries[self._next] = _Entry(slot, scope, query, value, time.monotonic(), whole)
            self._next += 1

    def clear(self, version: str | None = None) -> None:
        """Drop every entry and follow ``version`` from now on."""
        with self._lock:
            self._empty()
            self.version = version
