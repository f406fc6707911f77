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

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape, quoteattr

import numpy as np
import numpy.typing as npt

from ragpipe.config import (
    FusionMethod,
    HydeMode,
    RagpipeConfig,
    RetrievalMode,
    RetrieveConfig,
    SparseEngine,
)
from ragpipe.embed import Embedder, embedder_name, make_embedder, normalise
from ragpipe.errors import ConfigError, StageError
from ragpipe.published import describe
from ragpipe.store import Hit, VectorStore, Where, open_reader

if TYPE_CHECKING:
    from ragpipe.llm import LLM

logger = logging.getLogger(__name__)

MIN_FRAGMENT_WORDS = 3
# Characters of query text kept per token of the embedder's window: word-pieces
# average about 4 characters in English; 6 leaves room, so only a query far past
# the window is cut (the model would truncate it anyway).
QUERY_CHARS_PER_TOKEN = 6
QUERY_CACHE_SIZE = 4096
_QUOTED = re.compile(r"\"([^\"]{2,})\"|“([^”]{2,})”")
_PROPER_NOUN = re.compile(r"\b[A-Z][\w'’-]*(?:\s+(?:of\s+|de\s+|von\s+)?[A-Z][\w'’-]*)+")
_WORD = re.compile(r"\w+", re.UNICODE)
# Characters XML 1.0 does not allow at all (not even escaped): C0 controls but tab, LF and
# CR, lone surrogates, U+FFFE and U+FFFF.
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
# What a terminal acts on instead of printing: C0 controls (ESC starts colour, cursor and
# title sequences) but tab and newline, DEL, and the C1 controls (0x9b is a one-byte CSI).
_TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@dataclass
class Retrieved:
    """One chunk in a result list, with the score of every stage it passed."""

    point_id: str
    score: float
    payload: dict[str, Any]
    scores: dict[str, float] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return str(self.payload.get("text", ""))

    @property
    def file_path(self) -> str:
        return str(self.payload.get("file_path", ""))

    @property
    def heading(self) -> str:
        return " > ".join(self.payload.get("heading_path") or [])

    @property
    def page(self) -> int | None:
        page = self.payload.get("page")
        return int(page) if page is not None else None


@dataclass
class RetrievalResult:
    """Ranked chunks plus what the retriever did to get them."""

    query: str
    hits: list[Retrieved]
    trace: dict[str, Any] = field(default_factory=dict)


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


def ranked(hits: Iterable[Retrieved]) -> list[Retrieved]:
    """Best first; ties broken by point id so every run gives the same order."""
    return sorted(hits, key=lambda h: (-h.score, h.point_id))


Leg = Sequence[Hit | Retrieved]


def _fuse(legs: Sequence[Leg], leg_scores: Sequence[dict[str, float]]) -> list[Retrieved]:
    """Sum each point's per-leg scores; the stage scores a leg carried are kept."""
    fused: dict[str, Retrieved] = {}
    for leg, scores in zip(legs, leg_scores, strict=True):
        for hit in leg:
            entry = fused.setdefault(hit.point_id, Retrieved(hit.point_id, 0.0, hit.payload))
            entry.score += scores[hit.point_id]
            if isinstance(hit, Retrieved):
                entry.scores.update(hit.scores)
    return ranked(fused.values())


def rrf_fuse(
    legs: Sequence[Leg], k: int = 60, weights: Sequence[float] | None = None
) -> list[Retrieved]:
    """Reciprocal Rank Fusion: score = Σ weight / (k + rank), ranks from 1.

    Each leg must be ordered best first. Ties are broken by point id.
    """
    weights = list(weights) if weights is not None else [1.0] * len(legs)
    scores = [
        {h.point_id: w / (k + rank) for rank, h in enumerate(leg, start=1)}
        for leg, w in zip(legs, weights, strict=True)
    ]
    return _fuse(legs, scores)


