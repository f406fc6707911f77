"""Retrieval on the real engines: legs, fusion (in Qdrant and here), filters,
fragments, rerank with a real cross-encoder, MMR, floors, HyDE, the chunk filter."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Sequence
from typing import Any
from xml.etree import ElementTree

import numpy as np
import pytest

from ragpipe.config import RagpipeConfig
from ragpipe.errors import ConfigError, StageError
from ragpipe.models.llm import Completion
from ragpipe.query.fusion import (
    boost_exact,
    convex_fuse,
    dbsf_fuse,
    dbsf_normalise,
    exact_phrases,
    lost_in_the_middle,
    mmr_select,
    rrf_fuse,
)
from ragpipe.query.render import to_json, to_text, to_xml
from ragpipe.query.results import Retrieved
from ragpipe.query.retrieve import Retriever, cut_query, parse_filter_scores, split_fragments
from ragpipe.store import EMBEDDER_FIELD, Hit, IndexPoint, SparseEncoder, Where, open_store
from tests.support.points import DIM, make_points

pytestmark = pytest.mark.integration

QUERIES = [
    "How does the Calvin cycle fix carbon dioxide?",
    "Who wrote the first program for the Analytical Engine?",
    "How long should bread bake in the oven?",
    "How do I restore the database from a backup?",
    "light reactions oxygen",
]


def _hit(pid: str, score: float = 0.0) -> Hit:
    return Hit(pid, score, {"text": pid})


# -- pure pieces ----------------------------------------------------------------------


def test_fragments_split_only_at_sentence_ends() -> None:
    assert split_fragments("What is RRF? How is k chosen, and why?") == [
        "What is RRF?",
        "How is k chosen, and why?",
    ]
    assert split_fragments("one question?") == []  # a single sentence is searched whole
    # File names, abbreviations and version numbers never cut a query.
    assert split_fragments("Why does __init__.py fail on Python 3.5.0, e.g. on Debian?") == []
    assert split_fragments("Use e.g. Debian 5.0 for this. Then upgrade every package.") == [
        "Use e.g. Debian 5.0 for this.",
        "Then upgrade every package.",
    ]
    assert split_fragments("Dr. Smith wrote the FAQ. What did Dr. Smith write?") == [
        "Dr. Smith wrote the FAQ.",
        "What did Dr. Smith write?",
    ]


def test_fragments_drop_tiny_and_duplicate_sentences_and_are_capped() -> None:
    assert split_fragments("Hi. Thanks. How do I restore a backup?") == []  # one left
    assert split_fragments("How do I restore? how do I restore? Where are backups kept?") == [
        "How do I restore?",
        "Where are backups kept?",
    ]
    sentences = [f"Sentence number {i} has {'many ' * (i % 5)}words." for i in range(40)]
    capped = split_fragments(" ".join(sentences), max_fragments=8)
    assert len(capped) == 8
    assert capped == [s for s in sentences if s in capped]  # query order kept
    assert all("many many many many" in s for s in capped)  # the longest ones


def test_a_huge_query_is_cut_at_a_word_boundary() -> None:
    query = "word " * 20_000  # 100 KB
    cut = cut_query(query, 1536)
    assert len(cut) <= 1536 and cut.endswith("word") and query.startswith(cut)
    assert cut_query("short query", 1536) == "short query"


def test_rrf_is_classic_with_ranks_from_one_and_ties_broken_by_id() -> None:
    dense = [_hit("a"), _hit("b"), _hit("c")]
    sparse = [_hit("c"), _hit("a")]
    fused = rrf_fuse([dense, sparse], k=60)
    scores = {h.point_id: h.score for h in fused}
    assert scores["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert scores["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert scores["b"] == pytest.approx(1 / 62)
    assert [h.point_id for h in fused] == ["a", "c", "b"]
    tied = rrf_fuse([[_hit("z"), _hit("y")], [_hit("y"), _hit("z")]], k=60)
    assert [h.point_id for h in tied] == ["y", "z"]  # equal scores: by point id
    weighted = rrf_fuse([dense, sparse], k=60, weights=[2.0, 0.5])
    assert {h.point_id: h.score for h in weighted}["b"] == pytest.approx(2 / 62)


def test_dbsf_matches_qdrants_formula_by_hand() -> None:
    # Leg 1: scores 3, 2, 1 -> mean 2, sample sd 1 -> (s - (2 - 3)) / 6.
    dense = [_hit("a", 3.0), _hit("b", 2.0), _hit("c", 1.0)]
    # Leg 2: scores 10, 6 -> mean 8, sample sd 2*sqrt(2) -> (s - (8 - 6 sqrt 2)) / (12 sqrt 2).
    sparse = [_hit("c", 10.0), _hit("d", 6.0)]
    fused = {h.point_id: h.score for h in dbsf_fuse([dense, sparse])}
    sd = 2 * 2**0.5
    assert fused["a"] == pytest.approx(4 / 6)
    assert fused["b"] == pytest.approx(3 / 6)
    assert fused["c"] == pytest.approx(2 / 6 + (10 - (8 - 3 * sd)) / (6 * sd))
    assert fused["d"] == pytest.approx((6 - (8 - 3 * sd)) / (6 * sd))
    assert dbsf_normalise([0.7]) == [0.5] and dbsf_normalise([2.0, 2.0]) == [0.5, 0.5]
    weighted = {h.point_id: h.score for h in dbsf_fuse([dense, sparse], [2.0, 0.5])}
    assert weighted["a"] == pytest.approx(2 * 4 / 6)


def test_convex_fusion_by_hand() -> None:
    dense = [_hit("a", 0.9), _hit("b", 0.7), _hit("c", 0.5)]  # min-max: 1, 0.5, 0
    sparse = [_hit("c", 12.0), _hit("d", 4.0), _hit("a", 2.0)]  # min-max: 1, 0.2, 0
    fused = convex_fuse([dense, sparse], [0.7, 0.3])
    scores = {h.point_id: h.score for h in fused}
    assert scores == pytest.approx({"a": 0.7, "b": 0.35, "c": 0.3, "d": 0.06})
    assert [h.point_id for h in fused] == ["a", "b", "c", "d"]
    # The score gap survives: RRF would put c (ranks 3 and 1) above b (rank 2 only).
    assert [h.point_id for h in rrf_fuse([dense, sparse])][:2] == ["a", "c"]
    single = convex_fuse([[_hit("x", 0.3)], []], [0.5, 0.5])
    assert single[0].score == pytest.approx(0.5)  # the leg's only candidate is its best


def test_exact_phrases_quoted_by_default_proper_nouns_on_request() -> None:
    query = 'What did Ada Lovelace write about "Bernoulli numbers"?'
    assert exact_phrases(query) == ["Bernoulli numbers"]
    phrases = exact_phrases(query, proper_nouns=True)
    assert phrases == ["Bernoulli numbers", "Ada Lovelace"]
    hits = [
        Retrieved("1", 1.0, {"text": "nothing relevant"}),
        Retrieved("2", 0.9, {"text": "Ada Lovelace computed Bernoulli numbers"}),
    ]
    boosted = boost_exact(hits, phrases, 0.2)
    assert [h.point_id for h in boosted] == ["2", "1"]
    assert boosted[0].score == pytest.approx(0.9 * 1.4)
    # A negative cosine was multiplied, so the phrase's hit fell below the one without it.
    negative = [
        Retrieved("a", -0.02, {"text": "nothing relevant"}),
        Retrieved("b", -0.03, {"text": "the Enigma cipher"}),
    ]
    raised = boost_exact(negative, ["Enigma cipher"], 0.5)
    assert [h.point_id for h in raised] == ["b", "a"]
    assert raised[0].score == pytest.approx(-0.03 + 0.03 * 0.5)


def test_lost_in_the_middle_order() -> None:
    hits = [Retrieved(str(i), 1.0 - i / 10, {}) for i in range(5)]
    assert [h.point_id for h in lost_in_the_middle(hits)] == ["0", "2", "4", "3", "1"]


def test_mmr_picks_a_different_document_over_a_near_duplicate() -> None:
    q = np.array([1.0, 0.0, 0.0], np.float32)
    vectors = {
        "a": np.array([0.9, 0.1, 0.0], np.float32),
        "a-copy": np.array([0.9, 0.1, 0.0], np.float32),
        "b": np.array([0.6, 0.0, 0.8], np.float32),
    }
    hits = [Retrieved(p, 1.0, {}) for p in ("a", "a-copy", "b")]
    assert [h.point_id for h in mmr_select(q, hits, vectors, 2, 1.0)] == ["a", "a-copy"]
    assert [h.point_id for h in mmr_select(q, hits, vectors, 2, 0.5)] == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"scores": [0.1, 1, 0.5]}', [0.1, 1.0, 0.5]),
        ('Sure! {"scores": [0, 0, 1]}', [0.0, 0.0, 1.0]),
        ('{"scores": [0.1, 0.2]}', None),  # wrong length
        ('{"scores": [0.1, 2, 0.3]}', None),  # out of range
        ('{"scores": [true, 0, 1]}', None),
        ("no json here", None),
    ],
)
def test_filter_scores_parse_strictly(text: str, expected: list[float] | None) -> None:
    assert parse_filter_scores(text, 3) == expected


# -- against the indexed corpus -------------------------------------------------------


def _ids(result: Any) -> list[str]:
    return [h.point_id for h in result.hits]


def _tied(result: Any) -> list[set[str]]:
    """The ranking's point ids in groups of equal score (to 1e-5), best first."""
    groups: list[tuple[float, set[str]]] = []
    for hit in result.hits:
        if groups and hit.score == pytest.approx(groups[-1][0], rel=1e-5):
            groups[-1][1].add(hit.point_id)
        else:
            groups.append((hit.score, {hit.point_id}))
    return [ids for _, ids in groups]


