"""Pointwise LLM reranking: each candidate scored by the probability that the configured
LLM answers "yes" to "does this passage answer the question?".

There is no packaged cross-encoder (none ships its weights in a package), but the
packaged generator is a language model: asked one yes/no question per passage with
a one-token reply, its probability of "yes" against "no" (read from the first
token's log-probabilities, where the runtime exposes them: llama.cpp in-process,
OpenAI-compatible servers, Ollama) is a relevance score (the pointwise recipe of
monoT5 and of the "yes"-probability rankers). A runtime that sends no
log-probabilities gives the reply's verdict instead: 1 for yes, 0 for no, 0.5 for
anything else, recorded as such.

Each score is cached on disk per (model, prompt, query, passage): ``eval tune`` and
repeated evaluations replay the same pairs, and one model call is seconds on a CPU.
The question comes before the passage in the prompt, so llama.cpp re-reads only the
passage for the second and later candidates of a query.
"""

from __future__ import annotations

import hashlib
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragpipe.models.llm import LLM

logger = logging.getLogger(__name__)

# Changing the prompt changes every score: the version is part of the cache key.
PROMPT_VERSION = "1"
SYSTEM = (
    "You judge search results. Reply with one word: yes if the passage answers the "
    "question or holds the information needed to answer it, no if it does not."
)
USER = "Question: {query}\n\nPassage:\n{passage}\n\nDoes the passage answer the question?"
TOP_LOGPROBS = 10
# A passage is cut to this many characters (~500 tokens): the judgement needs the gist,
# and every token read is CPU time.
MAX_PASSAGE_CHARS = 2000


def yes_probability(alternatives: dict[str, float] | None, text: str) -> tuple[float, str]:
    """The relevance score of one reply and how it was read.

    With the first token's alternatives: P(yes) / (P(yes) + P(no)), summing every token
    that reads "yes" or "no" once stripped and lower-cased ("Yes", " yes", "YES"), kind
    ``logprob``. When neither is among them, or there are none, the reply's own first
    word decides (kind ``verdict``: 1 for yes, 0 for no, 0.5 for anything else).
    """
    if alternatives:
        p_yes = sum(math.exp(lp) for t, lp in alternatives.items() if t.strip().lower() == "yes")
        p_no = sum(math.exp(lp) for t, lp in alternatives.items() if t.strip().lower() == "no")
        if p_yes + p_no > 0:
            return p_yes / (p_yes + p_no), "logprob"
    words = text.strip().lower().split()
    word = words[0].strip(".,!:;\"'") if words else ""
    return {"yes": 1.0, "no": 0.0}.get(word, 0.5), "verdict"


@dataclass
class RerankCost:
    """What one ``score`` call cost: pairs scored, model calls, cache hits, seconds."""

    pairs: int = 0
    model_calls: int = 0
    cached: int = 0
    seconds: float = 0.0
    kinds: dict[str, int] = field(default_factory=dict)  # logprob | verdict -> pairs

    def as_dict(self) -> dict[str, object]:
        return {
            "pairs": self.pairs,
            "model_calls": self.model_calls,
            "cached": self.cached,
            "seconds": round(self.seconds, 3),
            "kinds": dict(self.kinds),
        }


class ScoreCache:
    """Scores by key in one SQLite file, safe across threads and processes.

    The cache only saves model calls: a file that cannot be opened, read or written (a
    read-only work dir, a damaged file) turns it off with one warning, and every
    candidate asks the model.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, timeout=30)
            with self._db:
                self._db.execute(
                    "CREATE TABLE IF NOT EXISTS scores "
                    "(key TEXT PRIMARY KEY, score REAL, kind TEXT)"
                )
        except (OSError, sqlite3.Error) as exc:
            self._off(exc)

    @property
    def on(self) -> bool:
        return self._db is not None

    def _off(self, exc: Exception) -> None:
        logger.warning(
            "LLM rerank: score cache %s unusable (%s); every candidate asks the model",
            self.path,
            exc,
        )
        if self._db is not None:
            self._db.close()
        self._db = None

    def get(self, key: str) -> tuple[float, str] | None:
        with self._lock:
            if self._db is None:
                return None
            try:
                found = self._db.execute(
                    "SELECT score, kind FROM scores WHERE key = ?", (key,)
                ).fetchone()
            except sqlite3.Error as exc:
                self._off(exc)
                return None
        return (float(found[0]), str(found[1])) if found else None

    def put(self, key: str, score: float, kind: str) -> None:
        with self._lock:
            if self._db is None:
                return
            try:
                with self._db:
                    self._db.execute(
                        "INSERT OR REPLACE INTO scores VALUES (?, ?, ?)", (key, score, kind)
                    )
            except sqlite3.Error as exc:
                self._off(exc)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


class LLMReranker:
    """Scores (query, passage) pairs with an ``LLM`` (see the module's docstring)."""

    name = "llm"

    def __init__(self, llm: LLM, cache_path: Path | None) -> None:
        self.llm = llm
        self.cache = ScoreCache(cache_path) if cache_path is not None else None
        self._warned = False

    def key(self, query: str, passage: str) -> str:
        """Which model (its runtime, server and file where it has them), which prompt,
        which pair: a server alias reused for another model serves none of its scores."""
        identity = str(getattr(self.llm, "identity", self.llm.name))
        parts = (identity, PROMPT_VERSION, query, passage[:MAX_PASSAGE_CHARS])
        return hashlib.sha256("\x00".join(parts).encode("utf-8")).hexdigest()

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """P(yes) for each passage, in order."""
        return self.score_with_cost(query, texts)[0]

    def score_with_cost(self, query: str, texts: Sequence[str]) -> tuple[list[float], RerankCost]:
        """P(yes) for each passage, in order, and what it took (returned, not kept: a
        server's search threads share one reranker)."""
        started = time.perf_counter()
        cost = RerankCost(pairs=len(texts))
        scores: list[float] = []
        for text in texts:
            key = self.key(query, text)
            found = self.cache.get(key) if self.cache is not None else None
            if found is None:
                found = self._ask(query, text)
                cost.model_calls += 1
                # A verdict stays out of the cache: a runtime that sends log-probabilities
                # later scores the pair properly.
                if self.cache is not None and found[1] == "logprob":
                    self.cache.put(key, *found)
            else:
                cost.cached += 1
            scores.append(found[0])
            cost.kinds[found[1]] = cost.kinds.get(found[1], 0) + 1
            if found[1] == "verdict" and not self._warned:
                self._warned = True
                logger.warning(
                    "LLM rerank: %s sent no log-probabilities for yes/no; its scores are "
                    "verdicts (1 yes, 0 no, 0.5 neither), and equal verdicts keep the "
                    "retrieval order",
                    self.llm.name,
                )
        cost.seconds = time.perf_counter() - started
        return scores, cost

    def _ask(self, query: str, passage: str) -> tuple[float, str]:
        messages = [
            {"role": "system", "content": SYSTEM},
            {
                "role": "user",
                "content": USER.format(query=query, passage=passage[:MAX_PASSAGE_CHARS]),
            },
        ]
        reply = self.llm.chat(messages, max_tokens=1, temperature=0.0, top_logprobs=TOP_LOGPROBS)
        return yes_probability(reply.top_logprobs, reply.text)

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