def dbsf_normalise(scores: Sequence[float]) -> list[float]:
    """Qdrant's DBSF mapping: (s - (μ - 3σ)) / 6σ with the sample σ; 0.5 for one or equal scores."""
    if len(scores) < 2:
        return [0.5] * len(scores)
    values = np.asarray(scores, dtype=np.float64)
    sigma = float(values.std(ddof=1))
    if sigma == 0:
        return [0.5] * len(scores)
    low = float(values.mean()) - 3 * sigma
    return [float(v) for v in (values - low) / (6 * sigma)]


def dbsf_fuse(legs: Sequence[Leg], weights: Sequence[float] | None = None) -> list[Retrieved]:
    """Distribution-based score fusion: Σ weight x DBSF-normalised score over the legs.

    With equal weights of 1 this is exactly Qdrant's ``Fusion.DBSF``.
    """
    weights = list(weights) if weights is not None else [1.0] * len(legs)
    scores = [
        {
            h.point_id: w * n
            for h, n in zip(leg, dbsf_normalise([h.score for h in leg]), strict=True)
        }
        for leg, w in zip(legs, weights, strict=True)
    ]
    return _fuse(legs, scores)


def minmax_normalise(scores: Sequence[float]) -> list[float]:
    """(s - min) / (max - min) over the leg's candidates; 1.0 when they are all equal."""
    if not scores:
        return []
    low, high = min(scores), max(scores)
    if high == low:
        return [1.0] * len(scores)
    return [(s - low) / (high - low) for s in scores]


def convex_fuse(legs: Sequence[Leg], weights: Sequence[float]) -> list[Retrieved]:
    """Convex combination Σ weight x min-max-normalised score (weights summing to 1).

    A point missing from a leg scores 0 there: no better than that leg's
    weakest candidate. Unlike RRF the score gaps inside each leg survive.
    """
    scores = [
        {
            h.point_id: w * n
            for h, n in zip(leg, minmax_normalise([h.score for h in leg]), strict=True)
        }
        for leg, w in zip(legs, weights, strict=True)
    ]
    return _fuse(legs, scores)


def fuse(legs: Sequence[Leg], cfg: RetrieveConfig) -> list[Retrieved]:
    """The dense and sparse legs (in that order) fused by ``cfg.fusion_method``."""
    if cfg.fusion_method == FusionMethod.CONVEX:
        return convex_fuse(legs, [cfg.alpha, 1 - cfg.alpha])
    weights = [cfg.dense_weight, cfg.sparse_weight]
    if cfg.fusion_method == FusionMethod.DBSF:
        return dbsf_fuse(legs, weights)
    return rrf_fuse(legs, cfg.rrf_k, weights)


def exact_phrases(query: str, proper_nouns: bool = False) -> list[str]:
    """Quoted phrases, and with ``proper_nouns`` multi-word names ("Ada Lovelace"), to match."""
    phrases = [a or b for a, b in _QUOTED.findall(query)]
    if proper_nouns:
        unquoted = _QUOTED.sub(" ", query)
        phrases += [m.group(0) for m in _PROPER_NOUN.finditer(unquoted)]
    unique: dict[str, str] = {}
    for phrase in phrases:
        unique.setdefault(phrase.lower(), phrase)
    return list(unique.values())


def boost_exact(hits: list[Retrieved], phrases: Sequence[str], boost: float) -> list[Retrieved]:
    """Raise a hit's score by ``boost`` (a share of it) per phrase its text contains."""
    if not phrases or boost <= 0:
        return hits
    lowered = [p.lower() for p in phrases]
    for hit in hits:
        text = hit.text.lower()
        matched = sum(1 for p in lowered if p in text)
        if matched:
            hit.scores["exact_matches"] = matched
            hit.score *= 1 + boost * matched
    return ranked(hits)


