"""The second half of ingest: plan the re-index, embed, upsert, delete stale points.

Work directory layout (continuing ``stages``)::

    work_dir/plan/{files,plan}.parquet + manifest.json      files to (re)process
    work_dir/plan/store-versions.parquet                    the store's file versions, cached
    work_dir/embed/embeddings.parquet + manifest.json       chunk_id, point_id, vector
    work_dir/embed/parts/<fingerprint>-<n>.parquet          embedded so far (crash resume)
    work_dir/upsert/manifest.json                           what the store run did

Invariants of the re-index:

* A point's ID is UUIDv5 over (file path, source SHA, index fingerprint,
  chunk index): a changed file, or an unchanged file under a changed config,
  gets new points; re-writing the same version is idempotent.
* Every point carries ``chunk_total``; a version is complete when all its
  chunks are stored. Only complete versions count as indexed, so a crash in
  the middle of an upsert is finished by the next run.
* New versions are written first; only then are the file's points with
  another (source SHA, fingerprint) deleted. A changed document is never
  absent from the store.
* The diff reads the store in one scroll, except when the Edge store has not
  been written since the last scroll (its generation token is unchanged):
  then the saved result of that scroll is the store's content, and a no-op
  run costs only hashing.
* Files gone from every root are deleted, unless they exceed
  ``index.max_delete_share`` of the indexed files: then the deletions are
  held and the run fails (``MassDeletionHeld``) unless allowed.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from ragpipe import checkpoint, published
from ragpipe.chunk import TokenCounter
from ragpipe.config import EmbedProvider, RagpipeConfig, StoreBackend
from ragpipe.embed import (
    Embedder,
    contextual_text,
    embedder_fingerprint,
    embedder_name,
    fit_context,
    make_embedder,
)
from ragpipe.fetch import GONE_CATEGORIES, detect_language, iter_metadata
from ragpipe.progress import reporter
from ragpipe.schemas import Chunk, Failure, PlanEntry, SourceFile
from ragpipe.stages import (
    StageSummary,
    chunk_fingerprint,
    finish_stage,
    read_input,
    read_output,
    reuse_stage,
    stage_dir,
    verify_output,
    web_pages,
)
from ragpipe.store import (
    FileVersions,
    IndexPoint,
    SparseEncoder,
    StoreMeta,
    VectorStore,
    VersionStats,
    Where,
    check_store_space,
    open_store,
    peek_meta,
    store_generation,
)

logger = logging.getLogger(__name__)

POINT_NAMESPACE = uuid.UUID("5d1f0c9e-3b7a-4c2e-9a61-0f8e2b4d7c13")
PART_SIZE = 1024  # chunks embedded between two durable parts


def index_fingerprint(config: RagpipeConfig) -> str:
    """Everything that shapes a stored point: converter, cleaner, chunker, embedder."""
    return checkpoint.combine_fingerprints(
        [chunk_fingerprint(config), embedder_fingerprint(config.embed)]
    )


def point_id(file_path: str, source_sha: str, index_fp: str, chunk_index: int) -> str:
    """Deterministic point ID of one chunk of one version of one file."""
    key = f"{file_path}\x1f{source_sha}\x1f{index_fp}\x1f{chunk_index}"
    return str(uuid.uuid5(POINT_NAMESPACE, key))


def _read_optional(path: Path, record_type: type) -> list[object]:
    return checkpoint.read_records(path, record_type) if path.is_file() else []


# -- plan ----------------------------------------------------------------------------

VERSIONS_FILE = "store-versions.parquet"
_VERSIONS_SCHEMA = pa.schema(
    [
        ("file_path", pa.string()),
        ("source_sha", pa.string()),
        ("config_fingerprint", pa.string()),
        ("points", pa.int64()),
        ("chunk_total", pa.int64()),
    ]
)


def _versions_key(config: RagpipeConfig, generation: str) -> dict[str, str]:
    return {"store": str(config.store.path.resolve()), "generation": generation}


def save_versions(config: RagpipeConfig, versions: FileVersions) -> None:
    """Remember the store's file versions under its current generation (Edge only)."""
    generation = store_generation(config.store)
    if generation is None:
        return
    rows = [
        (path, sha, fp, stats.points, stats.chunk_total)
        for path, by_version in versions.items()
        for (sha, fp), stats in by_version.items()
    ]
    columns: list[Sequence[object]] = [list(c) for c in zip(*rows, strict=True)] or [
        [] for _ in _VERSIONS_SCHEMA
    ]
    table = pa.table(
        [pa.array(c, f.type) for c, f in zip(columns, _VERSIONS_SCHEMA, strict=True)],
        schema=_VERSIONS_SCHEMA,
    ).replace_schema_metadata(_versions_key(config, generation))
    checkpoint.write_table(stage_dir(config, "plan") / VERSIONS_FILE, table)


