"""The upsert stage: write new versions, then delete stale points, then publish.

* New versions are written first; only then are the file's points with
  another (source SHA, fingerprint) deleted. A changed document is never
  absent from the store.
* Every point carries ``chunk_total``; a version is complete when all its
  chunks are stored, so a crash in the middle of an upsert is finished by
  the next run.
* Files gone from every root are deleted, unless they exceed
  ``index.max_delete_share`` of the indexed files: then the deletions are
  held and the run fails (``MassDeletionHeld``) unless allowed.
* An Edge index that changed is published for readers (``store.published``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ragpipe import checkpoint
from ragpipe.config import RagpipeConfig, StoreBackend
from ragpipe.ingest import runner
from ragpipe.ingest.embed import EmbeddingRow, read_embeddings
from ragpipe.ingest.fetch import web_pages
from ragpipe.ingest.plan import (
    HELD_BY,
    PlanCounts,
    index_fingerprint,
    save_versions,
    saved_versions,
    stored_versions,
)
from ragpipe.ingest.records import payload_fields, saved_records
from ragpipe.progress import reporter
from ragpipe.schemas import Chunk, PlanEntry
from ragpipe.store import (
    FileVersions,
    IndexPoint,
    VectorStore,
    VersionStats,
    Where,
    published,
    store_generation,
    unbuilt_index,
    versions,
)
from ragpipe.web.pages import detect_language, iter_metadata

logger = logging.getLogger(__name__)


# -- upsert and delete ---------------------------------------------------------------


def build_points(
    chunks: Sequence[Chunk],
    embedded: dict[str, EmbeddingRow],
    index_fp: str,
    web: dict[str, dict[str, Any]] | None = None,
    records: dict[str, dict[str, Any]] | None = None,
) -> list[IndexPoint]:
    """Points for the embedded chunks; ``chunk_total`` counts each file's stored chunks.

    A file's chunks skipped as duplicates (``embed.dedupe_chunks``) are not among them:
    its first point names the files holding those texts (``plan.HELD_BY``), which the
    plan reads to re-index it when one of them changes or goes.

    ``records`` maps a JSON/JSONL record (``FILE#ID``) to its title, id, file and payload
    ``fields`` (``records.payload_fields``).

    ``web`` maps a page's URL to the fields its points carry besides the
    chunk's (``fetch.iter_metadata``); those points also get the page's
    ``language``, detected from its text, and a ``title`` (the page's, else its
    first heading).
    """
    kept = [c for c in chunks if c.chunk_id in embedded]
    totals = Counter(c.file_path for c in kept)
    ingested_at = datetime.now(UTC).isoformat()
    page_fields = _page_fields(kept, web or {})
    points = []
    for chunk in kept:
        row = embedded[chunk.chunk_id]
        payload = {
            "text": chunk.text,
            "context": chunk.context,
            "file_path": chunk.file_path,
            "heading_path": list(chunk.heading_path),
            "page": chunk.page,
            "line_start": chunk.line_start,
            "chunk_index": chunk.chunk_index,
            "chunk_total": totals[chunk.file_path],
            "char_start": chunk.char_start,
            "char_end": chunk.char_end,
            "doc_id": chunk.doc_id,
            "chunk_id": chunk.chunk_id,
            "source_sha": chunk.source_sha256,
            "text_sha": chunk.text_sha256,
            "config_fingerprint": index_fp,
            "ingested_at": ingested_at,
            **page_fields.get(chunk.file_path, {}),
            **(records or {}).get(chunk.file_path, {}),
        }
        if row.held_by:
            payload[HELD_BY] = list(row.held_by)
        points.append(
            IndexPoint(row.point_id, row.vector, row.sparse_indices, row.sparse_values, payload)
        )
    return points


def _page_fields(
    chunks: Sequence[Chunk], web: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per web page among ``chunks``: its metadata, language and title."""
    by_page: dict[str, list[Chunk]] = {}
    for chunk in chunks:
        if chunk.file_path in web:
            by_page.setdefault(chunk.file_path, []).append(chunk)
    fields = {}
    for url, page_chunks in by_page.items():
        page_chunks.sort(key=lambda c: c.chunk_index)
        first_heading = next((c.heading_path[0] for c in page_chunks if c.heading_path), None)
        meta = dict(web[url])
        meta["title"] = meta.get("title") or first_heading
        meta["language"] = detect_language(" ".join(c.text for c in page_chunks[:40]))
        fields[url] = meta
    return fields


def _stale(file_path: str, source_sha: str, index_fp: str) -> Where:
    """Points of ``file_path`` that are not the (source_sha, index_fp) version."""
    return Where(
        must={"file_path": file_path},
        must_not_all={"source_sha": source_sha, "config_fingerprint": index_fp},
    )


def _edge_absent(config: RagpipeConfig) -> bool:
    return (
        config.store.backend == StoreBackend.EDGE and not (config.store.path / "segments").is_dir()
    )


def _total_points(versions: FileVersions) -> int:
    return sum(v.points for by_version in versions.values() for v in by_version.values())


def _versions_after(
    before: FileVersions,
    written: Sequence[IndexPoint],
    index_fp: str,
    cleanup: Sequence[PlanEntry],
    removed: Sequence[PlanEntry],
) -> FileVersions:
    """The store's versions once an upsert run succeeded, derived from what it did:
    each written file holds exactly its new version, cleaned files their current
    one, removed files nothing."""
    new: FileVersions = {}
    for point in written:
        p = point.payload
        key = (p["source_sha"], index_fp)
        new.setdefault(p["file_path"], {}).setdefault(key, VersionStats(0, p["chunk_total"]))
        new[p["file_path"]][key].points += 1
    after = {**before, **new}
    for entry in cleanup:
        key = (str(entry.source_sha256), index_fp)
        after[entry.file_path] = {key: before[entry.file_path][key]}
    for entry in removed:
        after.pop(entry.file_path, None)
    return after


@dataclass
class UpsertCounts(runner.Counts):
    """What the store run did, and the points in the store after it."""

    points_written: int = 0
    files_written: int = 0
    points_deleted: int = 0
    files_removed: int = 0
    deletions_held: int = 0
    points_total: int = 0
    published: int = 0
    hnsw_indexed: int = field(default=0, metadata={"optional": True})  # see _index_upkeep


def run_upsert(
    config: RagpipeConfig,
    embedded: runner.StageSummary[Any],
    run_store: runner.RunStore | None = None,
) -> runner.StageSummary[UpsertCounts]:
    """Write new versions, then delete stale and vanished files' points.

    Always runs (it is idempotent); with nothing planned it writes nothing.
    ``run_store``: the run's (see ``RunStore``), closed here before the index is
    published; without it the stage opens its own.
    """
    started = time.perf_counter()
    index_fp = index_fingerprint(config)
    plan_id = embedded.plan_id
    # Every input checked to be this run's before anything is written.
    entries = runner.read_output(config, "plan", "plan.parquet", PlanEntry, plan_id)
    chunks_path = runner.verify_output(config, "chunk", "chunks.parquet", plan_id)
    vectors = read_embeddings(
        runner.verify_output(
            config, "embed", "embeddings.parquet", plan_id, embedded.output_fingerprint
        )
    )
    dim = len(next(iter(vectors.values())).vector) if vectors else 0

    removed = [e for e in entries if e.action == "removed"]
    cleanup = [e for e in entries if e.action == "cleanup"]
    planned = _plan_counts(config)
    # Of every file in the index, as the error says: files the plan has no entry for (below
    # a missing root, a failed listing, a duplicate skipped) are indexed files too, and
    # leaving them out made one unmounted share trip the guard on an ordinary deletion.
    indexed = max(
        planned.indexed_files if planned else 0,
        sum(1 for e in entries if e.stored_versions > 0),
    )
    share = len(removed) / indexed if indexed else 0.0
    hold = bool(removed) and share > config.index.max_delete_share
    hold = hold and not config.index.allow_mass_delete
    counts = UpsertCounts()

    before: FileVersions | None = None  # the store as the plan saw it, if unwritten since
    after: FileVersions | None = None
    points: list[IndexPoint] = []
    store: VectorStore | None = None
    with runner.stage_store(config, run_store) as stores:
        if vectors:
            before = {} if _edge_absent(config) else saved_versions(config)
            store = stores.for_writing(dim)
        elif cleanup or (removed and not hold):
            before = {} if _edge_absent(config) else saved_versions(config)
            store = stores.existing()
        elif unbuilt_index(config.store):  # a build a killed run left undone: do it now
            store = stores.existing()
        else:  # nothing to write or delete: the plan's scroll counted the points
            counts.points_total = planned.points_total if planned else 0
        try:
            if store is not None and vectors:
                chunks = checkpoint.read_records(chunks_path, Chunk)
                web = dict(iter_metadata(web_pages(config)))
                records = payload_fields(saved_records(config))
                points = build_points(chunks, vectors, index_fp, web, records)
                progress = reporter()
                progress.start("upsert", len(points))
                try:
                    store.upsert(points, progress=progress.advance)
                finally:
                    progress.finish()
                counts.points_written = len(points)
                # Only now that every new version is stored: drop the files' other versions.
                versions = {(p.payload["file_path"], p.payload["source_sha"]) for p in points}
                counts.files_written = len(versions)
                # Files the plan saw with no stored version have nothing stale to delete.
                new = {
                    e.file_path for e in entries if e.action == "added" and not e.stored_versions
                }
                for file_path, sha in sorted(versions):
                    if file_path not in new:
                        counts.points_deleted += store.delete(_stale(file_path, sha, index_fp))
            if store is not None:
                for entry in cleanup:
                    assert entry.source_sha256 is not None
                    counts.points_deleted += store.delete(
                        _stale(entry.file_path, entry.source_sha256, index_fp)
                    )
                if removed and not hold:
                    for entry in removed:
                        counts.points_deleted += store.delete(
                            Where(must={"file_path": entry.file_path})
                        )
                    counts.files_removed = len(removed)
                if before is not None:
                    after = _versions_after(
                        before, points, index_fp, cleanup, [] if hold else removed
                    )
                    counts.points_total = _total_points(after)
                else:
                    counts.points_total = store.count()
                counts.hnsw_indexed = _index_upkeep(store, config)
        finally:
            stores.close()  # durable, and the generation final, before saving and publishing
    if after is not None:
        save_versions(config, after)  # the generation is final once the store is closed
    if hold:
        counts.deletions_held = len(removed)
    version = _publish(config, counts.points_total, after, planned, index_fp)
    counts.published = int(version is not None)
    here = runner.WorkDir.of(config).stage("upsert")
    summary = runner.record_stage(
        here, "upsert", index_fp, embedded.output_fingerprint, {}, counts, started, plan_id
    )
    if hold:
        logger.error(
            "holding the deletion of %d of %d indexed files (%.0f%% > index.max_delete_share "
            "%.0f%%)",
            len(removed),
            indexed,
            100 * share,
            100 * config.index.max_delete_share,
        )
    return summary


def _index_upkeep(store: VectorStore, config: RagpipeConfig) -> int:
    """Build the HNSW index once ``store.hnsw_min_unindexed`` points are outside it (Edge;
    a Qdrant server's optimizer does it itself). Before publishing, so that readers get
    the index. Returns the points the build added."""
    progress = reporter()
    threshold = config.store.hnsw_min_unindexed

    def starting(unindexed: int) -> None:
        logger.info(
            "upsert: building the HNSW index: %d points are not in it (store.hnsw_min_unindexed"
            "=%d). Measured on 2 cores: 15 s for 10,000 new points, 3 min for a first build of "
            "100,000, 15 min for 300,000, 37 min for a million (int8)",
            unindexed, threshold,
        )  # fmt: skip
        progress.start("index", 0)  # one engine call: no steps to count

    def waiting(seconds: float) -> None:
        logger.info("upsert: still building the HNSW index (%.0f s so far)", seconds)

    try:
        build = store.build_index(threshold, starting, waiting)
    finally:
        progress.finish()
    if build is None:
        return 0
    logger.info("upsert: HNSW index built; %d points added in %.1fs", build.indexed, build.seconds)
    return build.indexed


def _plan_counts(config: RagpipeConfig) -> PlanCounts | None:
    """The counts of this run's plan (checked by ``read_output`` above)."""
    manifest = checkpoint.read_manifest(runner.WorkDir.of(config).stage("plan"))
    return PlanCounts.from_dict(manifest.counts) if manifest is not None else None


def _publish(
    config: RagpipeConfig,
    points: int,
    after: FileVersions | None,
    planned: PlanCounts | None,
    index_fp: str,
) -> published.IndexVersion | None:
    """Publish the Edge store for readers when this run changed it (or it never was); with
    ``index.gate``, stage it instead (None: the gate decides after the run)."""
    gated = config.index.gate is not None
    generation = (
        versions.working_generation(config.store) if gated else store_generation(config.store)
    )
    if generation is None:  # no store yet, or the qdrant backend without a gate
        return None
    if after is not None:
        files = len(after)
    elif planned is not None and not planned.added and not planned.removed:
        files = planned.indexed_files
    else:
        files = len(stored_versions(config))
    if gated:  # a decision: ragpipe.ingest.gatekeep
        staged = versions.stage(config.store, generation, points, files, index_fp)
        # Live already: a damaged live version published again (the gate passed it before).
        live = staged is not None and staged.generation == versions.current(config.store)
        return staged if live else None
    return published.publish(config.store.path, generation, points, files, index_fp)


def mass_deletion_message(config: RagpipeConfig, held: int, indexed: int) -> str:
    """The error a held mass deletion fails the run with."""
    return (
        f"{held} of {indexed} indexed files vanished from every root, or are web pages now "
        f"gone or disallowed (more than "
        f"index.max_delete_share = {config.index.max_delete_share:.0%}). New and changed files "
        "were indexed; the deletions were held. If the files really are gone, re-run with "
        "--allow-mass-delete (CLI), the parameter allow_mass_delete: true (a Prefect "
        "deployment run, e.g. from the UI), or index.allow_mass_delete: true in the config; "
        "if a share is unmounted or a root is wrong, fix that first. The list is in "
        f"{runner.WorkDir.of(config).plan}."
    )