def mmr_select(
    query_vector: npt.NDArray[np.float32],
    hits: Sequence[Retrieved],
    vectors: dict[str, npt.NDArray[np.float32]],
    k: int,
    lam: float,
) -> list[Retrieved]:
    """Maximal Marginal Relevance on cosine similarities.

    Picks, one at a time, the hit maximising
    ``lam * sim(query, d) - (1 - lam) * max(sim(d, picked))``; ties go to the
    earlier hit. Hits without a stored vector keep their place at the end.
    """
    with_vec = [h for h in hits if h.point_id in vectors]
    without = [h for h in hits if h.point_id not in vectors]
    if not with_vec:
        return list(hits[:k])
    matrix = normalise(np.stack([vectors[h.point_id] for h in with_vec]))
    relevance = matrix @ normalise(query_vector[None, :])[0]
    picked: list[int] = []
    redundancy = np.full(len(with_vec), -np.inf)
    while len(picked) < min(k, len(with_vec)):
        penalty = np.where(np.isinf(redundancy), 0.0, redundancy)
        value = lam * relevance - (1 - lam) * penalty
        value[picked] = -np.inf
        best = int(np.argmax(value))
        picked.append(best)
        similarity = matrix @ matrix[best]
        redundancy = np.maximum(np.where(np.isinf(redundancy), -1.0, redundancy), similarity)
    out = []
    for i in picked:
        hit = with_vec[i]
        hit.scores["mmr_relevance"] = float(relevance[i])
        out.append(hit)
    return (out + without)[:k]


def lost_in_the_middle(hits: Sequence[Retrieved]) -> list[Retrieved]:
    """Best first, second best last, the weakest in the middle."""
    front = list(hits[0::2])
    back = list(hits[1::2])
    return front + back[::-1]


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


class Reranker:
    """A sentence-transformers CrossEncoder from a local directory or the HF cache."""

    def __init__(self, model: str) -> None:
        from sentence_transformers import CrossEncoder

        local = Path(model).expanduser()
        try:
            if local.exists():
                self._model = CrossEncoder(str(local), device="cpu")
            else:
                self._model = CrossEncoder(model, device="cpu", local_files_only=True)
        except Exception as exc:
            raise ConfigError(
                f"retrieve.reranker: cannot load the cross-encoder {model!r} ({exc}). Nothing is "
                "downloaded at run time: fetch the model on a machine with hub access (e.g. "
                "`huggingface-cli download cross-encoder/ms-marco-MiniLM-L6-v2`) and set "
                "retrieve.reranker to its directory, or set retrieve.rerank: false (or "
                "retrieve.reranker: none) to run without reranking."
            ) from exc
        self.name = model

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        scores = self._model.predict([(query, t) for t in texts], show_progress_bar=False)
        return [float(s) for s in np.asarray(scores).reshape(len(texts), -1)[:, 0]]


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