def saved_versions(config: RagpipeConfig) -> FileVersions | None:
    """The saved versions when the store was not written since they were saved, else None."""
    generation = store_generation(config.store)
    path = stage_dir(config, "plan") / VERSIONS_FILE
    if generation is None or not path.is_file():
        return None
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException):
        return None
    stored = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    if stored != _versions_key(config, generation):
        return None
    versions: FileVersions = {}
    for path_, sha, fp, points, total in zip(
        *(table.column(name).to_pylist() for name in _VERSIONS_SCHEMA.names), strict=True
    ):
        versions.setdefault(path_, {})[(sha, fp)] = VersionStats(points, total)
    return versions


def stored_versions(config: RagpipeConfig) -> FileVersions:
    """Per file, the versions in the store: from one scroll, or its saved result.

    The saved result is used only while the Edge store's generation token is
    the one it was saved under; the embedder check of opening the store runs
    either way.
    """
    name = embedder_name(config.embed)
    cached = saved_versions(config)
    meta = peek_meta(config.store) if cached is not None else None
    if cached is not None and meta is not None:  # no metadata: opening the store rebuilds it
        StoreMeta(name, None).check(meta, str(config.store.path))
        return cached
    store = open_store(config.store, name, None)
    if store is None:
        return {}
    try:
        versions = store.file_versions()
    finally:
        store.close()
    save_versions(config, versions)
    return versions


def run_plan(config: RagpipeConfig, discovered: StageSummary) -> StageSummary:
    """Diff discovered files against the store in one paginated scroll.

    Always runs: the store, not a checkpoint, is the truth about what is indexed.
    """
    started = time.perf_counter()
    check_store_space(config.store)  # a full disk stops the run here, not after converting
    sources = read_input(config, discovered, "files.parquet", SourceFile)
    # A source that failed discovery (unreadable file, page timing out) still exists,
    # unless the failure says it is gone (a page answering 404).
    unreadable = {
        f.file_path
        for f in read_input(config, discovered, "failures.parquet", Failure)
        if f.category not in GONE_CATEGORIES
    }
    index_fp = index_fingerprint(config)
    versions = stored_versions(config)
    todo: list[SourceFile] = []
    entries: list[PlanEntry] = []
    for source in sources:
        stored = versions.get(source.file_path, {})
        current = stored.get((source.sha256, index_fp))
        if current is not None and current.complete:
            action = "cleanup" if len(stored) > 1 else "unchanged"
        else:
            action = "changed" if stored else "added"
            todo.append(source)
        entries.append(PlanEntry(source.file_path, action, source.sha256, len(stored)))
    if todo and config.embed.provider == EmbedProvider.OLLAMA:
        # A remote embedder that is down or lacks the model fails now, before any
        # conversion work, not after it (the probe embeds one short text).
        dim = make_embedder(config.embed).dim
        logger.info("plan: the Ollama embedder answers (%d dimensions)", dim)
    present = {s.file_path for s in sources} | unreadable
    for path in sorted(set(versions) - present):
        entries.append(PlanEntry(path, "removed", None, len(versions[path])))
    counts = {
        "indexed_files": len(versions),
        "points_total": sum(v.points for file in versions.values() for v in file.values()),
        **{a: 0 for a in ("added", "changed", "unchanged", "cleanup", "removed")},
        **Counter(e.action for e in entries),
    }
    return finish_stage(
        stage_dir(config, "plan"),
        "plan",
        index_fp,
        discovered.output_fingerprint,
        {"files": (todo, SourceFile), "plan": (entries, PlanEntry)},
        counts,
        started,
        uuid.uuid4().hex,  # this run's plan: every later stage checks its input carries it
    )