@pytest.mark.parametrize("method", ["rrf", "dbsf"])
@pytest.mark.parametrize("backend", ["edge", "qdrant"])
def test_qdrant_fusion_and_client_fusion_rank_alike(
    backend: str, method: str, request: pytest.FixtureRequest
) -> None:
    cfg: RagpipeConfig = request.getfixturevalue(f"indexed_{backend}")
    same = {"mode": "hybrid", "fusion_method": method, "doc_weight": 0.0, "top_k": 6}
    with Retriever(cfg) as r:
        for query in QUERIES:
            inside = r.search(query, fusion="qdrant", **same)
            client = r.search(query, fusion="client", **same)
            assert inside.trace["fusion"] == "qdrant" and client.trace["fusion"] == "client"
            # Equal ranks up to exact ties: the copy of the backups file holds its Schedule
            # section word for word, and the engine orders tied points its own way.
            assert _tied(inside)[:-1] == _tied(client)[:-1], query
            assert len(_tied(inside)[-1]) == len(_tied(client)[-1]), query
            for a, b in zip(inside.hits, client.hits, strict=True):
                assert a.score == pytest.approx(b.score, rel=1e-5)
            auto = r.search(query, **same)  # auto: the engine can do it, so it does
            assert auto.trace["fusion"] == "qdrant" and _tied(auto)[:-1] == _tied(inside)[:-1]


