"""The index a long-running server reads, switched to each new published version.

Qdrant Edge: the server opens a private copy of the current published version
(``ragpipe.store.published``), so the nightly ingest never waits for it. A
poller looks at the ``CURRENT`` pointer every ``serve.reload_seconds``; when an
ingest has published a new version it opens that one beside the old, then
switches. A request holds the version it started on until it ends, and the old
copy is closed (and removed) when its last request is done: no restart, and
no request fails because of a switch.

A qdrant server serves readers and writers at once, so there is nothing to
switch; the version the cache follows is the collection's point count, which
misses an edit that keeps the count (hence ``serve.cache_ttl_seconds``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ragpipe.config import LLMConfig, RagpipeConfig, StoreBackend
from ragpipe.errors import StageError
from ragpipe.models.embedders import Embedder, embedder_name, make_embedder
from ragpipe.query.retrieve import Retriever
from ragpipe.store import open_reader, published

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ragpipe.models.llm import LLM, Completion, Message

logger = logging.getLogger(__name__)

# The longest wait before a version that failed to open is copied and tried again.
RETRY_MAX_S = 300.0


class SerialLLM:
    """One model for every request and version: loaded on first use, one call at a time
    (llama.cpp runs one generation per model; HyDE and answers share it)."""

    def __init__(self, config: LLMConfig, llm: LLM | None = None) -> None:
        from ragpipe.models.llm import LazyLLM

        self._llm: LLM = llm if llm is not None else LazyLLM(config)
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._llm.name

    @property
    def takes_grammar(self) -> bool:
        return self._llm.takes_grammar

    @property
    def identity(self) -> str:
        return str(getattr(self._llm, "identity", self._llm.name))

    @property
    def context_size(self) -> int | None:
        """The model's window, for the sources' budget (generate.source_budget)."""
        return getattr(self._llm, "context_size", None)

    @property
    def max_tokens(self) -> int | None:
        return getattr(self._llm, "max_tokens", None)

    def chat(self, messages: Sequence[Message], **options: Any) -> Completion:
        with self._lock:
            return self._llm.chat(messages, **options)

    def count_tokens(self, text: str) -> int:
        return self._llm.count_tokens(text)


@dataclass
class _Held:
    """One open version: its retriever, the requests using it, and whether it is retired."""

    retriever: Retriever
    version: str
    points: int  # counted when opened: a version does not change while it is served
    users: int = 0
    retired: bool = False
    # One search of the store at a time: the retriever's own lock, which a search lets go
    # while an LLM works (an LLM rerank held it for minutes, and every search waited).
    search: threading.Lock = field(default_factory=threading.Lock)


def _points(token: str, retriever: Retriever) -> int:
    """A version's point count: a gateless Qdrant server's token holds its count (``_probe``),
    so the two agree; other versions are counted once, when opened."""
    if token.startswith("points:"):
        return int(token.split(":")[1])
    return retriever.store.count()


class LiveIndex:
    """The current index version, its retriever, and the switch to the next version."""

    def __init__(
        self,
        config: RagpipeConfig,
        embedder: Embedder | None = None,
        llm: LLM | None = None,
        on_switch: Callable[[str, int], None] | None = None,
    ) -> None:
        self.config = config
        self.embedder = embedder or make_embedder(config.embed, query_side=True)
        self.llm = SerialLLM(config.llm, llm)
        self._on_switch = on_switch
        self._edge = config.store.backend == StoreBackend.EDGE
        self._lock = threading.Lock()
        self._current = self._open({})
        self.switches = 0
        self.last_error: str | None = None
        self.failed_version: str | None = None
        self._first_backoff = max(config.serve.reload_seconds, 1.0)
        self._backoff = self._first_backoff
        self._retry_at = 0.0
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    # -- opening a version -------------------------------------------------------------

    def _open(self, rerankers: dict[str, Any]) -> _Held:
        if self._edge and published.current(self.config.store.path) is None:
            raise StageError(
                f"no published index at {self.config.store.path}: run `ragpipe ingest` first "
                "(each ingest publishes the version readers open), or point store.path at an "
                "ingested index"
            )
        store = open_reader(self.config.store, embedder_name(self.config.embed))
        if store is None:
            where = self.config.store.url or self.config.store.path
            raise StageError(f"no index at {where}: run `ragpipe ingest` first")
        lock = threading.Lock()
        retriever = Retriever(self.config, self.embedder, store, self.llm, rerankers, lock)
        try:
            token = self._probe(retriever)
            return _Held(retriever, token, _points(token, retriever), search=lock)
        except BaseException:
            retriever.close()
            raise

    def _probe(self, retriever: Retriever | None = None) -> str:
        """The version token of what is published (Edge), live behind the alias (a Qdrant
        server with index.gate) or stored (qdrant) now."""
        if self._edge:
            if retriever is not None:
                return str(retriever.index_version.get("generation"))
            return published.current(self.config.store.path) or self._current.version
        if self.config.index.gate is not None:  # a Qdrant server's versions: the alias's
            if retriever is not None:
                return str(retriever.index_version.get("generation"))
            from ragpipe.store import server_versions

            return server_versions.current(self.config.store) or self._current.version
        if retriever is not None:
            return _stored(retriever)
        with self._current.search:  # the client is not shared between threads mid-request
            return _stored(self._current.retriever)

    # -- reading -------------------------------------------------------------------------

    @property
    def version(self) -> str:
        return self._current.version

    def describe(self) -> dict[str, Any]:
        """What /healthz reports about the version being served: read in one step with the
        switch count, and with no call to the store (a Qdrant server's count could wait on a
        search, and this is the health check)."""
        with self._lock:
            held, switches = self._current, self.switches
        info = dict(held.retriever.index_version)
        return {
            "version": held.version,
            "points": held.points,
            "published_at": info.get("published_at"),
            "files": info.get("files"),
            "store": getattr(held.retriever.store, "location", None)
            or (self.config.store.url or str(self.config.store.path)),
            "switches": switches,
            "last_reload_error": self.last_error,
            "failed_version": self.failed_version,
        }

    @contextmanager
    def reader(self) -> Iterator[tuple[Retriever, str]]:
        """The current retriever and its version, held until exit; its searches take the
        store's lock themselves (``_Held.search``)."""
        with self.holding() as held:
            yield held.retriever, held.version

    @contextmanager
    def holding(self) -> Iterator[_Held]:
        """The current version, kept open until exit. Its retriever's searches take its
        ``search`` lock themselves; the caller takes it around any other use of the store
        (an embedding needs none)."""
        with self._lock:
            held = self._current
            held.users += 1
        try:
            yield held
        finally:
            with self._lock:
                held.users -= 1
                close = held.retired and held.users == 0
            if close:
                held.retriever.close()

    # -- switching -----------------------------------------------------------------------

    def refresh(self) -> bool:
        """Switch to the version published since the last look; True when it switched."""
        token = self._probe()
        if token == self._current.version:
            return False
        started = time.perf_counter()
        # Each Edge version is its own copy, each of a Qdrant server's versions its own
        # collection: opened anew, the old one closed after its last request.
        reopen = self._edge or self.config.index.gate is not None
        if reopen:
            held = self._open(self._current.retriever.rerankers)
        else:  # the same client reads the new state: only the token moves
            held = _Held(self._current.retriever, token, _points(token, self._current.retriever),
                         search=self._current.search)  # fmt: skip
        close = False
        try:
            # One step: /healthz and /metrics never see the new version with the old count.
            # The hook must be quick and must not call back into this index (the lock is
            # not reentrant); whatever it does, the old version is closed after its last
            # request.
            with self._lock:
                old, self._current = self._current, held
                old.retired = reopen
                close = old.retired and old.users == 0
                self.switches += 1
                if self._on_switch is not None:
                    self._on_switch(held.version, held.points)
        finally:
            if close:
                old.retriever.close()
        logger.info(
            "serving index version %s (was %s; opened in %.2fs)",
            held.version[:12], old.version[:12], time.perf_counter() - started,
        )  # fmt: skip
        return True

    def start(self) -> None:
        """Look for new versions every ``serve.reload_seconds`` in a background thread."""
        if self._poller is None:
            self._poller = threading.Thread(target=self._poll, name="ragpipe-reload", daemon=True)
            self._poller.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.config.serve.reload_seconds):
            self.poll_once()

    def poll_once(self, now: float | None = None) -> None:
        """One look for a new version. A version that failed to open is tried again only
        when another is published or after a backoff (reload_seconds doubling to
        ``RETRY_MAX_S``): each try copies the whole version, and a published version does
        not change, so retrying it every few seconds only copied a broken index over and
        over. The error stays in /healthz (``last_reload_error``, ``failed_version``) until
        a version opens."""
        now = time.monotonic() if now is None else now
        try:
            token = self._probe()
        except Exception as exc:
            self._failed(None, exc, now)
            return
        if token == self._current.version:
            self.last_error = self.failed_version = None
            return
        if token == self.failed_version and now < self._retry_at:
            return
        try:
            self.refresh()
        except Exception as exc:
            if self._current.version == token:  # switched: what failed came after
                logger.exception("switched to index version %s, then:", token[:12])
                self.last_error = f"version {token}: after the switch: {exc}"
                self.failed_version = None
            else:  # keep serving the version that works
                self._failed(token, exc, now)
        else:
            self.last_error = self.failed_version = None

    def _failed(self, token: str | None, exc: Exception, now: float) -> None:
        again = token is not None and token == self.failed_version
        self._backoff = min(self._backoff * 2, RETRY_MAX_S) if again else self._first_backoff
        self._retry_at = now + self._backoff
        detail = str(exc).strip() or f"{type(exc).__name__} (no message)"
        where = f"version {token}: " if token is not None else ""
        previous = self.last_error
        self.last_error, self.failed_version = f"{where}{detail}", token
        if token is None and self.last_error == previous:
            return  # the same failure to look (a qdrant server down): said once
        logger.warning(
            "could not open the new index version (still serving %s; next try in %.0f s "
            "or when another version is published): %s",
            self._current.version[:12], self._backoff, self.last_error,
        )  # fmt: skip

    def close(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=30)
        with self._lock:
            held = self._current
            held.retired = True
            close = held.users == 0
        if close:
            held.retriever.close()


def _stored(retriever: Retriever) -> str:
    """What an ungated Qdrant collection holds: its writing session's token and point count
    (the count alone missed a re-ingest that kept it: a renamed file, an edited chunk)."""
    generation = getattr(retriever.store, "generation", None)
    if not generation:
        return f"points:{retriever.store.count()}"
    token, count = str(generation).rsplit(":", 1)
    return f"points:{count}:{token[:12]}"