# -- embed ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbeddingRow:
    """One chunk's vectors as checkpointed by *embed*.

    ``prefix`` is the contextual prefix the dense vector was computed with;
    the BM25 term weights are over the same prefixed text.
    """

    chunk_id: str
    point_id: str
    prefix: str
    vector: npt.NDArray[np.float32]
    sparse_indices: list[int]
    sparse_values: list[float]


def embeddings_table(rows: Sequence[EmbeddingRow], dim: int, index_fp: str) -> pa.Table:
    """Arrow table of embedding rows: vectors as fixed-size float32 lists."""
    flat = (
        np.concatenate([r.vector for r in rows]).astype(np.float32)
        if rows
        else np.zeros(0, np.float32)
    )
    table = pa.table(
        {
            "chunk_id": pa.array([r.chunk_id for r in rows], pa.string()),
            "point_id": pa.array([r.point_id for r in rows], pa.string()),
            "prefix": pa.array([r.prefix for r in rows], pa.string()),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), dim),
            "sparse_indices": pa.array([r.sparse_indices for r in rows], pa.list_(pa.uint32())),
            "sparse_values": pa.array([r.sparse_values for r in rows], pa.list_(pa.float32())),
        }
    )
    return table.replace_schema_metadata({"index_fingerprint": index_fp, "dim": str(dim)})


def read_embeddings(path: Path, index_fp: str | None = None) -> dict[str, EmbeddingRow]:
    """chunk_id -> row; {} when absent, unreadable or written under another fingerprint."""
    if not path.is_file():
        return {}
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        logger.warning("ignoring unreadable embeddings %s: %s", path, exc)
        return {}
    meta = table.schema.metadata or {}
    if index_fp is not None and meta.get(b"index_fingerprint", b"").decode() != index_fp:
        return {}
    if "sparse_indices" not in table.column_names or not table.num_rows:
        return {}
    dim = int(meta[b"dim"])
    flat = table.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    matrix = flat.reshape(-1, dim).astype(np.float32)
    columns = [
        table.column(name).to_pylist()
        for name in ("chunk_id", "point_id", "prefix", "sparse_indices", "sparse_values")
    ]
    return {
        cid: EmbeddingRow(cid, pid, prefix, matrix[i], indices, values)
        for i, (cid, pid, prefix, indices, values) in enumerate(zip(*columns, strict=True))
    }


def _texts_to_embed(
    chunks: Sequence[Chunk], config: RagpipeConfig, embedder: Embedder
) -> tuple[list[str], list[str], Counter[str]]:
    """Texts for the model and the prefix each carries (the raw text is stored)."""
    stats: Counter[str] = Counter()
    if not config.embed.contextual_prefix:
        return [c.text for c in chunks], ["" for _ in chunks], stats
    counter = TokenCounter(config.chunk.tokenizer)
    texts = [contextual_text(c.heading_path, c.text) for c in chunks]
    counts = counter.count_many(texts)
    for i, (chunk, tokens) in enumerate(zip(chunks, counts, strict=True)):
        if tokens > embedder.max_tokens:
            texts[i], trimmed = fit_context(
                chunk.heading_path, chunk.text, embedder.max_tokens, counter
            )
            stats["prefix_trimmed"] += int(trimmed)
    prefixes = [
        t[: len(t) - len(c.text)].removesuffix("\n") for t, c in zip(texts, chunks, strict=True)
    ]
    return texts, prefixes, stats


def _embedding_rows(
    chunks: Sequence[Chunk],
    texts: Sequence[str],
    prefixes: Sequence[str],
    embedder: Embedder,
    sparse: SparseEncoder,
    index_fp: str,
) -> list[EmbeddingRow]:
    vectors = embedder.embed_documents(list(texts))
    rows = []
    for row, (chunk, text, prefix) in enumerate(zip(chunks, texts, prefixes, strict=True)):
        indices, values = sparse.document(text)
        pid = point_id(chunk.file_path, chunk.source_sha256, index_fp, chunk.chunk_index)
        rows.append(EmbeddingRow(chunk.chunk_id, pid, prefix, vectors[row], indices, values))
    return rows