class Retriever:
    """Runs queries against the index with one configuration (overridable per call)."""

    def __init__(
        self,
        config: RagpipeConfig,
        embedder: Embedder | None = None,
        store: VectorStore | None = None,
        llm: LLM | None = None,
    ) -> None:
        self.config = config
        self.embedder = embedder or make_embedder(config.embed)
        if store is None:
            store = open_reader(config.store, embedder_name(config.embed))
            if store is None:
                where = config.store.url or config.store.path
                raise StageError(
                    f"no index at {where}: run `ragpipe ingest` first (or point store.path / "
                    "store.url at an existing index)"
                )
        self.store = store
        self._llm = llm
        self._bm25: ClientBM25 | None = None
        self._rerankers: dict[str, Reranker] = {}
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
            from ragpipe.llm import make_llm

            self._llm = make_llm(self.config.llm)
        return self._llm

    def _embed_query(self, text: str) -> npt.NDArray[np.float32]:
        vector = self._query_vectors.get(text)
        if vector is None:
            if len(self._query_vectors) >= QUERY_CACHE_SIZE:
                self._query_vectors.clear()
            vector = self._query_vectors[text] = self.embedder.embed_query(text)
        return vector

    def reranker(self, name: str) -> Reranker:
        if name not in self._rerankers:
            self._rerankers[name] = Reranker(name)
        return self._rerankers[name]

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

    def search(self, query: str, **overrides: Any) -> RetrievalResult:
        """Ranked chunks for ``query``; keyword arguments override ``retrieve.*`` fields."""
        cfg = (
            RetrieveConfig.model_validate({**self.config.retrieve.model_dump(), **overrides})
            if overrides
            else self.config.retrieve
        )
        started = time.perf_counter()
        query = query.strip()
        if not query:
            raise ConfigError("the query is empty")
        rerank = cfg.rerank and cfg.reranker.lower() != "none"
        final_k = cfg.top_k
        pool = cfg.top_k * cfg.candidate_mul if (rerank or cfg.mmr) else cfg.top_k
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
            "reranker": cfg.reranker if rerank else "none",
            "mmr": cfg.mmr,
            "hyde": cfg.hyde.value,
            "index_version": self.index_version.get("generation"),
        }
        max_chars = self.embedder.max_tokens * QUERY_CHARS_PER_TOKEN
        searched = cut_query(query, max_chars)
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
            for hit in self._candidates(text, vector, pool, cfg, where):
                kept = best.get(hit.point_id)
                if kept is None or hit.score > kept.score:
                    best[hit.point_id] = hit
        hits = ranked(best.values())
        phrases = exact_phrases(query, cfg.boost_proper_nouns)
        trace["exact_phrases"] = phrases
        hits = boost_exact(hits, phrases, cfg.boost_exact)[:pool]
        for hit in hits:
            hit.scores["retrieval"] = hit.score
        if rerank:
            hits = self._rerank(query, hits, cfg.reranker)
        if cfg.mmr:
            stored = self.store.dense_vectors([h.point_id for h in hits])
            hits = mmr_select(query_vector, hits, stored, final_k, cfg.mmr_lambda)
        hits = hits[:final_k]
        if cfg.llm_filter and hits:
            hits = self._llm_filter(query, hits, cfg.llm_filter_threshold, trace)
        trace["seconds"] = time.perf_counter() - started
        return RetrievalResult(query, hits, trace)

    def _candidates(
        self,
        text: str,
        vector: npt.NDArray[np.float32],
        n: int,
        cfg: RetrieveConfig,
        where: Where | None,
    ) -> list[Retrieved]:
        legs = max(cfg.prefetch, n)
        if cfg.mode == RetrievalMode.DENSE:
            return ranked(self._dense(vector, legs, cfg, where))[:n]
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
        sparse = [self._as(h, "sparse") for h in self._sparse(text, legs, cfg, where)]
        fused_hits = fuse([dense, sparse], cfg)
        for hit in fused_hits:
            hit.scores[cfg.fusion_method.value] = hit.score
        return fused_hits[:n]

    @staticmethod
    def _as(hit: Hit, stage: str) -> Retrieved:
        return Retrieved(hit.point_id, hit.score, hit.payload, {stage: hit.score})

    def _dense(
        self, vector: npt.NDArray[np.float32], n: int, cfg: RetrieveConfig, where: Where | None
    ) -> list[Retrieved]:
        hits = self.store.query_dense(vector, n, where)
        if cfg.min_dense_score is not None:  # cosine, before any fusion
            hits = [h for h in hits if h.score >= cfg.min_dense_score]
        out = [self._as(h, "dense") for h in hits]
        if cfg.doc_weight > 0 and out:
            out = self._with_document(vector, out, cfg.doc_weight)
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
            leads = self.store.query_dense(
                vector, len(docs), Where(must={"doc_id": docs, "chunk_index": 0})
            )
            lead_score.update((str(h.payload.get("doc_id")), h.score) for h in leads)
        for hit in hits:
            lead = lead_score.get(str(hit.payload.get("doc_id")), hit.score)
            hit.scores.update(chunk_cosine=hit.score, doc=lead)
            hit.score = (1 - weight) * hit.score + weight * lead
            hit.scores["dense"] = hit.score
        return ranked(hits)

    def _sparse(self, text: str, n: int, cfg: RetrieveConfig, where: Where | None) -> list[Hit]:
        if cfg.sparse_engine == SparseEngine.RANK_BM25:
            if self._bm25 is None:
                self._bm25 = ClientBM25(self.store, self._state)
            return self._bm25.query(text, n, where)
        return self.store.query_sparse(text, n, where)

    def _rerank(self, query: str, hits: list[Retrieved], model: str) -> list[Retrieved]:
        reranker = self.reranker(model)
        # The chunk's context window (sentence-window chunks) when it has one.
        texts = [str(h.payload.get("context") or h.text) for h in hits]
        for hit, score in zip(hits, reranker.score(query, texts), strict=True):
            hit.scores["rerank"] = score
            hit.score = score
        return ranked(hits)

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
        for template in templates:
            for i in range(n):
                reply = self.llm.chat(
                    [{"role": "user", "content": template.format(query=query)}],
                    temperature=0.7 if n > 1 else None,
                    seed=self.config.llm.seed + i,
                )
                if reply.text.strip():
                    documents.append(reply.text.strip())
        trace.setdefault("hyde_documents", []).extend(documents)
        if not documents:
            return vector
        doc_vectors = self.embedder.embed_documents(documents)
        stacked = normalise(np.vstack([vector[None, :], doc_vectors]))
        moved: npt.NDArray[np.float32] = normalise(stacked.mean(axis=0, keepdims=True))[0]
        return moved

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