def test_a_search_fused_in_the_engine_keeps_each_hits_own_cosine(
    indexed_edge: RagpipeConfig,
) -> None:
    """The relevance floor reads a hit's own cosine; Qdrant's fusion returns fused scores
    only, so an ask fused there was never floored (best_relevance None)."""
    from ragpipe.query.generate import best_relevance

    same = {"fusion_method": "rrf", "doc_weight": 0.0, "top_k": 5}
    with Retriever(indexed_edge) as r:
        for query in QUERIES:
            inside = r.search(query, fusion="qdrant", **same)
            assert inside.trace["fusion"] == "qdrant"
            plain = r.search(query, mode="dense", doc_weight=0.0, top_k=40)
            dense = {h.point_id: h.score for h in plain.hits}
            for hit in inside.hits:
                assert hit.scores["chunk_cosine"] == pytest.approx(dense[hit.point_id], abs=1e-5)
            best = best_relevance(inside.hits)
            assert best == pytest.approx(max(dense[h.point_id] for h in inside.hits), abs=1e-5)


def test_convex_default_fuses_here_with_the_document_signal(indexed_edge: RagpipeConfig) -> None:
    with Retriever(indexed_edge) as r:
        result = r.search(QUERIES[0], top_k=10)
        assert result.trace["fusion"] == "client" and result.trace["fusion_method"] == "convex"
        alpha = r.config.retrieve.alpha
        dense = r.search(QUERIES[0], mode="dense", top_k=40)
        sparse = r.search(QUERIES[0], mode="sparse", top_k=40)
        expected = convex_fuse(
            [[Hit(h.point_id, h.score, h.payload) for h in leg.hits] for leg in (dense, sparse)],
            [alpha, 1 - alpha],
        )
        assert _ids(result) == [h.point_id for h in expected[:10]]
        assert [h.score for h in result.hits] == pytest.approx([h.score for h in expected[:10]])
        stored = {h.point_id: h.payload for leg in (dense, sparse) for h in leg.hits}
        assert [h.payload for h in result.hits] == [stored[h.point_id] for h in result.hits]
        # The pool does not depend on top_k: a search for 5 is the first 5 of one for 10.
        assert _ids(r.search(QUERIES[0], top_k=5)) == _ids(result)[:5]


class _FixedEmbedder:
    """Every query embeds to one given vector (the store's points are hand-made)."""

    name = "test-embedder"
    max_tokens = 256

    def __init__(self, vector: np.ndarray) -> None:
        self.vector = vector
        self.dim = len(vector)

    def embed_query(self, text: str) -> np.ndarray:
        return self.vector


@pytest.mark.parametrize("backend", ["edge", "qdrant"])
def test_a_hit_only_bm25_found_gets_its_payload(backend: str, tmp_path: Any) -> None:
    # The default hybrid's legs run without payloads; a kept hit that BM25 alone found
    # gets its payload after fusion, as the store holds it.
    cfg = RagpipeConfig(store={"backend": backend, "path": tmp_path / "store"})
    store = open_store(cfg.store, "test-embedder", DIM)
    assert store is not None
    points = make_points()
    store.upsert(points)
    wings = next(p for p in points if p.payload["text"] == "beta wings carry the aircraft")
    vector = points[0].dense  # "alpha apples grow on trees"
    with Retriever(cfg, embedder=_FixedEmbedder(vector), store=store) as r:  # type: ignore[arg-type]
        dense = r.search("aircraft wings", mode="dense", top_k=2, prefetch=2)
        assert wings.point_id not in _ids(dense)
        result = r.search("aircraft wings", top_k=2, prefetch=2)
        assert result.trace["fusion_method"] == "convex"
        assert _ids(result) == [points[0].point_id, wings.point_id]
        stamp = {EMBEDDER_FIELD: "test-embedder"}  # the store adds who embedded each point
        assert [h.payload for h in result.hits] == [
            {**points[0].payload, **stamp},
            {**wings.payload, **stamp},
        ]
        assert result.hits[1].scores["sparse"] > 0 and "dense" not in result.hits[1].scores


