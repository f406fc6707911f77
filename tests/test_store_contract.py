"""One contract, two backends: Qdrant Edge and qdrant-client (local mode).

Every test runs against both; they must behave the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ragpipe.config import StoreConfig
from ragpipe.errors import ConfigError
from ragpipe.store import VectorStore, Where, open_store
from tests.support.points import DIM, _vector, make_points


def _config(backend: str, tmp_path: Path) -> StoreConfig:
    return StoreConfig(
        backend=backend,  # type: ignore[arg-type]
        path=tmp_path / "store",
        batch_size=3,
        scroll_page=4,  # smaller than the store: the scroll must paginate
    )


@pytest.fixture(params=["edge", "qdrant"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[VectorStore]:
    opened = open_store(_config(request.param, tmp_path), "test-embedder", DIM)
    assert opened is not None
    yield opened
    opened.close()


def test_upsert_count_and_idempotent_reupsert(store: VectorStore) -> None:
    points = make_points()
    store.upsert(points)
    assert store.count() == 9
    store.upsert(points)  # same ids: replaced, not duplicated
    assert store.count() == 9
    assert {h.point_id for h in store.scroll()} == {p.point_id for p in points}


def test_file_versions_scroll_paginates_and_counts(store: VectorStore) -> None:
    store.upsert(make_points("s1", "f1"))
    store.upsert(make_points("s2", "f1", {"a.md": ["alpha new text"]}))
    versions = store.file_versions()
    assert set(versions) == {"a.md", "b.md", "dir/c.md"}
    a = versions["a.md"]
    assert (a[("s1", "f1")].points, a[("s1", "f1")].chunk_total) == (3, 3)
    assert (a[("s2", "f1")].points, a[("s2", "f1")].chunk_total) == (1, 1)
    assert versions["dir/c.md"][("s1", "f1")].points == 4
    assert all(v.complete for file in versions.values() for v in file.values())


def test_delete_by_file_and_all_but_one_version(store: VectorStore) -> None:
    store.upsert(make_points("s1", "f1"))
    store.upsert(make_points("s2", "f1", {"a.md": ["alpha new text"]}))
    stale = Where(
        must={"file_path": "a.md"}, must_not_all={"source_sha": "s2", "config_fingerprint": "f1"}
    )
    assert store.delete(stale) == 3
    assert store.count(Where(must={"file_path": "a.md"})) == 1
    assert store.delete(stale) == 0
    assert store.delete(Where(must={"file_path": "b.md"})) == 2
    assert store.count() == 5
    assert store.count(Where(must={"file_path": ["a.md", "dir/c.md"]})) == 5


def test_dense_query_ranks_by_cosine(store: VectorStore) -> None:
    points = make_points()
    store.upsert(points)
    target = points[4]
    hits = store.query_dense(target.dense, limit=3)
    assert hits[0].point_id == target.point_id
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    expected = sorted(points, key=lambda p: -float(p.dense @ target.dense))[:3]
    assert [h.point_id for h in hits] == [p.point_id for p in expected]
    assert hits[0].payload["text"] == target.payload["text"]


def test_dense_query_reads_only_the_payload_fields_asked_for(store: VectorStore) -> None:
    points = make_points()
    store.upsert(points)
    target = points[2]
    full = store.query_dense(target.dense, limit=4)
    some = store.query_dense(target.dense, limit=4, fields=["file_path", "chunk_index"])
    bare = store.query_dense(target.dense, limit=4, fields=[])
    for hits in (some, bare):  # the same ranking (local mode's float sums vary in the 7th place)
        assert [h.point_id for h in hits] == [h.point_id for h in full]
        assert [h.score for h in hits] == pytest.approx([h.score for h in full], abs=1e-6)
    assert "text" in full[0].payload
    for hit, whole in zip(some, full, strict=True):
        assert hit.payload == {k: whole.payload[k] for k in ("file_path", "chunk_index")}
    assert all(h.payload == {} for h in bare)


def test_sparse_query_finds_the_words(store: VectorStore) -> None:
    store.upsert(make_points())
    hits = store.query_sparse("aircraft wings", limit=5)
    assert hits[0].payload["text"] == "beta wings carry the aircraft"
    assert all("wings" in h.payload["text"] or "aircraft" in h.payload["text"] for h in hits)
    assert store.query_sparse("zebra", limit=5) == []


def test_sparse_query_without_payloads_then_payloads_by_id(store: VectorStore) -> None:
    points = make_points()
    store.upsert(points)
    full = store.query_sparse("aircraft wings", limit=5)
    bare = store.query_sparse("aircraft wings", limit=5, payload=False)
    assert [(h.point_id, h.score) for h in bare] == [(h.point_id, h.score) for h in full]
    assert all(h.payload == {} for h in bare)
    by_id = {p.point_id: p.payload for p in points}
    gone = "00000000-0000-0000-0000-00000000dead"
    fetched = store.payloads([bare[0].point_id, gone, bare[-1].point_id])
    assert set(fetched) == {bare[0].point_id, bare[-1].point_id}  # the unknown id left out
    for point_id, payload in fetched.items():
        assert payload["text"] == by_id[point_id]["text"]
        assert payload == full[[h.point_id for h in full].index(point_id)].payload
    assert store.payloads([]) == {}


def test_filters_restrict_every_query_kind(store: VectorStore) -> None:
    points = make_points()
    store.upsert(points)
    only_c = Where(must={"file_path": "dir/c.md"})
    assert {h.payload["file_path"] for h in store.query_dense(points[0].dense, 10, only_c)} == {
        "dir/c.md"
    }
    assert store.query_sparse("alpha apples", 10, only_c) == []
    hybrid = store.query_hybrid(points[0].dense, "alpha apples", 10, 10, only_c)
    assert hybrid and {h.payload["file_path"] for h in hybrid} == {"dir/c.md"}


def test_hybrid_is_rrf_of_the_two_legs(store: VectorStore) -> None:
    points = make_points()
    store.upsert(points)
    query_vector = _vector(1000)
    text = "gamma statistics aircraft"
    dense = store.query_dense(query_vector, 20)
    sparse = store.query_sparse(text, 20)
    fused: dict[str, float] = {}
    for leg in (dense, sparse):
        for rank, hit in enumerate(leg, start=1):  # classic RRF, k = 60, ranks from 1
            fused[hit.point_id] = fused.get(hit.point_id, 0.0) + 1.0 / (60 + rank)
    hybrid = store.query_hybrid(query_vector, text, limit=5, prefetch=20)
    assert len(hybrid) == 5
    for hit in hybrid:
        assert hit.score == pytest.approx(fused[hit.point_id], rel=1e-5)
    assert [h.score for h in hybrid] == sorted((h.score for h in hybrid), reverse=True)
    # the fused top 5 (ties may come in either order, so compare the scores)
    assert [h.score for h in hybrid] == pytest.approx(sorted(fused.values(), reverse=True)[:5])


@pytest.mark.parametrize("backend", ["edge", "qdrant"])
def test_reopen_with_another_embedder_or_dimension_is_refused(backend: str, tmp_path: Path) -> None:
    config = _config(backend, tmp_path)
    first = open_store(config, "model-a", DIM)
    assert first is not None
    first.upsert(make_points())
    first.close()
    with pytest.raises(ConfigError, match="dimension 8 \\(configured: 16\\)"):
        open_store(config, "model-a", 16)
    with pytest.raises(ConfigError, match="embedder 'model-a' \\(configured: 'model-b'\\)"):
        open_store(config, "model-b", None)
    again = open_store(config, "model-a", None)  # same model, read-only open
    assert again is not None and again.count() == 9
    again.close()


@pytest.mark.parametrize("backend", ["edge", "qdrant"])
def test_open_without_dimension_does_not_create(backend: str, tmp_path: Path) -> None:
    assert open_store(_config(backend, tmp_path), "model-a", None) is None


def test_edge_store_gains_the_chunk_index_index_at_its_next_write(tmp_path: Path) -> None:
    import qdrant_edge as qe

    from ragpipe.store import EdgeStore

    config = _config("edge", tmp_path)
    store = open_store(config, "test-embedder", DIM)
    assert isinstance(store, EdgeStore)
    assert "chunk_index" in store._shard.info().payload_schema  # new stores have it
    # A store built before the index existed: drop it, as an old shard would lack it.
    store._shard.update(qe.UpdateOperation.delete_field_index("chunk_index"))
    store.close()
    reopened = open_store(config, "test-embedder", DIM)
    assert isinstance(reopened, EdgeStore)
    assert "chunk_index" not in reopened._shard.info().payload_schema  # reading adds nothing
    reopened.upsert(make_points()[:1])
    assert "chunk_index" in reopened._shard.info().payload_schema
    lead = reopened.query_dense(_vector(1), 5, Where(must={"chunk_index": 0}))
    assert [h.payload["chunk_index"] for h in lead] == [0]
    reopened.close()


def test_a_store_urls_credentials_are_never_shown() -> None:
    """The location /healthz shows (no token), logs and errors carried "user:pass@"."""
    from ragpipe.store.qdrant import without_credentials

    assert without_credentials("https://me:s3cret@qdrant.example:6333") == (
        "https://***@qdrant.example:6333"
    )
    assert without_credentials("http://token@[::1]:6333/x") == "http://***@[::1]:6333/x"
    assert without_credentials("http://qdrant:6333") == "http://qdrant:6333"