# -- output formats ------------------------------------------------------------------


def to_json(result: RetrievalResult) -> str:
    hits = [
        {
            "rank": i,
            "point_id": h.point_id,
            "score": h.score,
            "scores": h.scores,
            "file_path": h.file_path,
            "page": h.page,
            "heading": h.heading,
            "text": h.text,
        }
        for i, h in enumerate(result.hits, start=1)
    ]
    return json.dumps({"query": result.query, "hits": hits, "trace": result.trace}, indent=2)


def xml_safe(text: str) -> str:
    """``text`` without the characters XML 1.0 forbids (escaping cannot make them legal)."""
    return _XML_INVALID.sub("", text)


def terminal_safe(text: str) -> str:
    """``text`` without control characters a terminal would act on (escape sequences)."""
    return _TERMINAL_CONTROL.sub("", text)


def to_xml(result: RetrievalResult) -> str:
    """A ``<retrieved_context>`` block for prompts: well-formed for any stored text.

    Every value is escaped; characters XML forbids outright (most C0 controls)
    are dropped.
    """

    def attr(value: str) -> str:
        return quoteattr(xml_safe(value))

    lines = ["<retrieved_context>"]
    for i, h in enumerate(result.hits, start=1):
        attrs = f"id={attr(str(i))} file={attr(h.file_path)}"
        if h.page is not None:
            attrs += f" page={attr(str(h.page))}"
        if h.heading:
            attrs += f" heading={attr(h.heading)}"
        attrs += f" score={attr(f'{h.score:.6g}')}"
        lines.append(f"<source {attrs}>{escape(xml_safe(h.text))}</source>")
    lines.append("</retrieved_context>")
    return "\n".join(lines)


def to_text(result: RetrievalResult, width: int = 300) -> str:
    """Readable lines for a terminal; document text never carries control sequences."""
    lines = []
    for i, h in enumerate(result.hits, start=1):
        where = h.file_path + (f" p.{h.page}" if h.page is not None else "")
        stages = " ".join(f"{k}={v:.4g}" for k, v in h.scores.items())
        head = f"{i}. {where}  [{h.heading or '-'}]  score={h.score:.4g}  ({stages})"
        lines.append(terminal_safe(head))
        snippet = " ".join(terminal_safe(h.text).split())
        lines.append("   " + (snippet[:width] + ("…" if len(snippet) > width else "")))
    return "\n".join(lines) if lines else "(no results)"


def result_dict(result: RetrievalResult) -> dict[str, Any]:
    return {"query": result.query, "hits": [asdict(h) for h in result.hits], "trace": result.trace}