def test_document_signal_blends_the_chunk_with_its_documents_lead(
    indexed_edge: RagpipeConfig,
) -> None:
    with Retriever(indexed_edge) as r:
        query = "What did Ada Lovelace publish?"
        plain = r.search(query, mode="dense", doc_weight=0.0, top_k=20)
        blended = r.search(query, mode="dense", doc_weight=0.4, top_k=20)
        q = r.embedder.embed_query(query)
        later = [h for h in blended.hits if h.payload["chunk_index"] > 0]
        assert later, "the corpus has documents of several chunks"
        for hit in blended.hits:
            lead = r.store.query_dense(
                q, 1, Where(must={"doc_id": hit.payload["doc_id"], "chunk_index": 0})
            )[0]
            vectors = r.store.dense_vectors([hit.point_id, lead.point_id])
            own = float(vectors[hit.point_id] @ q)
            lead_cosine = float(vectors[lead.point_id] @ q)  # the stored vector's true cosine
            assert hit.scores["chunk_cosine"] == pytest.approx(own, abs=1e-5)
            assert hit.scores["doc"] == pytest.approx(lead_cosine, abs=1e-5)
            assert hit.score == pytest.approx(0.6 * own + 0.4 * lead_cosine, abs=1e-5)
            if hit.payload["chunk_index"] == 0:
                assert hit.score == pytest.approx(own, abs=1e-5)
        assert {h.point_id for h in plain.hits} != set() and "doc" not in plain.hits[0].scores


def test_each_mode_finds_the_topic(indexed_edge: RagpipeConfig) -> None:
    expected = ["photosynthesis", "computing", "bread", "backups", "photosynthesis"]
    with Retriever(indexed_edge) as r:
        for query, topic in zip(QUERIES, expected, strict=True):
            for mode in ("dense", "sparse", "hybrid"):
                result = r.search(query, mode=mode, top_k=3)
                assert topic in result.hits[0].file_path, (query, mode, result.hits[0].file_path)
                # BM25 returns only chunks sharing a term with the query.
                assert len(result.hits) == 3 or (mode == "sparse" and result.hits)
                assert result.trace["mode"] == mode
            again = r.search(query, top_k=3)
            assert _ids(again) == _ids(r.search(query, top_k=3))  # deterministic


def test_client_bm25_leg_and_its_refresh_when_the_store_changes(
    indexed_edge: RagpipeConfig,
) -> None:
    with Retriever(indexed_edge) as r:
        before = r.search("sourdough starter", mode="sparse", sparse_engine="rank_bm25")
        assert before.hits == []  # no chunk mentions it
        hybrid = r.search(QUERIES[2], mode="hybrid", sparse_engine="rank_bm25")
        assert "bread" in hybrid.hits[0].file_path and hybrid.trace["fusion"] == "client"
        assert {"convex", "dense", "sparse"} <= set(hybrid.hits[0].scores)
        # A write to the store (as an ingest would do) must be seen by the next query.
        text = "Feed the sourdough starter with flour and water every day."
        pid = str(uuid.uuid4())
        vector = r.embedder.embed_documents([text])[0]
        indices, values = SparseEncoder().document(text)
        payload = {"text": text, "file_path": "kitchen/sourdough.md", "heading_path": []}
        r.store.upsert([IndexPoint(pid, vector, indices, values, payload)])
        after = r.search("sourdough starter", mode="sparse", sparse_engine="rank_bm25")
        assert _ids(after) == [pid]
        r.store.delete(Where(must={"file_path": "kitchen/sourdough.md"}))


def test_filters_by_file_suffix_heading_and_sha(indexed_edge: RagpipeConfig) -> None:
    with Retriever(indexed_edge) as r:
        only = r.search("database backup", filter_file="ops/backups-copy.md", top_k=10)
        assert only.hits and {h.file_path.split("/")[-1] for h in only.hits} == {"backups-copy.md"}
        by_dir = r.search("database backup", filter_file="backups.md", top_k=10)
        assert {h.file_path.split("/")[-1] for h in by_dir.hits} == {"backups.md"}
        heading = r.search("what happens", filter_heading="Oven", top_k=10)
        assert heading.hits and all("Oven" in h.payload["heading_path"] for h in heading.hits)
        sha = only.hits[0].payload["source_sha"]
        both = r.search("backup", filter_source_sha=sha, filter_heading="Schedule", top_k=10)
        assert both.hits and all(h.payload["source_sha"] == sha for h in both.hits)
        assert r.search("bread", filter_file="no/such/file.md").hits == []


def test_multi_sentence_query_keeps_each_sentences_best(indexed_edge: RagpipeConfig) -> None:
    query = "Who was Alan Turing? How do I knead dough?"
    with Retriever(indexed_edge) as r:
        combined = r.search(query, mode="dense", top_k=4)
        assert combined.trace["fragments"] == ["Who was Alan Turing?", "How do I knead dough?"]
        assert {h.file_path.split("/")[-1] for h in combined.hits} >= {"computing.md", "bread.md"}
        whole = r.search(query, mode="dense", split_fragments=False, top_k=20)
        single = r.search("Who was Alan Turing?", mode="dense", top_k=5)
        turing = next(h for h in combined.hits if "computing" in h.file_path)
        # The whole query and each sentence are searched; a chunk keeps its best score.
        by_id = {h.point_id: h.score for h in whole.hits}
        best = max(single.hits[0].score, by_id.get(turing.point_id, -1.0))
        assert turing.point_id == single.hits[0].point_id
        assert turing.score == pytest.approx(best, rel=1e-5)


