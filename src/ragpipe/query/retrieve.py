"""The query side: candidates from the store, fusion, rerank, diversity, filters.

One ``Retriever`` per run holds the open store, the embedder and, when asked
for, the cross-encoder, the client-side BM25 index and the LLM. Every knob is
a field of ``RetrieveConfig`` so the eval flows can replay a golden set
through exactly this stack with other settings.

Order of work for one query::

    query cut to the embedder's window
    query + its sentences ─┬─ dense (HyDE-adjusted vector, cosine floor, blended with the
                           │        cosine of the chunk's document lead: doc_weight)
                           ├─ sparse (BM25 in Qdrant, or rank-bm25 here)
                           └─ hybrid = convex / DBSF / RRF of both legs (in Qdrant or here)
    best score per chunk over the searches → quoted-phrase boost → rerank
    (cross-encoder over top_k × candidate_mul) → MMR → top_k → LLM filter

Scores are comparable only within one stage; each hit keeps every stage's
score in ``scores`` so reports can show where a chunk rose or fell.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ragpipe.config import (
    LLM_RERANKER,
    HydeMode,
    RagpipeConfig,
    RetrievalMode,
    RetrieveConfig,
    SparseEngine,
)
from ragpipe.errors import ConfigError
from ragpipe.models.embedders import (
    Embedder,
    embedder_name,
    make_embedder,
    normalise,
    reads_whole,
)
from ragpipe.query.fusion import (
    boost_exact,
    exact_phrases,
    fuse,
    mmr_select,
)
from ragpipe.query.lexical import _WORD, ClientBM25
from ragpipe.query.llm_rerank import LLMReranker
from ragpipe.query.rerank import Reranker
from ragpipe.query.results import RetrievalResult, Retrieved, ranked
from ragpipe.store import Hit, VectorStore, Where, require_reader
from ragpipe.store.published import describe

logger = logging.getLogger(__name__)


if TYPE_CHECKING:
    from ragpipe.models.llm import LLM


MIN_FRAGMENT_WORDS = 3


# Characters of query text kept per token of the embedder's window: word-pieces
# average about 4 characters in English; 6 leaves room, so only a query far past
# the window is cut (the model would truncate it anyway).
QUERY_CHARS_PER_TOKEN = 6


QUERY_CACHE_SIZE = 4096

# What blending a dense hit with its document's lead (retrieve.doc_weight) reads of it.
LEAD_FIELDS = ("doc_id", "chunk_index")


# -- pure pieces (tested on their own) -----------------------------------------------


def split_fragments(query: str, max_fragments: int = 8) -> list[str]:
    """The query's sentences worth searching on their own, or ``[]`` for a single sentence.

    Splits only at sentence ends (nupunkt, the chunker's sentence splitter), so
    ``__init__.py``, ``e.g.``, ``Dr.`` and ``5.0`` never cut a query. Fragments
    under three words are dropped, duplicates (case-insensitive) kept once, and
    at most ``max_fragments`` are returned: the longest, in query order.
    """
    import nupunkt

    seen: set[str] = set()
    parts: list[str] = []
    for start, end in nupunkt.sent_spans(query):
        part = " ".join(query[start:end].split())
        if len(_WORD.findall(part)) < MIN_FRAGMENT_WORDS or part.lower() in seen:
            continue
        seen.add(part.lower())
        parts.append(part)
    if len(parts) < 2:
        return []
    keep = set(sorted(range(len(parts)), key=lambda i: (-len(parts[i]), i))[:max_fragments])
    return [p for i, p in enumerate(parts) if i in keep]


def cut_query(query: str, max_chars: int) -> str:
    """The query cut at a word boundary to at most ``max_chars`` characters."""
    if len(query) <= max_chars:
        return query
    cut = query[:max_chars]
    space = cut.rfind(" ")
    return cut[:space] if space > max_chars // 2 else cut


# Up to this many times the cut's length, the embedder's tokenizer is asked whether it reads
# the query whole (a pasted config's indentation or long words: fewer tokens than characters
# / 6), and such a query is not cut; past it the tokenizer's work is not worth it.
WHOLE_CHECK_FACTOR = 8


def searched_query(embedder: Embedder, query: str) -> str:
    """What a query's vector is made of: ``query``, or its opening cut at a word boundary
    where it is far past the embedder's window (``QUERY_CHARS_PER_TOKEN``), unless the
    embedder reads it whole: a 1,848-character question after an indented config is 238
    tokens, and was cut before its question (the search, and the cache, read another)."""
    max_chars = embedder.max_tokens * QUERY_CHARS_PER_TOKEN
    if len(query) <= max_chars:
        return query
    if len(query) <= max_chars * WHOLE_CHECK_FACTOR and reads_whole(embedder, query):
        return query
    return cut_query(query, max_chars)


def embeds_whole(embedder: Embedder, query: str) -> bool:
    """Whether ``query``'s vector reads all of it: not cut, and within the window."""
    return searched_query(embedder, query) == query and reads_whole(embedder, query)


HYDE_TEMPLATES = [
    "Write a short passage from technical documentation that answers the question.\n"
    "Question: {query}\nPassage:",
    "Write the answer to this FAQ entry in two or three sentences.\nQ: {query}\nA:",
    "Write the paragraph of a user manual that explains this.\nTopic: {query}\nParagraph:",
]


FILTER_PROMPT = """Rate how useful each numbered passage is for answering the question.
Reply with JSON only: {{"scores": [s1, s2, ...]}}, one number from 0 (useless) to 1 (answers it)
per passage, in passage order.

Question: {query}

{passages}"""


# -- the retriever -------------------------------------------------------------------

_RERANKERS_LOCK = threading.Lock()


def candidate_pool(cfg: RetrieveConfig) -> int:
    """The candidates a search reranks, diversifies and boosts: top_k x candidate_mul with a
    reranker or MMR, else top_k. Set by the settings, never by how many results are asked
    for (``Retriever.search(depth=...)``)."""
    rerank = cfg.rerank and cfg.reranker.lower() != "none"
    return cfg.top_k * cfg.candidate_mul if (rerank or cfg.mmr) else cfg.top_k


def leg_size(cfg: RetrieveConfig) -> int:
    """The candidates each leg (dense, BM25) gives a hybrid or dense search: ``prefetch``,
    or the pool when larger. A search never ranks past them (BM25 alone is not fused, and
    ranks as deep as asked)."""
    return max(cfg.prefetch, candidate_pool(cfg))


class Retriever:
    """Runs queries against the index with one configuration (overridable per call)."""

    def __init__(
        self,
        config: RagpipeConfig,
        embedder: Embedder | None = None,
        store: VectorStore | None = None,
        llm: LLM | None = None,
        rerankers: dict[str, Reranker | LLMReranker] | None = None,
        store_lock: threading.Lock | None = None,
    ) -> None:
        self.config = config
        # A server's searches of one open store run one at a time, each under this lock;
        # a search lets it go while an LLM works (``_without_store``).
        self._store_lock = store_lock
        self.embedder = embedder or make_embedder(config.embed, query_side=True)
        if store is None:
            store = require_reader(config.store, embedder_name(config.embed))
        self.store = store
        self._llm = llm
        self._bm25: ClientBM25 | None = None
        # Shared with the retriever a server opens on the next index version.
        self.rerankers: dict[str, Reranker | LLMReranker] = (
            rerankers if rerankers is not None else {}
        )
        self._files: tuple[str, list[str]] | None = None
        # Evals and tuning replay the same queries under many settings: embed each once.
        self._query_vectors: dict[str, npt.NDArray[np.float32]] = {}

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Retriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # state of the store: the client BM25 index and the file list follow it
    def _state(self) -> str:
        generation = getattr(self.store, "generation", None)
        return generation if generation is not None else f"count:{self.store.count()}"

    @property
    def index_version(self) -> dict[str, Any]:
        """The published version this retriever reads ({} when not a published copy)."""
        return describe(getattr(self.store, "version", None))

    @property
    def llm(self) -> LLM:
        if self._llm is None:
            from ragpipe.models.llm import LazyLLM

            self._llm = LazyLLM(self.config.llm)
        return self._llm

    def query_vector(
        self, query: str, overrides: dict[str, Any] | None = None, fragments: bool = False
    ) -> npt.NDArray[np.float32]:
        """The embedding ``search`` uses for ``query`` (cut to the embedder's window), cached;
        with ``fragments``, those of the sentences ``search(query, **overrides)`` also
        searches are cached first. A server embeds a query's texts here, side by side with
        other requests, and holds its store's lock only for the searches."""
        searched = searched_query(self.embedder, query.strip())
        vector = self._embed_query(searched)
        cfg = self._retrieve_config(overrides or {}) if fragments else None
        if cfg is not None and cfg.split_fragments:
            for fragment in split_fragments(searched, cfg.max_fragments):
                self._embed_query(fragment)
        return vector

    def _retrieve_config(self, overrides: dict[str, Any]) -> RetrieveConfig:
        if not overrides:
            return self.config.retrieve
        return RetrieveConfig.model_validate({**self.config.retrieve.model_dump(), **overrides})

    def _embed_query(self, text: str) -> npt.NDArray[np.float32]:
        vector = self._query_vectors.get(text)
        if vector is None:
            if len(self._query_vectors) >= QUERY_CACHE_SIZE:
                # The oldest goes, not the lot: a query's texts embedded just now stay
                # (another search thread may have changed the dict first: then it did).
                with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                    del self._query_vectors[next(iter(self._query_vectors))]
            vector = self._query_vectors[text] = self.embedder.embed_query(text)
        return vector

    def reranker(self, name: str) -> Reranker | LLMReranker:
        """The cross-encoder ``name``, or for ``llm`` the configured LLM as a yes/no judge
        (its scores cached in the work dir)."""
        with _RERANKERS_LOCK:  # a server's search threads share the dict: load each once
            if name not in self.rerankers:
                if name == LLM_RERANKER:
                    cache = self.config.paths.work_dir / "llm_rerank.sqlite"
                    self.rerankers[name] = LLMReranker(self.llm, cache)
                else:
                    self.rerankers[name] = Reranker(name)
            return self.rerankers[name]

    def stored_files(self) -> list[str]:
        state = self._state()
        if self._files is None or self._files[0] != state:
            files = sorted(
                {str(h.payload.get("file_path")) for h in self.store.scroll(fields=["file_path"])}
            )
            self._files = (state, files)
        return self._files[1]

    def where(self, cfg: RetrieveConfig) -> Where | None:
        """The payload filter of the config (file suffix resolved to stored paths)."""
        must: dict[str, Any] = {}
        if cfg.filter_file:
            suffix = cfg.filter_file.lstrip("/")
            files = [f for f in self.stored_files() if f == suffix or f.endswith("/" + suffix)]
            must["file_path"] = files or ["\x00no file matches " + suffix]
        if cfg.filter_heading:
            must["heading_path"] = cfg.filter_heading
        if cfg.filter_source_sha:
            must["source_sha"] = cfg.filter_source_sha
        return Where(must=must) if must else None

    def search(self, query: str, *, depth: int | None = None, **overrides: Any) -> RetrievalResult:
        """Ranked chunks for ``query``; keyword arguments override ``retrieve.*`` fields.

        ``depth``: how many chunks to return (default ``top_k``), ranked as the first
        ``top_k`` of this configuration's search are: a search's pools (the reranked, MMR
        and exact-phrase candidates) follow from its settings, never from how many results
        are asked for, and what lies beyond them follows in retrieval order. So the first 5
        of a ``depth=10`` search are exactly what a search for ``top_k: 5`` returns, and an
        eval's @5 scores that list (a deeper search used to rerank, diversify and boost a
        larger pool, and rank other chunks first).

        With a ``store_lock``, the search holds it but for its LLM steps (HyDE's passages,
        an LLM rerank, the LLM filter).
        """
        if self._store_lock is None:
            return self._search(query, depth, overrides)
        with self._store_lock:
            return self._search(query, depth, overrides)

    @contextlib.contextmanager
    def _without_store(self) -> Iterator[None]:
        """Around a search's LLM step, which takes seconds to minutes on a CPU: the store's
        lock is let go meanwhile, so that a server's other searches use the store (a plain
        search waited out a whole LLM rerank: 9.7 s instead of 8 ms)."""
        if self._store_lock is None:
            yield
            return
        self._store_lock.release()
        try:
            yield
        finally:
            self._store_lock.acquire()

    def _search(self, query: str, depth: int | None, overrides: dict[str, Any]) -> RetrievalResult:
        cfg = self._retrieve_config(overrides)
        started = time.perf_counter()
        query = query.strip()
        if not query:
            raise ConfigError("the query is empty")
        try:
            query.encode("utf-8")
        except UnicodeEncodeError as exc:  # bytes that were no UTF-8, as lone surrogates
            raise ConfigError(
                f"the query is not valid text: {query[max(exc.start - 10, 0) : exc.end + 10]!r} "
                "holds bytes that are not UTF-8 (a terminal in another encoding?)"
            ) from exc
        if depth is not None and depth < 1:
            raise ConfigError(f"depth must be at least 1, not {depth}")
        rerank = cfg.rerank and cfg.reranker.lower() != "none"
        final_k = depth or cfg.top_k
        pool = candidate_pool(cfg)
        # The legs follow from the settings too: deeper legs fuse (and blend) otherwise.
        legs = leg_size(cfg)
        trace: dict[str, Any] = {
            "mode": cfg.mode.value,
            "sparse_engine": cfg.sparse_engine.value,
            "fusion_method": cfg.fusion_method.value,
            "fusion": (
                ("qdrant" if cfg.fuse_in_engine else "client")
                if cfg.mode == RetrievalMode.HYBRID
                else "none"
            ),
            "top_k": cfg.top_k,
            **({"depth": final_k} if final_k != cfg.top_k else {}),
            "reranker": cfg.reranker if rerank else "none",
            "mmr": cfg.mmr,
            "hyde": cfg.hyde.value,
            "index_version": self.index_version.get("generation"),
        }
        searched = searched_query(self.embedder, query)
        if searched != query:
            trace["query_cut"] = {"chars": len(query), "kept": len(searched)}
            logger.info(
                "query of %d characters cut to %d (the embedder reads %d tokens)",
                len(query),
                len(searched),
                self.embedder.max_tokens,
            )
        where = self.where(cfg)
        fragments = split_fragments(searched, cfg.max_fragments) if cfg.split_fragments else []
        trace["fragments"] = fragments
        best: dict[str, Retrieved] = {}
        query_vector = self._embed_query(searched)
        vectors = [query_vector, *(self._embed_query(f) for f in fragments)]
        for text, vector in zip([searched, *fragments], vectors, strict=True):
            if cfg.mode != RetrievalMode.SPARSE and cfg.hyde != HydeMode.OFF:
                vector = self._hyde(text, vector, cfg, where, trace)
            if cfg.mode != RetrievalMode.SPARSE and cfg.prf:
                vector = self._prf(vector, cfg, where, trace)
            for hit in self._candidates(text, vector, max(pool, final_k), legs, cfg, where):
                kept = best.get(hit.point_id)
                if kept is None or hit.score > kept.score:
                    best[hit.point_id] = hit
        hits = ranked(best.values())
        phrases = exact_phrases(query, cfg.boost_proper_nouns)
        trace["exact_phrases"] = phrases
        # Deeper than the pool (an eval's depth): the rest follow in retrieval order.
        hits = boost_exact(hits[:pool], phrases, cfg.boost_exact) + hits[pool:final_k]
        for hit in hits:
            hit.scores["retrieval"] = hit.score
        if rerank:
            judged = min(cfg.rerank_depth or pool, pool)  # the rest follow in retrieval order
            hits = self._rerank(query, hits[:judged], cfg.reranker, trace) + hits[judged:]
        if cfg.mmr:
            candidates = hits[:pool]
            stored = self.store.dense_vectors([h.point_id for h in candidates])
            wanted = min(max(final_k, cfg.top_k), pool)  # what the LLM filter may judge
            picked = mmr_select(query_vector, candidates, stored, wanted, cfg.mmr_lambda)
            hits = picked + hits[pool:]
        if cfg.llm_filter and hits:
            # The prompt a search for top_k sends, and no deeper ranks: the filter's cut is
            # what this configuration returns, at any depth.
            hits = self._llm_filter(query, hits[: cfg.top_k], cfg.llm_filter_threshold, trace)
        hits = hits[:final_k]
        if cfg.mode == RetrievalMode.HYBRID:  # hits that came through BM25 alone, too
            unscored = [h for h in hits if not {"chunk_cosine", "dense"} & h.scores.keys()]
            if unscored:
                self._own_cosines(query_vector, unscored)
        trace["seconds"] = time.perf_counter() - started
        return RetrievalResult(query, hits, trace)

    def _own_cosines(self, query_vector: npt.NDArray[np.float32], hits: list[Retrieved]) -> None:
        """Each hit's own cosine (``chunk_cosine``), which the engine's fusion does not return
        and a hit found by BM25 alone has not: the relevance floor reads it
        (``generate.best_relevance``); without it an ask fused in Qdrant, or one whose hits
        all came from BM25 (a min_dense_score that emptied the dense leg), was never
        floored. One vector fetch for the few hits kept."""
        stored = self.store.dense_vectors([h.point_id for h in hits])
        query = query_vector / (np.linalg.norm(query_vector) or 1.0)
        for hit in hits:
            vector = stored.get(hit.point_id)
            if vector is not None:
                norm = float(np.linalg.norm(vector)) or 1.0
                hit.scores["chunk_cosine"] = float(np.dot(vector, query)) / norm

    def _candidates(
        self,
        text: str,
        vector: npt.NDArray[np.float32],
        n: int,
        legs: int,
        cfg: RetrieveConfig,
        where: Where | None,
    ) -> list[Retrieved]:
        """The first ``n`` fused candidates of legs of ``legs`` each (fewer when the legs hold
        fewer: a search never ranks past its legs, so that a deeper one ranks alike)."""
        if cfg.mode == RetrievalMode.DENSE:
            return self._with_payloads(ranked(self._dense(vector, legs, cfg, where))[:n])
        if cfg.mode == RetrievalMode.SPARSE:
            return [self._as(h, "sparse") for h in self._sparse(text, n, cfg, where)]
        if cfg.fuse_in_engine:
            method = cfg.fusion_method.value
            fused = self.store.query_hybrid(
                vector,
                text,
                n,
                legs,
                where,
                cfg.rrf_k,
                dense_floor=cfg.min_dense_score,
                method=method,
            )
            return ranked(self._as(h, method) for h in fused)
        dense = self._dense(vector, legs, cfg, where)
        # Both legs without payloads: fusion needs ids and scores only, and the payloads
        # of the few kept hits are fetched below.
        sparse = [
            self._as(h, "sparse") for h in self._sparse(text, legs, cfg, where, payload=False)
        ]
        fused_hits = fuse([dense, sparse], cfg)[:n]
        for hit in fused_hits:
            hit.scores[cfg.fusion_method.value] = hit.score
        return self._with_payloads(fused_hits)

    def _with_payloads(self, hits: list[Retrieved]) -> list[Retrieved]:
        """Fill in the payloads the hits came without; a point deleted meanwhile (a
        server collection written to while it is read) is dropped."""
        missing = [h.point_id for h in hits if not h.payload]
        if not missing:
            return hits
        found = self.store.payloads(missing)
        for hit in hits:
            if not hit.payload:
                hit.payload = found.get(hit.point_id, {})
        return [h for h in hits if h.payload]

    @staticmethod
    def _as(hit: Hit, stage: str) -> Retrieved:
        return Retrieved(hit.point_id, hit.score, hit.payload, {stage: hit.score})

    def _dense(
        self, vector: npt.NDArray[np.float32], n: int, cfg: RetrieveConfig, where: Where | None
    ) -> list[Retrieved]:
        """The dense leg's ``n`` candidates, ids and scores only (empty payloads: fetch the
        kept ones with ``_with_payloads``). Reading 40 whole payloads took 0.5 ms of a
        0.6 ms query (sample index), and the engine holds the GIL while it reads them."""
        blend = cfg.doc_weight > 0
        hits = self.store.query_dense(vector, n, where, fields=list(LEAD_FIELDS) if blend else [])
        if cfg.min_dense_score is not None:  # cosine, before any fusion
            hits = [h for h in hits if h.score >= cfg.min_dense_score]
        out = [self._as(h, "dense") for h in hits]
        if blend and out:
            out = self._with_document(vector, out, cfg.doc_weight)
        for hit in out:
            hit.payload = {}
        return out

    def _with_document(
        self, vector: npt.NDArray[np.float32], hits: list[Retrieved], weight: float
    ) -> list[Retrieved]:
        """Each hit's cosine blended with its document lead's: (1 - w) x own + w x lead.

        The lead is the document's first chunk (its title and opening), which
        says what the whole document is about. Leads among the hits are scored
        already; one filtered query scores the others. A hit whose lead is not
        in the index keeps its own cosine.
        """
        # A lead among the candidates needs no query: its cosine is its own score.
        lead_score = {
            str(h.payload.get("doc_id")): h.score for h in hits if h.payload.get("chunk_index") == 0
        }
        docs = sorted({str(h.payload.get("doc_id")) for h in hits} - set(lead_score))
        if docs:
            # At most one lead per document: score exactly those, with the full vectors
            # (no index to miss one, no int8 pass; 0.54 vs 0.65 ms at 100k int8 chunks).
            leads = self.store.query_dense(
                vector,
                len(docs),
                Where(must={"doc_id": docs, "chunk_index": 0}),
                exact=True,
                fields=["doc_id"],
            )
            lead_score.update((str(h.payload.get("doc_id")), h.score) for h in leads)
        for hit in hits:
            lead = lead_score.get(str(hit.payload.get("doc_id")), hit.score)
            hit.scores.update(chunk_cosine=hit.score, doc=lead)
            hit.score = (1 - weight) * hit.score + weight * lead
            hit.scores["dense"] = hit.score
        return ranked(hits)

    def _sparse(
        self, text: str, n: int, cfg: RetrieveConfig, where: Where | None, payload: bool = True
    ) -> list[Hit]:
        if cfg.sparse_engine == SparseEngine.RANK_BM25:
            if self._bm25 is None:
                self._bm25 = ClientBM25(self.store, self._state)
            return self._bm25.query(text, n, where)
        return self.store.query_sparse(text, n, where, payload=payload)

    def _rerank(
        self, query: str, hits: list[Retrieved], model: str, trace: dict[str, Any]
    ) -> list[Retrieved]:
        reranker = self.reranker(model)
        # The chunk's context window (sentence-window chunks) when it has one.
        texts = [str(h.payload.get("context") or h.text) for h in hits]
        if isinstance(reranker, LLMReranker):  # seconds a query on a CPU: say what it cost
            with self._without_store():
                scores, cost = reranker.score_with_cost(query, texts)
            trace["llm_rerank"] = {"model": reranker.llm.name, **cost.as_dict()}
        else:
            scores = reranker.score(query, texts)
        for hit, score in zip(hits, scores, strict=True):
            hit.scores["rerank"] = score
            hit.score = score
        # Equal rerank scores (a verdict of yes or no where no log-probabilities came
        # back) keep the retrieval order.
        return sorted(hits, key=lambda h: (-h.score, -h.scores["retrieval"], h.point_id))

    def _hyde(
        self,
        query: str,
        vector: npt.NDArray[np.float32],
        cfg: RetrieveConfig,
        where: Where | None,
        trace: dict[str, Any],
    ) -> npt.NDArray[np.float32]:
        """The query vector moved towards hypothetical answers written by the LLM."""
        if cfg.hyde == HydeMode.ADAPTIVE:
            top = self.store.query_dense(vector, 1, where)
            top_score = top[0].score if top else -1.0
            trace.setdefault("hyde_top1", []).append(top_score)
            if top_score >= cfg.hyde_threshold:
                return vector
        templates = HYDE_TEMPLATES if cfg.hyde == HydeMode.MULTI else HYDE_TEMPLATES[:1]
        n = 1 if cfg.hyde == HydeMode.MULTI else cfg.hyde_n
        documents = []
        with self._without_store():
            for template in templates:
                for i in range(n):
                    reply = self.llm.chat(
                        [{"role": "user", "content": template.format(query=query)}],
                        temperature=0.7 if n > 1 else None,
                        seed=self.config.llm.seed + i,
                    )
                    if reply.text.strip():
                        documents.append(reply.text.strip())
            doc_vectors = self.embedder.embed_documents(documents) if documents else None
        trace.setdefault("hyde_documents", []).extend(documents)
        if doc_vectors is None:
            return vector
        stacked = normalise(np.vstack([vector[None, :], doc_vectors]))
        moved: npt.NDArray[np.float32] = normalise(stacked.mean(axis=0, keepdims=True))[0]
        return moved

    def _prf(
        self,
        vector: npt.NDArray[np.float32],
        cfg: RetrieveConfig,
        where: Where | None,
        trace: dict[str, Any],
    ) -> npt.NDArray[np.float32]:
        """Rocchio on dense vectors: ``(1 - w) * q + w * mean(top-k stored vectors)``,
        normalised (arXiv 2108.11044: feedback helps when the query keeps most weight)."""
        top = self.store.query_dense(vector, cfg.prf_k, where)
        if cfg.min_dense_score is not None:  # no feedback from hits below the floor
            top = [h for h in top if h.score >= cfg.min_dense_score]
        stored = self.store.dense_vectors([h.point_id for h in top])
        feedback = [stored[h.point_id] for h in top if h.point_id in stored]
        trace.setdefault("prf_feedback", []).append([h.point_id for h in top])
        if not feedback:
            return vector
        centroid = np.mean(normalise(np.vstack(feedback)), axis=0)
        moved = (1 - cfg.prf_weight) * vector + cfg.prf_weight * centroid
        result: npt.NDArray[np.float32] = normalise(moved[None, :])[0]
        return result

    def _llm_filter(
        self, query: str, hits: list[Retrieved], threshold: float, trace: dict[str, Any]
    ) -> list[Retrieved]:
        passages = "\n\n".join(f"[{i}] {h.text}" for i, h in enumerate(hits, start=1))
        schema = {
            "type": "object",
            "properties": {
                "scores": {
                    "type": "array",
                    "items": {"type": "number", "minimum": 0, "maximum": 1},
                    "minItems": len(hits),
                    "maxItems": len(hits),
                }
            },
            "required": ["scores"],
        }
        prompt = FILTER_PROMPT.format(query=query, passages=passages)
        with self._without_store():
            reply = self.llm.chat([{"role": "user", "content": prompt}], schema=schema)
        scores = parse_filter_scores(reply.text, len(hits))
        if scores is None:
            trace["llm_filter"] = {"status": "malformed", "output": reply.text[:500]}
            logger.warning("LLM chunk filter: malformed output, keeping all %d chunks", len(hits))
            return hits
        for hit, score in zip(hits, scores, strict=True):
            hit.scores["llm_filter"] = score
        kept = [h for h, s in zip(hits, scores, strict=True) if s >= threshold]
        if not kept:  # never zero chunks: keep the one the LLM liked best
            kept = [hits[int(np.argmax(scores))]]
        trace["llm_filter"] = {"status": "ok", "kept": len(kept), "of": len(hits)}
        return kept


def parse_filter_scores(text: str, n: int) -> list[float] | None:
    """The chunk filter's scores, or None when the output is not n numbers in [0, 1]."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        match = re.search(r"\{.*\}", text, re.S)
        if match is None:
            return None
        try:
            data = json.loads(match.group(0))
        except json.JSONDecodeError:
            return None
    scores = data.get("scores") if isinstance(data, dict) else data
    if not isinstance(scores, list) or len(scores) != n:
        return None
    if not all(isinstance(s, int | float) and not isinstance(s, bool) for s in scores):
        return None
    values = [float(s) for s in scores]
    return values if all(0.0 <= s <= 1.0 for s in values) else None