def _done_ids(config: RagpipeConfig, index_fp: str) -> set[str]:
    here = stage_dir(config, "embed")
    done = set(read_embeddings(here / "embeddings.parquet", index_fp))
    for part in sorted((here / "parts").glob(f"{index_fp}-*.parquet")):
        done.update(read_embeddings(part, index_fp))
    return done


def embed_batches(config: RagpipeConfig, size: int) -> list[list[Chunk]]:
    """The chunked chunks without vectors yet, in batches of ``size`` (for fan-out)."""
    chunks = checkpoint.read_records(stage_dir(config, "chunk") / "chunks.parquet", Chunk)
    done = _done_ids(config, index_fingerprint(config))
    todo = [c for c in chunks if c.chunk_id not in done]
    return [todo[i : i + size] for i in range(0, len(todo), size)]


def embed_batch(config: RagpipeConfig, chunks: Sequence[Chunk]) -> int:
    """Embed ``chunks`` into a durable part; ``run_embed`` then reuses the vectors.

    Run in parallel (one batch per worker) before ``run_embed``. The part's
    name is derived from its chunks, so a batch re-run overwrites itself.
    """
    if not chunks:
        return 0
    index_fp = index_fingerprint(config)
    embedder = make_embedder(config.embed)
    texts, prefixes, _ = _texts_to_embed(list(chunks), config, embedder)
    rows = _embedding_rows(chunks, texts, prefixes, embedder, SparseEncoder(), index_fp)
    key = hashlib.sha256("\n".join(c.chunk_id for c in chunks).encode()).hexdigest()[:12]
    part = stage_dir(config, "embed") / "parts" / f"{index_fp}-batch-{key}.parquet"
    checkpoint.write_table(part, embeddings_table(rows, embedder.dim, index_fp))
    return len(rows)


def run_embed(config: RagpipeConfig, chunked: StageSummary) -> StageSummary:
    """Embed every chunk; vectors are saved in parts so a crash does not re-embed."""
    started = time.perf_counter()
    here = stage_dir(config, "embed")
    index_fp = index_fingerprint(config)
    plan_id = chunked.plan_id
    reused = reuse_stage(here, "embed", index_fp, chunked.output_fingerprint, plan_id)
    if reused:  # this run embedded nothing: every vector comes from the checkpoint
        n_kept = reused.counts["chunks"] - reused.counts["duplicates_skipped"]
        reused.counts = {**reused.counts, "embedded": 0, "reused": n_kept, "prefix_trimmed": 0}
        return reused
    chunks = read_input(config, chunked, "chunks.parquet", Chunk)
    kept, duplicates = chunks, 0
    if config.embed.dedupe_chunks:
        kept, duplicates = _dedupe(chunks, _indexed_text_shas(config, chunks))

    # Vectors already computed under this fingerprint: the last finished run, then parts.
    parts_dir = here / "parts"
    done = read_embeddings(here / "embeddings.parquet", index_fp)
    for part in sorted(parts_dir.glob(f"{index_fp}-*.parquet")):
        done.update(read_embeddings(part, index_fp))
    todo = [c for c in kept if c.chunk_id not in done]
    reused_n = len(kept) - len(todo)
    stats: Counter[str] = Counter()
    dim = 0
    if todo:
        embedder = make_embedder(config.embed)
        dim = embedder.dim
        sparse = SparseEncoder()
        texts, prefixes, stats = _texts_to_embed(todo, config, embedder)
        progress = reporter()
        progress.start("embed", len(todo))
        if hasattr(embedder, "progress"):
            embedder.progress = progress.advance
        try:
            order = sorted(range(len(todo)), key=lambda i: -len(texts[i]))
            seq = len(list(parts_dir.glob(f"{index_fp}-*.parquet")))
            for start in range(0, len(order), PART_SIZE):
                group = order[start : start + PART_SIZE]
                rows = _embedding_rows(
                    [todo[i] for i in group], [texts[i] for i in group],
                    [prefixes[i] for i in group], embedder, sparse, index_fp,
                )  # fmt: skip
                done.update((r.chunk_id, r) for r in rows)
                part = parts_dir / f"{index_fp}-{seq:05d}.parquet"
                checkpoint.write_table(part, embeddings_table(rows, dim, index_fp))
                seq += 1
        finally:
            progress.finish()
    elif done:
        dim = len(next(iter(done.values())).vector)
    final = [done[c.chunk_id] for c in kept]
    digest = checkpoint.write_table(
        here / "embeddings.parquet", embeddings_table(final, dim or 1, index_fp)
    )
    manifest = checkpoint.Manifest(
        "embed",
        index_fp,
        chunked.output_fingerprint,
        {"embeddings.parquet": digest},
        {
            "chunks": len(chunks),
            "embedded": len(todo),
            "reused": reused_n,
            "duplicates_skipped": duplicates,
            "prefix_trimmed": stats["prefix_trimmed"],
            "dim": dim,
        },
        plan_id=plan_id,
    )
    checkpoint.write_manifest(here, manifest)
    for part in parts_dir.glob("*.parquet"):  # folded into embeddings.parquet
        part.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    logger.info("embed: %d embedded, %d reused in %.1fs", len(todo), reused_n, seconds)
    return StageSummary(
        "embed", manifest.output_fingerprint, manifest.counts, seconds=seconds, plan_id=plan_id
    )