def test_dense_floor_applies_to_cosine_never_to_rrf(indexed_edge: RagpipeConfig) -> None:
    with Retriever(indexed_edge) as r:
        plain = r.search(QUERIES[0], mode="dense", top_k=10)
        floor = (plain.hits[0].score + plain.hits[-1].score) / 2
        floored = r.search(QUERIES[0], mode="dense", top_k=10, min_dense_score=floor)
        assert 0 < len(floored.hits) < len(plain.hits)
        assert all(h.score >= floor for h in floored.hits)
        # In hybrid the floor removes weak dense candidates before fusion; the fused
        # scores (~1/61 with RRF) are far below any cosine floor and are not cut by it.
        rrf = {"fusion_method": "rrf", "doc_weight": 0.0}
        hybrid = r.search(QUERIES[0], mode="hybrid", top_k=10, min_dense_score=floor, **rrf)
        assert hybrid.hits and all(h.score < floor for h in hybrid.hits)
        for method, fusion in (("rrf", "qdrant"), ("dbsf", "qdrant"), ("convex", "client")):
            cut = r.search(
                QUERIES[0],
                mode="hybrid",
                fusion=fusion,
                fusion_method=method,
                doc_weight=0.0 if fusion == "qdrant" else 0.5,
                top_k=10,
                min_dense_score=1,
            )
            sparse = r.search(QUERIES[0], mode="sparse", top_k=10)
            assert set(_ids(cut)) == set(_ids(sparse))  # only the BM25 leg is left


def test_hybrid_hits_found_by_bm25_alone_carry_their_own_cosine(
    indexed_edge: RagpipeConfig,
) -> None:
    """Hits fused in the client that never came through the dense leg had no cosine, so
    the relevance floor was skipped: a min_dense_score that emptied the dense leg turned
    the floor off for the off-topic questions it is there for."""
    from ragpipe.query.generate import best_relevance

    with Retriever(indexed_edge) as r:
        plain = r.search(QUERIES[0], mode="dense", top_k=100, doc_weight=0.0, split_fragments=False)
        cosines = {h.point_id: h.score for h in plain.hits}
        for fusion, method, doc in (("client", "convex", 0.5), ("qdrant", "rrf", 0.0)):
            cut = r.search(QUERIES[0], mode="hybrid", fusion=fusion, fusion_method=method,
                           doc_weight=doc, top_k=5, min_dense_score=1)  # fmt: skip
            assert cut.hits and best_relevance(cut.hits) is not None
            for hit in cut.hits:
                assert hit.scores["chunk_cosine"] == pytest.approx(cosines[hit.point_id], abs=1e-5)


def test_rerank_with_a_real_cross_encoder(
    indexed_edge: RagpipeConfig, tiny_cross_encoder: Any
) -> None:
    from sentence_transformers import CrossEncoder

    with Retriever(indexed_edge) as r:
        result = r.search(QUERIES[1], rerank=True, reranker=str(tiny_cross_encoder), top_k=3)
        assert result.trace["reranker"] == str(tiny_cross_encoder)
        model = CrossEncoder(str(tiny_cross_encoder), device="cpu")
        pool = r.search(QUERIES[1], top_k=3 * 4)  # the candidates it reranked
        direct = model.predict(
            [(QUERIES[1], h.payload.get("context") or h.text) for h in pool.hits]
        )
        expected = sorted(zip(direct, _ids(pool), strict=True), key=lambda t: (-t[0], t[1]))
        assert _ids(result) == [pid for _, pid in expected[:3]]
        assert [h.scores["rerank"] for h in result.hits] == pytest.approx(
            [float(s) for s, _ in expected[:3]], rel=1e-4
        )
        # rerank_depth 2: the first two candidates judged, the rest in retrieval order.
        shallow = r.search(QUERIES[1], rerank=True, reranker=str(tiny_cross_encoder),
                           rerank_depth=2, top_k=4, candidate_mul=1)  # fmt: skip
        plain = r.search(QUERIES[1], top_k=4)
        head = sorted(zip(direct[:2], _ids(pool)[:2], strict=True), key=lambda t: (-t[0], t[1]))
        assert _ids(shallow) == [pid for _, pid in head] + _ids(plain)[2:4]
        assert "rerank" not in shallow.hits[2].scores
        off = r.search(QUERIES[1], rerank=True, reranker="none")
        assert off.trace["reranker"] == "none" and "rerank" not in off.hits[0].scores
        with pytest.raises(ConfigError, match=r"(?is)retrieve\.reranker.*nothing is downloaded"):
            r.search(QUERIES[1], rerank=True, reranker="cross-encoder/ms-marco-MiniLM-L6-v2")


