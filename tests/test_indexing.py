"""The incremental re-index end to end on the real engines (Qdrant Edge and
qdrant-client local mode), with the fast ONNX embedder: never lose a chunk,
never duplicate one."""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragpipe.config import RagpipeConfig
from ragpipe.errors import ConfigError, MassDeletionHeld
from ragpipe.ingest.pipeline import run_ingest, run_stages
from ragpipe.ingest.runner import RunStore, WorkDir
from ragpipe.ingest.summary import write_summary
from ragpipe.store import EdgeStore, QdrantStore, Where, open_reader, open_store
from ragpipe.store.base import INT8_OVERSAMPLING
from tests.support.corpora import (
    assert_versions_current,
    make_config,
    stored,
    topic_doc,
    write_topics,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_topics(tmp_path / "corpus", 5)


def by_file(points: dict[str, dict[str, Any]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for pid, payload in points.items():
        out.setdefault(payload["file_path"], set()).add(pid)
    return out


@pytest.mark.parametrize("backend", ["edge", "qdrant"])
def test_first_run_indexes_everything_and_noop_rerun_writes_nothing(
    corpus: Path, tmp_path: Path, backend: str
) -> None:
    cfg = make_config(corpus, tmp_path, backend)
    first = run_ingest(cfg)
    points = stored(cfg)
    assert (first.added, first.failed) == (5, 0)
    assert first.chunks_written == first.chunks == len(points) == first.points_total > 20
    assert all(p["chunk_total"] == len(by_file(points)[p["file_path"]]) for p in points.values())
    assert {
        "text",
        "heading_path",
        "page",
        "line_start",
        "doc_id",
        "source_sha",
        "text_sha",
        "config_fingerprint",
        "ingested_at",
        "chunk_index",
    } <= set(next(iter(points.values())))

    second = run_ingest(cfg)
    assert (second.added, second.changed, second.skipped_unchanged) == (0, 0, 5)
    assert (second.chunks_written, second.chunks_deleted) == (0, 0)
    again = stored(cfg)
    assert again == points  # same ids, same payloads: ingested_at proves nothing was rewritten
    assert second.stages["embed"]["embedded"] == 0


def test_noop_rerun_trusts_the_saved_scroll_only_while_the_store_is_unwritten(
    corpus: Path, tmp_path: Path
) -> None:
    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)
    points = stored(cfg)
    files = [p for p in cfg.store.path.rglob("*") if p.is_file()]
    mtimes = {p: p.stat().st_mtime_ns for p in files}
    noop = run_ingest(cfg)
    assert noop.skipped_unchanged == 5 and noop.points_total == len(points)
    # Opening an Edge shard touches its files: this run never opened it.
    assert {p: p.stat().st_mtime_ns for p in files} == mtimes

    # Any write through the store (another run, a repair script) invalidates the saved scroll.
    engines = next(p["file_path"] for p in points.values() if p["file_path"].endswith("engines.md"))
    store = open_store(cfg.store, "paraphrase-MiniLM-L3-v2", None)
    assert store is not None
    gone = store.delete(Where(must={"file_path": engines}))
    store.close()
    healed = run_ingest(cfg)
    assert (healed.added, healed.chunks_written) == (1, gone)
    assert stored(cfg).keys() == points.keys()

    # So does a store that was deleted and is rebuilt.
    shutil.rmtree(cfg.store.path)
    rebuilt = run_ingest(cfg)
    assert (rebuilt.added, rebuilt.points_total) == (5, len(points))


def test_saved_versions_equal_a_fresh_scroll_after_every_kind_of_run(
    corpus: Path, tmp_path: Path
) -> None:
    cfg = make_config(corpus, tmp_path)
    check = partial(assert_versions_current, cfg)
    run_ingest(cfg)  # all added
    check()
    (corpus / "engines.md").write_text(
        topic_doc("engines", version=2, sections=2), encoding="utf-8"
    )
    (corpus / "cooking.md").write_text(topic_doc("cooking"), encoding="utf-8")
    (corpus / "wings.md").unlink()
    summary = run_ingest(cfg)  # changed, added, removed
    assert (summary.changed, summary.added, summary.removed) == (1, 1, 1)
    check()
    run_ingest(make_config(corpus, tmp_path, chunk={"size": 300}))  # every file changed
    check()


@pytest.mark.parametrize("backend", ["edge", "qdrant"])
def test_one_run_opens_the_store_once_for_plan_embed_and_upsert(
    corpus: Path, tmp_path: Path, backend: str
) -> None:
    cfg = make_config(corpus, tmp_path, backend, embed={"dedupe_chunks": True})
    run_ingest(cfg)
    (corpus / "wings.md").write_text(topic_doc("wings", version=2, sections=2), encoding="utf-8")
    WorkDir.of(cfg).store_versions.unlink(missing_ok=True)  # the plan scrolls the store
    with RunStore(cfg) as store:
        stages = run_stages(cfg, store=store)
        # Plan scrolled it, embed read its text hashes, upsert wrote: one open. (An Edge
        # store is open once at a time, so a stage opening its own would have failed.)
        assert store.opened == 1
    summary = write_summary(cfg, stages)
    assert (summary.changed, summary.skipped_unchanged) == (1, 4)
    assert summary.chunks_written > 0 and summary.points_total == len(stored(cfg))
    if backend == "edge":
        assert_versions_current(cfg)


def test_point_ids_are_deterministic_across_stores(corpus: Path, tmp_path: Path) -> None:
    edge = make_config(corpus, tmp_path, "edge")
    qdrant = make_config(corpus, tmp_path, "qdrant")
    run_ingest(edge)
    run_ingest(qdrant)
    assert set(stored(edge)) == set(stored(qdrant))


def test_changed_file_gets_new_points_and_loses_its_old_ones(corpus: Path, tmp_path: Path) -> None:
    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)
    before = by_file(stored(cfg))
    (corpus / "wings.md").write_text(topic_doc("wings", version=2, sections=2), encoding="utf-8")
    summary = run_ingest(cfg)
    after_points = stored(cfg)
    after = by_file(after_points)
    changed = next(k for k in after if k.endswith("wings.md"))
    assert (summary.changed, summary.skipped_unchanged) == (1, 4)
    assert summary.chunks_deleted == len(before[changed])
    assert summary.chunks_written == len(after[changed]) < len(before[changed])
    assert not before[changed] & after[changed]
    new_sha = {after_points[p]["source_sha"] for p in after[changed]}
    assert len(new_sha) == 1 and any(
        "revision 2" in after_points[p]["text"] for p in after[changed]
    )
    for path in before:
        if path != changed:
            assert after[path] == before[path]


def test_chunk_size_change_reindexes_everything_and_leaves_no_orphan(
    corpus: Path, tmp_path: Path
) -> None:
    small = make_config(corpus, tmp_path)
    first = run_ingest(small)
    big = make_config(corpus, tmp_path, chunk={"size": 1500, "overlap": 100})
    second = run_ingest(big)
    points = stored(big)
    assert second.changed == 5 and second.skipped_unchanged == 0
    assert second.chunks_written < first.chunks_written  # fewer, bigger chunks
    assert second.chunks_deleted == first.chunks_written
    assert len(points) == second.chunks_written == second.points_total
    assert len({p["config_fingerprint"] for p in points.values()}) == 1


def test_failure_between_write_and_delete_keeps_old_version_and_next_run_finishes(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)
    old = by_file(stored(cfg))
    (corpus / "engines.md").write_text(topic_doc("engines", version=2), encoding="utf-8")

    def broken_delete(self: EdgeStore, where: Any) -> int:
        raise RuntimeError("disk unplugged")

    with monkeypatch.context() as m:
        m.setattr(EdgeStore, "delete", broken_delete)
        with pytest.raises(RuntimeError, match="disk unplugged"):
            run_ingest(cfg)
    both = by_file(stored(cfg))
    engines = next(k for k in both if k.endswith("engines.md"))
    assert old[engines] < both[engines]  # the old version is still there (and searchable)

    summary = run_ingest(cfg)
    assert summary.chunks_written == 0 and summary.chunks_deleted == len(old[engines])
    assert_versions_current(cfg)  # after a cleanup run
    final = by_file(stored(cfg))
    assert final[engines] == both[engines] - old[engines]


def test_crash_mid_upsert_does_not_reembed_and_converges_to_a_clean_run(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_config(corpus, tmp_path)
    real_upsert = EdgeStore.upsert

    def flaky_upsert(self: EdgeStore, points: Any, progress: Any = None) -> None:
        real_upsert(self, points[: len(points) // 2])  # some batches land, then the crash
        raise RuntimeError("killed mid-upsert")

    with monkeypatch.context() as m:
        m.setattr(EdgeStore, "upsert", flaky_upsert)
        with pytest.raises(RuntimeError, match="killed mid-upsert"):
            run_ingest(cfg)
    partial = stored(cfg)
    assert len(partial) > 0

    resumed = run_ingest(cfg)
    assert resumed.stages["embed"]["embedded"] == 0  # vectors came from the checkpoint
    clean_cfg = make_config(corpus, tmp_path / "clean")
    run_ingest(clean_cfg)
    final, clean = stored(cfg), stored(clean_cfg)
    assert set(final) == set(clean)
    assert resumed.points_total == len(clean)


def test_vanished_files_are_deleted_but_mass_deletion_is_held(corpus: Path, tmp_path: Path) -> None:
    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)
    (corpus / "astronomy.md").unlink()  # 1 of 5 = 20 %: not above the default share
    one = run_ingest(cfg)
    assert one.removed == 1 and one.chunks_deleted > 0
    assert not any(p["file_path"].endswith("astronomy.md") for p in stored(cfg).values())

    before = stored(cfg)
    for name in ("engines.md", "wings.md"):  # 2 of 4 = 50 %
        (corpus / name).unlink()
    (corpus / "cooking.md").write_text(topic_doc("cooking"), encoding="utf-8")
    with pytest.raises(MassDeletionHeld, match="2 of 4 indexed files vanished"):
        run_ingest(cfg)
    held = stored(cfg)
    assert set(before) < set(held)  # nothing deleted, the addition applied
    assert any(p["file_path"].endswith("cooking.md") for p in held.values())
    summary = json.loads((cfg.paths.work_dir / "summary.json").read_text())
    assert summary["deletions_held"] == 2

    allowed = run_ingest(cfg, allow_mass_delete=True)
    assert allowed.removed == 2
    assert {Path(p["file_path"]).name for p in stored(cfg).values()} == {
        "statistics.md",
        "gardening.md",
        "cooking.md",
    }


def test_an_emptied_root_never_wipes_the_index(corpus: Path, tmp_path: Path) -> None:
    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)
    before = stored(cfg)
    for path in corpus.iterdir():
        path.unlink()
    with pytest.raises(MassDeletionHeld, match="5 of 5"):
        run_ingest(cfg)
    assert stored(cfg) == before


def test_switching_embedder_on_an_existing_index_fails_before_any_work(
    corpus: Path, tmp_path: Path
) -> None:
    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)
    other = make_config(corpus, tmp_path, embed={"provider": "local"})
    convert_manifest = (cfg.paths.work_dir / "convert" / "manifest.json").read_text()
    with pytest.raises(ConfigError, match=r"paraphrase-MiniLM-L3-v2.*all-MiniLM-L6-v2"):
        run_ingest(other)
    assert (cfg.paths.work_dir / "convert" / "manifest.json").read_text() == convert_manifest
    (corpus / "new.md").write_text(topic_doc("astronomy"), encoding="utf-8")  # work to do
    smaller = make_config(corpus, tmp_path, embed={"dimensions": 128})  # same model, 128-d
    with pytest.raises(ConfigError, match=r"'paraphrase-MiniLM-L3-v2@128'"):
        run_ingest(smaller)
    assert (cfg.paths.work_dir / "convert" / "manifest.json").read_text() == convert_manifest


def test_duplicate_chunks_are_embedded_once_when_asked(corpus: Path, tmp_path: Path) -> None:
    (corpus / "copy-of-wings.md").write_text(topic_doc("wings"), encoding="utf-8")
    keep_copies = {"dedupe_content": False}  # chunk-level dedupe, not discovery's whole-file one
    plain = run_ingest(make_config(corpus, tmp_path, discover=keep_copies))
    deduped_cfg = make_config(
        corpus, tmp_path / "dedupe", embed={"dedupe_chunks": True}, discover=keep_copies
    )
    deduped = run_ingest(deduped_cfg)
    assert deduped.stages["embed"]["duplicates_skipped"] == plain.chunks_written // 6
    assert (
        deduped.chunks_written
        == plain.chunks_written - deduped.stages["embed"]["duplicates_skipped"]
    )
    # Stable across runs: the copy's chunks are already indexed (under the first file).
    again = run_ingest(deduped_cfg)
    assert again.chunks_written == 0 and again.stages["embed"]["duplicates_skipped"] > 0
    assert again.points_total == deduped.points_total


def test_qdrant_backend_is_a_drop_in(corpus: Path, tmp_path: Path) -> None:
    cfg = make_config(corpus, tmp_path, "qdrant")
    run_ingest(cfg)
    (corpus / "wings.md").write_text(topic_doc("wings", version=3, sections=1), encoding="utf-8")
    summary = run_ingest(cfg)
    assert summary.changed == 1 and summary.chunks_deleted > summary.chunks_written > 0
    assert summary.points_total == len(stored(cfg))
    assert isinstance(open_store(cfg.store, "paraphrase-MiniLM-L3-v2", None), QdrantStore)


def _unindexed(cfg: RagpipeConfig, reader: bool = False) -> int:
    store = (open_reader if reader else partial(open_store, dim=None))(
        cfg.store, "paraphrase-MiniLM-L3-v2"
    )
    assert isinstance(store, EdgeStore)
    try:
        return store.unindexed()
    finally:
        store.close()


def test_ingest_builds_the_hnsw_index_once_enough_points_are_outside_it(
    corpus: Path, tmp_path: Path
) -> None:
    cfg = make_config(corpus, tmp_path, store={"hnsw_min_unindexed": 20})
    first = run_ingest(cfg)
    assert first.points_total > 20
    assert first.stages["upsert"]["hnsw_indexed"] == first.points_total
    assert _unindexed(cfg) == 0 and _unindexed(cfg, reader=True) == 0  # published with it
    # A changed file adds fewer points than the threshold: they wait, searched by scan.
    (corpus / "wings.md").write_text(topic_doc("wings", version=2, sections=2), encoding="utf-8")
    second = run_ingest(cfg)
    assert 0 < second.chunks_written < 20 and "hnsw_indexed" not in second.stages["upsert"]
    assert _unindexed(cfg) == second.chunks_written
    assert len(stored(cfg)) == second.points_total  # deleted points are not counted
    # Past the threshold again: the next run indexes them.
    for topic in ("tides", "glass", "honey"):
        (corpus / f"{topic}.md").write_text(topic_doc(topic), encoding="utf-8")
    third = run_ingest(cfg)
    waiting = second.chunks_written + third.chunks_written  # outside it before the build
    assert third.stages["upsert"]["hnsw_indexed"] == waiting and _unindexed(cfg) == 0


def test_a_build_a_killed_run_left_undone_is_done_by_the_next_run_with_nothing_to_write(
    corpus: Path, tmp_path: Path
) -> None:
    """Killed during the HNSW build, the store keeps its record of points outside the
    index; the rerun had nothing to write, never opened the store, and published it
    unindexed, night after night, until the corpus changed."""
    import json as _json

    from ragpipe.store import UNINDEXED_FILE

    cfg = make_config(corpus, tmp_path, store={"hnsw_min_unindexed": 20})
    first = run_ingest(cfg)
    assert first.stages["upsert"]["hnsw_indexed"] == first.points_total
    record = cfg.store.path / UNINDEXED_FILE
    record.write_text(_json.dumps({"points": first.points_total}), encoding="utf-8")  # killed
    again = run_ingest(cfg)
    assert again.chunks_written == 0  # nothing changed
    assert again.stages["upsert"]["hnsw_indexed"] == first.points_total
    assert _unindexed(cfg) == 0 and _unindexed(cfg, reader=True) == 0  # published with it
    quiet = run_ingest(cfg)  # and a no-op night after it opens nothing to build
    assert "hnsw_indexed" not in quiet.stages["upsert"]
    # Under the engine's own threshold, fixed at creation (here 20 points): nothing to build,
    # so a lowered store.hnsw_min_unindexed does not open the store every night for nothing.
    from ragpipe.store import unbuilt_index

    record.write_text(_json.dumps({"points": 10}), encoding="utf-8")
    lowered = cfg.store.model_copy(update={"hnsw_min_unindexed": 5})
    assert not unbuilt_index(lowered) and unbuilt_index(cfg.store) is False
    record.write_text(_json.dumps({"points": 20}), encoding="utf-8")
    assert unbuilt_index(lowered) and unbuilt_index(cfg.store)


def test_int8_quantisation_is_fixed_at_creation_and_searches_like_full_vectors(
    corpus: Path, tmp_path: Path
) -> None:
    plain = make_config(corpus, tmp_path / "plain", store={"hnsw_min_unindexed": 20})
    int8 = make_config(
        corpus, tmp_path / "int8", store={"hnsw_min_unindexed": 20, "quantization": "int8"}
    )
    run_ingest(plain)
    run_ingest(int8)
    edge_config = json.loads((int8.store.path / "edge_config.json").read_text())
    assert edge_config["vectors"]["dense"]["quantization_config"]
    some_ids = list(stored(plain))[:3]
    stores = [open_store(c.store, "paraphrase-MiniLM-L3-v2", None) for c in (plain, int8)]
    try:
        assert [s.quantization for s in stores] == ["none", "int8"]  # type: ignore[union-attr]
        # The same points; every query's top 5 agree (int8 candidates, rescored in full).
        probe = stores[0].dense_vectors(some_ids)  # type: ignore[union-attr]
        for vector in probe.values():
            ranked = [
                [h.point_id for h in s.query_dense(vector, 5)]  # type: ignore[union-attr]
                for s in stores
            ]
            assert ranked[0] == ranked[1]
    finally:
        for s in stores:
            s.close()  # type: ignore[union-attr]
    from ragpipe.query.retrieve import Retriever

    with Retriever(int8) as retriever:  # the document signal scores leads exactly, in full
        result = retriever.search("topic 3 notes", mode="dense", top_k=10)
        query = retriever.embedder.embed_query("topic 3 notes")
        for hit in result.hits:
            where = Where(must={"doc_id": hit.payload["doc_id"], "chunk_index": 0})
            lead = retriever.store.query_dense(query, 1, where, exact=True)[0]
            full = retriever.store.dense_vectors([lead.point_id])[lead.point_id]
            assert hit.scores["doc"] == pytest.approx(float(full @ query), abs=1e-5)
    with pytest.raises(ConfigError, match=r"store.quantization int8 \(configured: none\)"):
        run_ingest(make_config(corpus, tmp_path / "int8", store={"hnsw_min_unindexed": 20}))


def test_on_disk_indexes_are_fixed_at_creation_and_rank_like_ram(
    corpus: Path, tmp_path: Path
) -> None:
    from ragpipe.query.retrieve import Retriever

    ram = make_config(corpus, tmp_path / "ram", store={"hnsw_min_unindexed": 20})
    disk = make_config(corpus, tmp_path / "disk", store={"hnsw_min_unindexed": 20, "on_disk": True})
    run_ingest(ram)
    summary = run_ingest(disk)
    assert summary.stages["upsert"]["hnsw_indexed"] == summary.points_total > 20
    edge_config = json.loads((disk.store.path / "edge_config.json").read_text())
    assert (
        edge_config["hnsw_config"]["on_disk"] and edge_config["sparse_vectors"]["bm25"]["on_disk"]
    )
    ram_config = json.loads((ram.store.path / "edge_config.json").read_text())
    # (the engine writes its default hnsw_config after a build: the graph in RAM)
    assert not (ram_config.get("hnsw_config") or {}).get("on_disk")
    results = []
    for cfg in (ram, disk):  # the default hybrid: both legs, the document signal's filter
        with Retriever(cfg) as retriever:
            results.append(
                [[h.point_id for h in retriever.search(f"topic {i} notes").hits] for i in range(5)]
            )
    assert results[0] == results[1] and all(results[0])
    with pytest.raises(ConfigError, match=r"store.on_disk true \(configured: false\)"):
        run_ingest(make_config(corpus, tmp_path / "disk", store={"hnsw_min_unindexed": 20}))


def test_on_disk_on_a_qdrant_collection_is_fixed_at_creation(corpus: Path, tmp_path: Path) -> None:
    disk = make_config(corpus, tmp_path, "qdrant", store={"on_disk": True})
    assert run_ingest(disk).failed == 0
    store = open_store(disk.store, "paraphrase-MiniLM-L3-v2", None)
    assert isinstance(store, QdrantStore)
    try:
        config = store.client.get_collection("ragpipe").config
        assert (config.metadata or {})["on_disk"] is True  # local mode keeps no hnsw_config
    finally:
        store.close()
    with pytest.raises(ConfigError, match=r"store.on_disk true \(configured: false\)"):
        run_ingest(make_config(corpus, tmp_path, "qdrant"))
    from ragpipe.query.retrieve import Retriever

    with Retriever(make_config(corpus, tmp_path, "qdrant")) as retriever:  # a reader: as is
        assert retriever.search("topic 3 notes").hits


def test_int8_on_a_qdrant_collection_is_fixed_at_creation(corpus: Path, tmp_path: Path) -> None:
    int8 = make_config(corpus, tmp_path, "qdrant", store={"quantization": "int8"})
    first = run_ingest(int8)
    assert first.points_total > 20 and "hnsw_indexed" not in first.stages["upsert"]
    store = open_store(int8.store, "paraphrase-MiniLM-L3-v2", None)
    assert isinstance(store, QdrantStore)
    try:
        vectors = store.client.get_collection("ragpipe").config.params.vectors
        assert isinstance(vectors, dict) and vectors["dense"].quantization_config is not None
        # Searches ask for INT8_OVERSAMPLING x the candidates, rescored, as on Edge.
        params = store._dense_params()
        assert params is not None and params.quantization is not None
        assert params.quantization.oversampling == INT8_OVERSAMPLING
        some = store.client.scroll("ragpipe", limit=1, with_vectors=["dense"])[0][0]
        vector = np.asarray(some.vector["dense"], np.float32)  # type: ignore[index]
        assert store.query_dense(vector, 3)[0].point_id == str(some.id)
        assert str(some.id) in {h.point_id for h in store.query_hybrid(vector, "x", 3, 10)}
    finally:
        store.close()
    with pytest.raises(ConfigError, match=r"store.quantization int8 \(configured: none\)"):
        run_ingest(make_config(corpus, tmp_path, "qdrant"))
    # A reader takes the collection as it was created, as Edge's readers do: search, serve
    # and the evals refused a config that left store.quantization out.
    plain = make_config(corpus, tmp_path, "qdrant")
    reader = open_reader(plain.store, "paraphrase-MiniLM-L3-v2")
    assert isinstance(reader, QdrantStore)
    try:
        params = reader._dense_params()  # rescored as the int8 collection needs
        assert params is not None and params.quantization is not None
    finally:
        reader.close()


def test_dedupe_never_skips_a_text_whose_only_other_copy_this_run_deletes(
    tmp_path: Path,
) -> None:
    """With embed.dedupe_chunks, a new file repeating a paragraph of a file removed in the
    same run had that chunk skipped (counted as indexed, from the removed file's point),
    then the removed file's points were deleted: the paragraph was nowhere, the run said
    success, and later runs called the file unchanged."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shared = " ".join(["Lighthouse keepers lived through long winters on the rock."] * 6)
    own = " ".join(["Beetles keep their own notes about bark and leaves."] * 6)
    (corpus / "b.md").write_text(
        f"## Beetles\n\n{own}\n\n## Lights\n\n{shared}\n", encoding="utf-8"
    )
    cfg = make_config(corpus, tmp_path, embed={"dedupe_chunks": True},
                      index={"allow_mass_delete": True})  # fmt: skip
    run_ingest(cfg)
    (corpus / "b.md").unlink()
    ants = " ".join(["Ants keep colonies of their own in the soil."] * 6)
    (corpus / "a.md").write_text(f"## Ants\n\n{ants}\n\n## Lights\n\n{shared}\n", encoding="utf-8")
    run_ingest(cfg)
    points = list(stored(cfg).values())
    assert {p["file_path"].rsplit("/", 1)[-1] for p in points} == {"a.md"}
    assert len(points) == points[0]["chunk_total"]  # every chunk of a.md, the shared one too
    assert any("Lighthouse keepers" in p["text"] for p in points)


def test_dedupe_counts_only_the_versions_a_run_keeps() -> None:
    """After a kill mid-upsert the changed file's new version is stored beside its old one
    (the plan says cleanup); the old one's texts were counted as indexed, so a new file
    repeating one of them skipped it, and the cleanup then deleted its only copy."""
    from ragpipe.ingest.embed import _indexed_text_shas
    from ragpipe.schemas import PlanEntry

    def point(path: str, sha: str, text: str, fp: str = "fp") -> Any:
        payload = {"file_path": path, "source_sha": sha, "config_fingerprint": fp,
                   "text_sha": text}  # fmt: skip
        return type("Hit", (), {"payload": payload})()

    class Store:
        def scroll(self, fields: Any = None) -> list[Any]:
            return [point("aa.md", "old", "X"), point("aa.md", "new", "A"),
                    point("gone.md", "g", "G"), point("kept.md", "k", "K"),
                    point("kept.md", "k", "OLDFP", fp="other"),
                    point("under-missing-root/m.md", "m", "M")]  # fmt: skip

    entries = [
        PlanEntry("aa.md", "cleanup", "new", 2),
        PlanEntry("gone.md", "removed", None, 1),
        PlanEntry("kept.md", "unchanged", "k", 1),
        PlanEntry("zz.md", "added", "z", 0),
    ]
    assert _indexed_text_shas(Store(), [], entries, "fp") == {  # type: ignore[arg-type]
        "A": "aa.md", "K": "kept.md", "M": "under-missing-root/m.md"
    }  # fmt: skip


WARRANTY = "The warranty covers parts and labour for three years from the date of purchase."


def _terms_corpus(tmp_path: Path, backend: str = "edge", **index: Any) -> RagpipeConfig:
    """a.md and b.md, each with a '## Terms' section of the same sentence; chunks small
    enough that the section is chunks of its own, which dedupe_chunks skips in b.md."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, line in (("a", "Alpha intro about the first"), ("b", "Beta intro about the second")):
        (docs / f"{name}.md").write_text(
            f"# {name.upper()}\n\n{line} product line.\n\n## Terms\n\n{WARRANTY}\n",
            encoding="utf-8",
        )
    return make_config(docs, tmp_path, backend, chunk={"size": 60, "overlap": 10},
                       embed={"dedupe_chunks": True}, index=index)  # fmt: skip


def _holding(cfg: RagpipeConfig, text: str) -> list[str]:
    return sorted(p["file_path"].rsplit("/", 1)[-1] for p in stored(cfg).values()
                  if text in p["text"])  # fmt: skip


@pytest.mark.parametrize("backend", ["edge", "qdrant"])
def test_dedupe_keeps_a_text_whose_holder_changes_while_its_copy_is_unchanged(
    tmp_path: Path, backend: str
) -> None:
    """a.md and b.md repeat a sentence; b.md's copy was skipped as a duplicate. Edit a.md
    to drop it: the run deleted a.md's old points, b.md (unchanged) was never re-chunked,
    and its version counted as complete without the text, so the sentence was in no point,
    then and on every later run."""
    cfg = _terms_corpus(tmp_path, backend)
    first = run_ingest(cfg)
    assert (first.added, first.stages["embed"]["duplicates_skipped"]) == (2, 2)
    assert _holding(cfg, "warranty") == ["a.md"]
    b_points = [p for p in stored(cfg).values() if p["file_path"].endswith("/b.md")]
    held_by = [p.get("dedupe_held_by") for p in sorted(b_points, key=lambda p: p["chunk_index"])]

    a_md = tmp_path / "docs" / "a.md"
    a_md.write_text("# A\n\nAlpha intro, rewritten without terms.\n", encoding="utf-8")
    second = run_ingest(cfg)
    # b.md is unchanged, re-indexed for its duplicates: it now holds the sentence itself.
    assert _holding(cfg, "warranty") == ["b.md"]
    assert held_by == [[str(a_md)]]  # b.md's one point said which file held its skipped texts
    assert (second.changed, second.skipped_unchanged) == (2, 0)
    assert second.stages["plan"]["changed_for_duplicates"] == 1
    assert second.stages["embed"]["duplicates_skipped"] == 0
    points = stored(cfg).values()
    b_points = [p for p in points if p["file_path"].endswith("/b.md")]
    assert len(b_points) == b_points[0]["chunk_total"] == 3
    assert not any("dedupe_held_by" in p for p in points)
    assert second.points_total == len(points)

    third = run_ingest(cfg)  # for good, and nothing re-indexed again
    assert (third.changed, third.skipped_unchanged, third.chunks_written) == (0, 2, 0)
    assert _holding(cfg, "warranty") == ["b.md"]
    if backend == "edge":
        assert_versions_current(cfg)


def test_dedupe_keeps_a_text_whose_holder_is_removed_or_still_holds_it(tmp_path: Path) -> None:
    """The holder changed but still holding the text: the copy is skipped again, now said
    held by the new version. The holder removed: the copy is stored."""
    cfg = _terms_corpus(tmp_path, allow_mass_delete=True)
    run_ingest(cfg)
    a_md = tmp_path / "docs" / "a.md"
    a_md.write_text(a_md.read_text(encoding="utf-8") + "\nA new closing line.\n", "utf-8")
    changed = run_ingest(cfg)
    assert (changed.changed, changed.stages["plan"]["changed_for_duplicates"]) == (2, 1)
    assert changed.stages["embed"]["duplicates_skipped"] == 2
    assert _holding(cfg, "warranty") == ["a.md"]
    a_md.unlink()
    removed = run_ingest(cfg)
    assert (removed.removed, removed.changed, removed.skipped_unchanged) == (1, 1, 0)
    assert _holding(cfg, "warranty") == ["b.md"]
    points = list(stored(cfg).values())
    assert len(points) == points[0]["chunk_total"] == 3


def test_inspect_stats_says_at_most_every_point_is_outside_hnsw(tmp_path: Path) -> None:
    """The record counts points written since the last build, overwritten and deleted
    ones too: `inspect stats` said "points outside HNSW 15" of an index of 9."""
    from ragpipe.index_inspect import stats
    from ragpipe.store.base import UNINDEXED_FILE

    corpus = write_topics(tmp_path / "corpus", 3, ".md")
    cfg = make_config(corpus, tmp_path)
    summary = run_ingest(cfg)
    (cfg.store.path / UNINDEXED_FILE).write_text(json.dumps({"points": 10_000}), "utf-8")
    store = open_store(cfg.store, "paraphrase-MiniLM-L3-v2", None)
    assert store is not None
    try:
        numbers = stats(store, cfg.store)
    finally:
        store.close()
    assert numbers.points == summary.points_total and numbers.unindexed == numbers.points