def _indexed_text_shas(config: RagpipeConfig, chunks: Sequence[Chunk]) -> set[str]:
    """Text SHA-256s already indexed for files other than the ones being re-indexed."""
    store = open_store(config.store, embedder_name(config.embed), None)
    if store is None:
        return set()
    redone = {c.file_path for c in chunks}
    try:
        return {
            str(hit.payload.get("text_sha"))
            for hit in store.scroll(fields=["file_path", "text_sha"])
            if hit.payload.get("file_path") not in redone
        }
    finally:
        store.close()


def _dedupe(chunks: Sequence[Chunk], indexed: set[str]) -> tuple[list[Chunk], int]:
    """First chunk per text SHA-256 (in file, then chunk order), skipping indexed texts."""
    seen: set[str] = set(indexed)
    kept: list[Chunk] = []
    for chunk in sorted(chunks, key=lambda c: (c.file_path, c.chunk_index)):
        if chunk.text_sha256 in seen:
            continue
        seen.add(chunk.text_sha256)
        kept.append(chunk)
    return kept, len(chunks) - len(kept)


# -- upsert and delete ---------------------------------------------------------------


def build_points(
    chunks: Sequence[Chunk],
    embedded: dict[str, EmbeddingRow],
    index_fp: str,
    web: dict[str, dict[str, Any]] | None = None,
) -> list[IndexPoint]:
    """Points for the embedded chunks; ``chunk_total`` counts each file's stored chunks.

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
        }
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


def run_upsert(config: RagpipeConfig, embedded: StageSummary) -> StageSummary:
    """Write new versions, then delete stale and vanished files' points.

    Always runs (it is idempotent); with nothing planned it writes nothing.
    """
    started = time.perf_counter()
    index_fp = index_fingerprint(config)
    plan_id = embedded.plan_id
    # Every input checked to be this run's before anything is written.
    entries = read_output(config, "plan", "plan.parquet", PlanEntry, plan_id)
    chunks_path = verify_output(config, "chunk", "chunks.parquet", plan_id)
    vectors = read_embeddings(
        verify_output(config, "embed", "embeddings.parquet", plan_id, embedded.output_fingerprint)
    )
    dim = len(next(iter(vectors.values())).vector) if vectors else 0

    removed = [e for e in entries if e.action == "removed"]
    cleanup = [e for e in entries if e.action == "cleanup"]
    indexed = sum(1 for e in entries if e.stored_versions > 0)
    share = len(removed) / indexed if indexed else 0.0
    hold = bool(removed) and share > config.index.max_delete_share
    hold = hold and not config.index.allow_mass_delete
    counts: Counter[str] = Counter()

    before: FileVersions | None = None  # the store as the plan saw it, if unwritten since
    after: FileVersions | None = None
    points: list[IndexPoint] = []
    store: VectorStore | None = None
    name = embedder_name(config.embed)
    planned = checkpoint.read_manifest(stage_dir(config, "plan"))
    if vectors or cleanup or (removed and not hold):
        before = {} if _edge_absent(config) else saved_versions(config)
        store = open_store(config.store, name, dim if vectors else None)
    else:  # nothing to write or delete: the plan's scroll counted the points
        counts["points_total"] = planned.counts.get("points_total", 0) if planned else 0
    try:
        if store is not None and vectors:
            chunks = checkpoint.read_records(chunks_path, Chunk)
            web = dict(iter_metadata(web_pages(config)))
            points = build_points(chunks, vectors, index_fp, web)
            progress = reporter()
            progress.start("upsert", len(points))
            try:
                store.upsert(points, progress=progress.advance)
            finally:
                progress.finish()
            counts["points_written"] = len(points)
            # Only now that every new version is stored: drop the files' other versions.
            versions = {(p.payload["file_path"], p.payload["source_sha"]) for p in points}
            counts["files_written"] = len(versions)
            # Files the plan saw with no stored version have nothing stale to delete.
            new = {e.file_path for e in entries if e.action == "added" and not e.stored_versions}
            for file_path, sha in sorted(versions):
                if file_path not in new:
                    counts["points_deleted"] += store.delete(_stale(file_path, sha, index_fp))
        if store is not None:
            for entry in cleanup:
                assert entry.source_sha256 is not None
                counts["points_deleted"] += store.delete(
                    _stale(entry.file_path, entry.source_sha256, index_fp)
                )
            if removed and not hold:
                for entry in removed:
                    counts["points_deleted"] += store.delete(
                        Where(must={"file_path": entry.file_path})
                    )
                counts["files_removed"] = len(removed)
            if before is not None:
                after = _versions_after(before, points, index_fp, cleanup, [] if hold else removed)
                counts["points_total"] = _total_points(after)
            else:
                counts["points_total"] = store.count()
    finally:
        if store is not None:
            store.close()
    if after is not None:
        save_versions(config, after)  # the generation is final once the store is closed
    if hold:
        counts["deletions_held"] = len(removed)
    version = _publish(config, counts["points_total"], after, planned, index_fp)
    counts["published"] = int(version is not None)
    seconds = time.perf_counter() - started
    here = stage_dir(config, "upsert")
    result = {
        k: counts.get(k, 0)
        for k in (
            "points_written",
            "files_written",
            "points_deleted",
            "files_removed",
            "deletions_held",
            "points_total",
            "published",
        )
    }
    logger.info("upsert: %s (%.1fs)", ", ".join(f"{k}={v}" for k, v in result.items()), seconds)
    manifest = checkpoint.Manifest(
        "upsert", index_fp, embedded.output_fingerprint, {}, result, plan_id=plan_id
    )
    checkpoint.write_manifest(here, manifest)
    if hold:
        logger.error(
            "holding the deletion of %d of %d indexed files (%.0f%% > index.max_delete_share "
            "%.0f%%)",
            len(removed),
            indexed,
            100 * share,
            100 * config.index.max_delete_share,
        )
    return StageSummary(
        "upsert", manifest.output_fingerprint, result, seconds=seconds, plan_id=plan_id
    )


def _publish(
    config: RagpipeConfig,
    points: int,
    after: FileVersions | None,
    planned: checkpoint.Manifest | None,
    index_fp: str,
) -> published.IndexVersion | None:
    """Publish the Edge store for readers when this run changed it (or it never was)."""
    generation = store_generation(config.store)
    if generation is None:  # qdrant backend, or no store yet
        return None
    if after is not None:
        files = len(after)
    elif (
        planned is not None
        and not planned.counts.get("added")
        and not planned.counts.get("removed")
    ):
        files = planned.counts.get("indexed_files", 0)
    else:
        files = len(stored_versions(config))
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
        f"{stage_dir(config, 'plan') / 'plan.parquet'}."
    )