def test_a_deeper_search_ranks_first_what_a_search_for_top_k_returns(
    indexed_edge: RagpipeConfig, tiny_cross_encoder: Any
) -> None:
    """An eval's depth: the first top_k of a deeper search are what the search for top_k
    returns, whatever reranks, diversifies or boosts them (their pools follow from the
    settings, not from how many results are asked for)."""
    queries = [*QUERIES, 'restore "full backup" now', 'bake "oxygen" bread and "carbon dioxide"']
    reranker = {"rerank": True, "reranker": str(tiny_cross_encoder)}
    kinds: dict[str, dict[str, Any]] = {
        "boost": {"boost_exact": 5.0},
        "rerank": reranker,
        # MMR: pools of 2 x 2 of the corpus's nine chunks (a search for 10 takes them all).
        "mmr": {"mmr": True, "mmr_lambda": 0.3, "candidate_mul": 2},
        "rerank and mmr": {**reranker, "mmr": True, "mmr_lambda": 0.3, "candidate_mul": 2},
    }
    with Retriever(indexed_edge) as r:
        for name, settings in kinds.items():
            moved = 0
            for query in queries:
                short = r.search(query, top_k=2, **settings)
                deep = r.search(query, top_k=2, depth=10, **settings)
                # All nine chunks of the corpus (a title with a section under it is none).
                assert len(short.hits) == 2 and len(deep.hits) == 9, (name, query)
                assert _ids(deep)[:2] == _ids(short), (name, query)
                assert deep.trace["depth"] == 10 and "depth" not in short.trace
                # A search for 10 results is another configuration (a larger pool).
                moved += _ids(r.search(query, top_k=10, **settings))[:2] != _ids(short)
            assert moved, f"{name}: no query where a larger pool ranks others first"
        # Deeper than the legs (prefetch 3): the legs stay as the search for top_k has them
        # (wider legs fuse, normalise and blend other scores), and no more is ranked.
        for settings in ({}, {"fusion_method": "rrf"}, {"mode": "dense"}, {"doc_weight": 0.0}):
            for query in queries:
                short = r.search(query, top_k=2, prefetch=3, **settings)
                deep = r.search(query, top_k=2, prefetch=3, depth=10, **settings)
                assert _ids(deep)[:2] == _ids(short), (settings, query)
                assert len(deep.hits) <= (3 if settings.get("mode") == "dense" else 6)
        # Past the pool (2 x 4 = 8 reranked), the rest follow in retrieval order.
        deep = r.search(QUERIES[1], top_k=2, depth=10, **reranker)
        assert _ids(deep)[8:] == _ids(r.search(QUERIES[1], top_k=10))[8:]
        assert all("rerank" not in h.scores for h in deep.hits[8:])
        with pytest.raises(ConfigError, match="depth must be at least 1"):
            r.search(QUERIES[1], depth=0)


def test_mmr_drops_the_duplicate_file(indexed_edge: RagpipeConfig) -> None:
    query = "When do full database backups run?"
    with Retriever(indexed_edge) as r:
        plain = r.search(query, mode="dense", top_k=2)
        assert plain.hits[0].text == plain.hits[1].text  # the file and its copy
        diverse = r.search(query, mode="dense", top_k=2, mmr=True, mmr_lambda=0.5)
        assert diverse.hits[0].point_id == plain.hits[0].point_id
        assert diverse.hits[1].text != diverse.hits[0].text


def test_output_formats_round_trip(indexed_edge: RagpipeConfig) -> None:
    with Retriever(indexed_edge) as r:
        result = r.search('restore "latest full backup" <now> & then', top_k=2)
    data = json.loads(to_json(result))
    assert [h["point_id"] for h in data["hits"]] == _ids(result)
    assert data["hits"][0]["scores"]["retrieval"] == result.hits[0].score
    root = ElementTree.fromstring(to_xml(result))  # escaped: it parses
    assert root.tag == "retrieved_context"
    sources = root.findall("source")
    assert [s.text for s in sources] == [h.text for h in result.hits]
    assert sources[0].get("file") == result.hits[0].file_path


def test_missing_index_is_a_clear_error(tmp_path: Any) -> None:
    cfg = RagpipeConfig(embed={"provider": "onnx"}, store={"path": tmp_path / "none"})  # type: ignore[arg-type]
    with pytest.raises(StageError, match="run `ragpipe ingest` first"):
        Retriever(cfg)


