"""The embed stage: dense vectors (and BM25 terms) of the chunks to write.

Chunks are embedded in parts of ``PART_SIZE``, each written durably before
the next, so a crash resumes with the parts already done. A chunk whose text
is already indexed for another file can be skipped (``embed.dedupe_chunks``);
the file's first stored point then names the files holding its skipped texts
(``HELD_BY``), so that the plan re-indexes it when one of them changes or goes.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from ragpipe import checkpoint
from ragpipe.config import RagpipeConfig
from ragpipe.ingest import runner
from ragpipe.ingest.chunk import TokenCounter
from ragpipe.ingest.plan import HELD_BY, index_fingerprint, point_id
from ragpipe.models.embedders import (
    Embedder,
    contextual_text,
    fit_context,
    make_embedder,
)
from ragpipe.progress import reporter
from ragpipe.schemas import Chunk, PlanEntry
from ragpipe.store import SparseEncoder, VectorStore

logger = logging.getLogger(__name__)


PART_SIZE = 1024  # chunks embedded between two durable parts


# -- embed ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbeddingRow:
    """One chunk's vectors as checkpointed by *embed*.

    ``prefix`` is the contextual prefix the dense vector was computed with;
    the BM25 term weights are over the same prefixed text. ``held_by``: the
    files holding texts this chunk's file skipped as duplicates (on the file's
    first kept chunk only; see ``HELD_BY``).
    """

    chunk_id: str
    point_id: str
    prefix: str
    vector: npt.NDArray[np.float32]
    sparse_indices: list[int]
    sparse_values: list[float]
    held_by: tuple[str, ...] = ()


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
            HELD_BY: pa.array([list(r.held_by) for r in rows], pa.list_(pa.string())),
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
    held = (
        table.column(HELD_BY).to_pylist()
        if HELD_BY in table.column_names
        else [None] * table.num_rows
    )
    return {
        cid: EmbeddingRow(cid, pid, prefix, matrix[i], indices, values, tuple(by or ()))
        for i, (cid, pid, prefix, indices, values, by) in enumerate(
            zip(*columns, held, strict=True)
        )
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
    work = runner.WorkDir.of(config)
    done = set(read_embeddings(work.embeddings, index_fp))
    for part in sorted(work.embed_parts.glob(f"{index_fp}-*.parquet")):
        done.update(read_embeddings(part, index_fp))
    return done


def embed_batches(config: RagpipeConfig, size: int) -> list[list[Chunk]]:
    """The chunked chunks without vectors yet, in batches of ``size`` (for fan-out)."""
    chunks = checkpoint.read_records(runner.WorkDir.of(config).chunks, Chunk)
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
    part = runner.WorkDir.of(config).embed_parts / f"{index_fp}-batch-{key}.parquet"
    checkpoint.write_table(part, embeddings_table(rows, embedder.dim, index_fp))
    return len(rows)


@dataclass
class EmbedCounts(runner.Counts):
    """Chunks in, vectors computed now or reused, duplicates skipped, the dimension."""

    chunks: int = 0
    embedded: int = 0
    reused: int = 0
    duplicates_skipped: int = 0
    prefix_trimmed: int = 0
    dim: int = 0

    def mark_reused(self) -> None:
        self.reused, self.embedded = self.chunks - self.duplicates_skipped, 0
        self.prefix_trimmed = 0


def run_embed(
    config: RagpipeConfig,
    chunked: runner.StageSummary[Any],
    store: runner.RunStore | None = None,
) -> runner.StageSummary[EmbedCounts]:
    """Embed every chunk; vectors are saved in parts so a crash does not re-embed.

    ``store``: the run's (see ``RunStore``), read for chunks indexed already when
    ``embed.dedupe_chunks``; without it the stage opens its own.
    """
    started = time.perf_counter()
    work = runner.WorkDir.of(config)
    here = work.stage("embed")
    index_fp = index_fingerprint(config)
    plan_id = chunked.plan_id
    reused = runner.reuse_stage(
        here, "embed", index_fp, chunked.output_fingerprint, EmbedCounts, plan_id
    )
    if reused:  # this run embedded nothing: every vector comes from the checkpoint
        return reused
    chunks = runner.read_input(config, chunked, "chunks.parquet", Chunk)
    kept, duplicates = chunks, 0
    held_by: dict[str, tuple[str, ...]] = {}
    if config.embed.dedupe_chunks:
        entries = runner.read_output(config, "plan", "plan.parquet", PlanEntry, plan_id)
        with runner.stage_store(config, store) as stores:
            indexed = _indexed_text_shas(stores.existing(), chunks, entries, index_fp)
            kept, held_by = _dedupe(chunks, indexed)
            duplicates = len(chunks) - len(kept)

    # Vectors already computed under this fingerprint: the last finished run, then parts.
    parts_dir = work.embed_parts
    done = read_embeddings(work.embeddings, index_fp)
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
    # This run's holders, on each file's first kept chunk (a reused row keeps none of its own).
    final = [replace(done[c.chunk_id], held_by=held_by.get(c.chunk_id, ())) for c in kept]
    digest = checkpoint.write_table(work.embeddings, embeddings_table(final, dim or 1, index_fp))
    counts = EmbedCounts(len(chunks), len(todo), reused_n, duplicates, stats["prefix_trimmed"], dim)
    summary = runner.record_stage(
        here, "embed", index_fp, chunked.output_fingerprint,
        {work.embeddings.name: digest}, counts, started, plan_id,
    )  # fmt: skip
    for part in parts_dir.glob("*.parquet"):  # folded into embeddings.parquet
        part.unlink(missing_ok=True)
    return summary


def _indexed_text_shas(
    store: VectorStore | None,
    chunks: Sequence[Chunk],
    entries: Sequence[PlanEntry],
    index_fp: str,
) -> dict[str, str]:
    """Text SHA-256 -> the file holding it (the first by path), of the points this run
    keeps: not those of files it re-indexes or removes, nor stale versions of the files it
    keeps (upsert deletes them once the new points are in). A text counted from a point the
    run then deletes was skipped for the file that holds it now, and lost: a new file
    repeating a removed file's paragraph, or a rerun after a kill with the old version of a
    changed file still stored."""
    if store is None:
        return {}
    redone = {c.file_path for c in chunks}
    plan = {e.file_path: e for e in entries}
    kept: dict[str, str] = {}
    fields = ["file_path", "text_sha", "source_sha", "config_fingerprint"]
    for hit in store.scroll(fields=fields):
        path = hit.payload.get("file_path")
        if path in redone:
            continue
        entry = plan.get(str(path))
        if entry is not None:  # files with no entry (under a missing root) keep every point
            if entry.action == "removed":
                continue
            version = (hit.payload.get("source_sha"), hit.payload.get("config_fingerprint"))
            if version != (entry.source_sha256, index_fp):
                continue
        text = str(hit.payload.get("text_sha"))
        kept[text] = min(kept.get(text, str(path)), str(path))
    return kept


def _dedupe(
    chunks: Sequence[Chunk], indexed: dict[str, str]
) -> tuple[list[Chunk], dict[str, tuple[str, ...]]]:
    """First chunk per text SHA-256 (in file, then chunk order), skipping indexed texts.

    ``indexed``: text SHA-256 -> the file whose point holds it. Returns the kept chunks and,
    for each file that skipped a text another file holds, its first kept chunk's id -> those
    files, sorted (a file that skipped every chunk has no point to say it on: it stays
    unstored, and every run plans it as added).
    """
    holder: dict[str, str] = dict(indexed)
    kept: list[Chunk] = []
    skipped_for: dict[str, set[str]] = {}
    first_kept: dict[str, str] = {}
    for chunk in sorted(chunks, key=lambda c: (c.file_path, c.chunk_index)):
        held = holder.get(chunk.text_sha256)
        if held is not None:
            if held != chunk.file_path:  # a repeat within the file needs no other
                skipped_for.setdefault(chunk.file_path, set()).add(held)
            continue
        holder[chunk.text_sha256] = chunk.file_path
        kept.append(chunk)
        first_kept.setdefault(chunk.file_path, chunk.chunk_id)
    held_by = {
        first_kept[path]: tuple(sorted(files))
        for path, files in skipped_for.items()
        if path in first_kept
    }
    return kept, held_by