def test_config_rejects_what_qdrant_fusion_cannot_do() -> None:
    engine = {"fusion": "qdrant", "fusion_method": "rrf", "doc_weight": 0.0}
    RagpipeConfig(retrieve=engine)  # type: ignore[arg-type]
    RagpipeConfig(retrieve={**engine, "fusion_method": "dbsf"})  # type: ignore[arg-type]
    for bad in (
        {"sparse_engine": "rank_bm25"},
        {"dense_weight": 2.0},
        {"fusion_method": "convex"},
        {"doc_weight": 0.5},
    ):
        with pytest.raises(ValueError, match=r"need retrieve\.fusion: client or auto"):
            RagpipeConfig(retrieve={**engine, **bad})  # type: ignore[arg-type]
        RagpipeConfig(retrieve={**engine, **bad, "fusion": "auto"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"prefetch_mul was replaced by retrieve\.prefetch"):
        RagpipeConfig(retrieve={"prefetch_mul": 4})  # type: ignore[arg-type]


def test_a_huge_query_is_cut_and_searched_in_bounded_work(indexed_edge: RagpipeConfig) -> None:
    sentences = [f"How do I restore backup number {i} of the database?" for i in range(2000)]
    query = " ".join(sentences)  # ~100 KB, 2,000 sentences
    with Retriever(indexed_edge) as r:
        result = r.search(query, top_k=3)
    cut = result.trace["query_cut"]
    assert cut["chars"] == len(query) and cut["kept"] <= r.embedder.max_tokens * 6
    assert 2 <= len(result.trace["fragments"]) <= 8
    assert "backups" in result.hits[0].file_path


def test_a_long_query_the_embedder_reads_whole_is_not_cut(indexed_edge: RagpipeConfig) -> None:
    """A pasted, indented config and a question after it: 1,800 characters, fewer tokens
    than the window. Cut at 6 characters a token, the question was never searched."""
    from ragpipe.models.embedders import reads_whole
    from ragpipe.query.retrieve import embeds_whole

    config = "\n".join(f"{' ' * 40}option_{i}: on" for i in range(35))
    query = f"{config}\nHow often are backups taken?"
    with Retriever(indexed_edge) as r:
        assert len(query) > r.embedder.max_tokens * 6 and reads_whole(r.embedder, query)
        result = r.search(query, top_k=3)
        assert "query_cut" not in result.trace and "backups" in result.hits[0].file_path
        assert embeds_whole(r.embedder, query)
        assert not embeds_whole(r.embedder, " ".join(["How do I restore a backup?"] * 400))


# -- with the real LLM ----------------------------------------------------------------


def test_hyde_standard_adaptive_and_multi(indexed_edge: RagpipeConfig, smollm: Any) -> None:
    with Retriever(indexed_edge, llm=smollm) as r:
        plain = r.search(QUERIES[3], mode="dense", top_k=3)
        hyde = r.search(QUERIES[3], mode="dense", top_k=3, hyde="standard", hyde_n=2)
        assert len(hyde.trace["hyde_documents"]) == 2
        assert hyde.hits[0].score != plain.hits[0].score  # another query vector
        skipped = r.search(QUERIES[3], mode="dense", hyde="adaptive", hyde_threshold=-1)
        assert "hyde_documents" not in skipped.trace and len(skipped.trace["hyde_top1"]) == 1
        forced = r.search(QUERIES[3], mode="dense", hyde="adaptive", hyde_threshold=1, hyde_n=1)
        assert len(forced.trace["hyde_documents"]) == 1
        multi = r.search(QUERIES[3], mode="dense", hyde="multi")
        assert len(multi.trace["hyde_documents"]) == 3


class ScriptedLLM:
    """Replies with fixed text: the only way to get malformed output on demand."""

    name = "scripted"
    takes_grammar = False  # a scripted reply: nothing to constrain

    def __init__(self, reply: str) -> None:
        self.reply = reply

    def chat(self, messages: Sequence[dict[str, str]], **kwargs: Any) -> Completion:
        return Completion(self.reply, 1, 1, self.name, 0.0)

    def count_tokens(self, text: str) -> int:
        return len(text) // 4


@pytest.mark.parametrize(
    ("reply", "status", "kept"),
    [
        ('{"scores": [0.9, 0.1, 0.7]}', "ok", [0, 2]),
        ('{"scores": [0.1, 0.3, 0.2]}', "ok", [1]),  # never zero chunks: the best one stays
        ("I think they are all good", "malformed", [0, 1, 2]),
    ],
)
def test_llm_filter_outcomes(
    indexed_edge: RagpipeConfig, reply: str, status: str, kept: list[int]
) -> None:
    with Retriever(indexed_edge, llm=ScriptedLLM(reply)) as r:
        plain = r.search(QUERIES[2], top_k=3)
        filtered = r.search(QUERIES[2], top_k=3, llm_filter=True)
    assert filtered.trace["llm_filter"]["status"] == status
    assert _ids(filtered) == [_ids(plain)[i] for i in kept]


def test_an_eval_of_the_llm_filter_ranks_what_the_search_returns(
    indexed_edge: RagpipeConfig,
) -> None:
    """The filter judges the first top_k (one prompt, as the search for top_k sends it),
    and nothing past them is ranked; the eval says its @10 is over those."""
    from ragpipe.evaluation.golden import GoldenItem, GoldenSet
    from ragpipe.evaluation.retrieval import Granularity, Variant, run_retrieval_eval

    with Retriever(indexed_edge, llm=ScriptedLLM('{"scores": [0.9, 0.1, 0.7]}')) as r:
        plain = r.search(QUERIES[2], top_k=3)
        deep = r.search(QUERIES[2], top_k=3, depth=10, llm_filter=True)
        assert _ids(deep) == [_ids(plain)[i] for i in (0, 2)]
        golden = GoldenSet("bread", [GoldenItem("oven", QUERIES[2], {"bread.md": 3})])
        result = run_retrieval_eval(indexed_edge, golden, [Variant("filtered", {
            "llm_filter": True, "top_k": 3})], depth=10, retriever=r,
            granularity=Granularity.FILE)  # fmt: skip
    assert len(result.rows[0].retrieved) <= 2
    assert any("llm_filter ranks at most top_k=3 chunks" in w for w in result.warnings)


def test_llm_filter_with_the_real_model(indexed_edge: RagpipeConfig, smollm: Any) -> None:
    with Retriever(indexed_edge, llm=smollm) as r:
        plain = r.search(QUERIES[2], top_k=3)
        filtered = r.search(QUERIES[2], top_k=3, llm_filter=True)
    report = filtered.trace["llm_filter"]
    assert filtered.hits and set(_ids(filtered)) <= set(_ids(plain))
    if report["status"] == "ok":  # grammar-constrained JSON: usually parses
        assert all(0 <= h.scores["llm_filter"] <= 1 for h in filtered.hits)
    else:
        assert _ids(filtered) == _ids(plain) and report["status"] == "malformed"


def test_dense_prf_moves_the_query_towards_the_top_hits_by_rocchio(
    indexed_edge: RagpipeConfig,
) -> None:
    from ragpipe.models.embedders import normalise

    with Retriever(indexed_edge) as r:
        query = QUERIES[3]
        q = r.embedder.embed_query(query)
        top = r.store.query_dense(q, 3, None)
        stored = r.store.dense_vectors([h.point_id for h in top])
        centroid = normalise(np.vstack([stored[h.point_id] for h in top])).mean(axis=0)
        moved = normalise((0.75 * q + 0.25 * centroid)[None, :])[0]  # by hand
        prefetch = indexed_edge.retrieve.prefetch  # the dense leg's depth, as search asks it
        # Scores, not ids: the corpus has chunks with equal text, whose order is a tie.
        expected = [h.score for h in r.store.query_dense(moved, prefetch, None)][:5]
        plain_cfg = {"mode": "dense", "top_k": 5, "doc_weight": 0.0, "split_fragments": False,
                     "boost_exact": 0.0}  # fmt: skip
        result = r.search(query, prf=True, prf_k=3, prf_weight=0.25, **plain_cfg)
        assert result.trace["prf_feedback"] == [[h.point_id for h in top]]
        assert [h.score for h in result.hits] == pytest.approx(expected, abs=1e-4)
        plain = r.search(query, **plain_cfg)
        assert "prf_feedback" not in plain.trace
        assert result.hits[0].score != pytest.approx(plain.hits[0].score)  # another vector


def test_llm_rerank_orders_by_the_real_models_yes_probability(
    indexed_edge: RagpipeConfig, smollm: Any, tmp_path: Any
) -> None:
    from ragpipe.query.llm_rerank import SYSTEM, USER, yes_probability

    paths = indexed_edge.paths.model_copy(update={"work_dir": tmp_path})
    config = indexed_edge.model_copy(update={"paths": paths})
    query = QUERIES[1]
    with Retriever(config, llm=smollm) as r:
        pool = r.search(query, top_k=3 * 2)  # the candidates it reranks
        result = r.search(query, rerank="llm", top_k=3, candidate_mul=2)
        # By hand: the same prompt to the same model, P(yes) / (P(yes) + P(no)).
        expected = {}
        for hit in pool.hits:
            passage = str(hit.payload.get("context") or hit.text)
            reply = smollm.chat(
                [{"role": "system", "content": SYSTEM},
                 {"role": "user", "content": USER.format(query=query, passage=passage)}],
                max_tokens=1, temperature=0.0, top_logprobs=10,
            )  # fmt: skip
            assert reply.top_logprobs  # llama.cpp sends the first token's alternatives
            expected[hit.point_id] = yes_probability(reply.top_logprobs, reply.text)[0]
        # llama.cpp's numbers move a little with what its prompt cache reuses (another
        # batch split): equal within 0.03, and the order is P(yes)'s within that (0.028
        # apart on bread.md's first chunk since its title opens it, run alone).
        tolerance = 0.03
        kept = _ids(result)
        assert [h.scores["rerank"] for h in result.hits] == pytest.approx(
            [expected[p] for p in kept], abs=tolerance
        )
        assert all(expected[a] >= expected[b] - tolerance for a, b in itertools.pairwise(kept))
        left_out = [expected[p] for p in expected if p not in kept]
        assert min(expected[p] for p in kept) >= max(left_out) - tolerance
        assert len(set(expected.values())) > 1  # the model tells the passages apart
        cost = result.trace["llm_rerank"]
        assert cost["pairs"] == 6 and cost["model_calls"] == 6 and cost["cached"] == 0
        assert cost["kinds"] == {"logprob": 6} and cost["model"] == smollm.name
        again = r.search(query, rerank="llm", top_k=3, candidate_mul=2)
        assert _ids(again) == _ids(result)
        assert again.trace["llm_rerank"]["model_calls"] == 0
        assert again.trace["llm_rerank"]["cached"] == 6
    assert (tmp_path / "llm_rerank.sqlite").is_file()
    assert "llm rerank (" in to_text(again) and "6 cached" in to_text(again)


def test_a_full_query_cache_drops_its_oldest_vectors_not_a_query_just_embedded(
    indexed_edge: RagpipeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache was emptied whole when full: the sentences a server embedded for a query
    outside the store's lock could be gone by its search, and embedded again under it."""
    from ragpipe.query import retrieve

    monkeypatch.setattr(retrieve, "QUERY_CACHE_SIZE", 4)
    query = "How long should bread bake? Which roses need pruning in early spring?"
    with Retriever(indexed_edge) as r:
        for old in ("one old query", "another old query", "a third old query"):
            r.query_vector(old)
        r.query_vector(query, fragments=True)
        assert (
            list(r._query_vectors)
            == ["a third old query", query, *retrieve.split_fragments(query)][-4:]
        )
        assert len(r._query_vectors) == 4
