"""Stage runners: load the previous checkpoint, do the work, write this one.

Each ``run_*`` function is what one Prefect task calls (and what tests call
without Prefect). Layout of the work directory::

    work_dir/discover/{files,failures,skipped}.parquet + manifest.json
    work_dir/convert/{documents,failures}.parquet + manifest.json
    work_dir/convert/cache/<key>.parquet      one per converted document
    work_dir/clean/{documents,failures}.parquet + manifest.json
    work_dir/chunk/{chunks,failures}.parquet + manifest.json
    work_dir/failures.parquet, work_dir/summary.json   written last

A stage whose manifest matches its config fingerprint and its input's
fingerprint is skipped. Conversion, the slow stage, also caches each
document as soon as it is converted, so a crash mid-batch resumes with the
documents already done.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ragpipe import checkpoint
from ragpipe.chunk import CHUNK_VERSION, TokenCounter, chunk_document
from ragpipe.clean import CLEAN_VERSION, clean_markdown
from ragpipe.config import RagpipeConfig, fingerprint
from ragpipe.convert import CONVERT_VERSION, Converter
from ragpipe.discover import discover
from ragpipe.errors import InputError, StageError
from ragpipe.progress import reporter
from ragpipe.schemas import Chunk, CleanedDocument, Document, Failure, Skip, SourceFile

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class StageSummary:
    """Counts of one stage run (small enough to pass between tasks)."""

    stage: str
    output_fingerprint: str
    counts: dict[str, int]
    reused: bool = False


def _stage_dir(config: RagpipeConfig, stage: str) -> Path:
    return config.paths.work_dir / stage


def _finish(
    stage_dir: Path,
    stage: str,
    config_fp: str,
    input_fp: str,
    outputs: dict[str, tuple[Sequence[Any], type]],
    counts: dict[str, int],
) -> StageSummary:
    digests = {
        f"{name}.parquet": checkpoint.write_records(stage_dir / f"{name}.parquet", rows, rtype)
        for name, (rows, rtype) in outputs.items()
    }
    manifest = checkpoint.Manifest(stage, config_fp, input_fp, digests, counts)
    checkpoint.write_manifest(stage_dir, manifest)  # last: marks the stage done
    logger.info("%s: %s", stage, ", ".join(f"{k}={v}" for k, v in counts.items()))
    return StageSummary(stage, manifest.output_fingerprint, counts)


def _reuse(stage_dir: Path, stage: str, config_fp: str, input_fp: str) -> StageSummary | None:
    manifest = checkpoint.is_current(stage_dir, config_fp, input_fp)
    if manifest is None:
        return None
    logger.info("%s: inputs and config unchanged, reusing checkpoint", stage)
    return StageSummary(stage, manifest.output_fingerprint, manifest.counts, reused=True)


def _per_document(
    stage: str,
    items: Sequence[T],
    work: Callable[[T], R],
    key: Callable[[T], tuple[str, str | None]],
) -> tuple[list[R], list[Failure]]:
    """Run ``work`` on each item; an error in one item becomes a failure row."""
    done: list[R] = []
    failures: list[Failure] = []
    progress = reporter()
    progress.start(stage, len(items))
    try:
        for item in items:
            try:
                done.append(work(item))
            except InputError as exc:
                path, sha = key(item)
                failures.append(Failure(path, stage, exc.category, str(exc), sha))
            except StageError:
                raise
            except Exception as exc:  # one bad document never sinks the batch
                path, sha = key(item)
                logger.exception("%s failed on %s", stage, path)
                failures.append(Failure(path, stage, "error", f"{type(exc).__name__}: {exc}", sha))
            progress.advance(1)
    finally:
        progress.finish()
    return done, failures


# -- discover ------------------------------------------------------------------------


def run_discover(config: RagpipeConfig, roots: list[Path] | None = None) -> StageSummary:
    """Find and hash files; always runs (hashing is how changes are seen)."""
    stage_dir = _stage_dir(config, "discover")
    result = discover(config.discover, roots)
    roots_used = [str(r) for r in (roots or config.discover.roots)]
    config_fp = checkpoint.combine_fingerprints(
        [fingerprint(config.discover, "1"), json.dumps(roots_used)]
    )
    counts = {
        "seen": len(result.files),
        "failed": len(result.failures),
        "skipped": len(result.skipped),
    }
    return _finish(
        stage_dir,
        "discover",
        config_fp,
        "",
        {
            "files": (result.files, SourceFile),
            "failures": (result.failures, Failure),
            "skipped": (result.skipped, Skip),
        },
        counts,
    )


# -- convert -------------------------------------------------------------------------


def _cache_key(source: SourceFile, config_fp: str) -> str:
    raw = f"{source.file_path}\x1f{source.sha256}\x1f{config_fp}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def run_convert(config: RagpipeConfig, discovered: StageSummary) -> StageSummary:
    """Convert every discovered file, reusing per-document cache entries."""
    stage_dir = _stage_dir(config, "convert")
    converter = Converter(config.convert)
    # auto mode resolves to the converter actually available; it is part of the key.
    resolved = converter.pdf_converter_name()
    config_fp = checkpoint.combine_fingerprints(
        [fingerprint(config.convert, CONVERT_VERSION), resolved]
    )
    reused = _reuse(stage_dir, "convert", config_fp, discovered.output_fingerprint)
    if reused:
        reused.counts = {
            **reused.counts,
            "converted": 0,
            "skipped_unchanged": reused.counts["documents"],
        }
        return reused
    sources = checkpoint.read_records(_stage_dir(config, "discover") / "files.parquet", SourceFile)
    cache_dir = stage_dir / "cache"
    stats: Counter[str] = Counter()

    def convert_one(source: SourceFile) -> Document:
        cached = cache_dir / f"{_cache_key(source, config_fp)}.parquet"
        if cached.is_file():
            try:
                (doc,) = checkpoint.read_records(cached, Document)
                stats["skipped_unchanged"] += 1
                return doc
            except (StageError, ValueError):
                logger.warning("convert cache entry %s unreadable; converting again", cached)
        doc = converter.convert(source, config_fp)
        checkpoint.write_records(cached, [doc], Document)  # durable before counted done
        stats["converted"] += 1
        return doc

    docs, failures = _per_document(
        "convert", sources, convert_one, lambda s: (s.file_path, s.sha256)
    )
    _prune_cache(cache_dir, {_cache_key(s, config_fp) for s in sources})
    counts = {
        "documents": len(docs),
        "converted": stats["converted"],
        "skipped_unchanged": stats["skipped_unchanged"],
        "failed": len(failures),
        **{f"converter:{k}": v for k, v in Counter(d.converter for d in docs).items()},
    }
    return _finish(
        stage_dir,
        "convert",
        config_fp,
        discovered.output_fingerprint,
        {"documents": (docs, Document), "failures": (failures, Failure)},
        counts,
    )


def _prune_cache(cache_dir: Path, keep: set[str]) -> None:
    """Drop cache entries of files that no longer exist or changed."""
    if not cache_dir.is_dir():
        return
    for entry in cache_dir.glob("*.parquet"):
        if entry.stem not in keep:
            entry.unlink(missing_ok=True)


# -- clean ---------------------------------------------------------------------------


def run_clean(config: RagpipeConfig, converted: StageSummary) -> StageSummary:
    """Clean every converted document."""
    stage_dir = _stage_dir(config, "clean")
    config_fp = fingerprint(config.clean, CLEAN_VERSION)
    reused = _reuse(stage_dir, "clean", config_fp, converted.output_fingerprint)
    if reused:
        return reused
    docs = checkpoint.read_records(_stage_dir(config, "convert") / "documents.parquet", Document)

    def clean_one(doc: Document) -> CleanedDocument:
        result = clean_markdown(doc.markdown, config.clean)
        if not result.markdown.strip():
            raise InputError("no_text", "nothing left after cleaning (all boilerplate?)")
        return CleanedDocument(
            doc_id=doc.doc_id,
            file_path=doc.file_path,
            source_sha256=doc.source_sha256,
            kind=doc.kind,
            converter=doc.converter,
            markdown=result.markdown,
            dropped=result.dropped,
            config_fingerprint=config_fp,
        )

    cleaned, failures = _per_document(
        "clean", docs, clean_one, lambda d: (d.file_path, d.source_sha256)
    )
    dropped: Counter[str] = Counter()
    for doc in cleaned:
        dropped.update(doc.dropped)
    counts = {
        "documents": len(cleaned),
        "failed": len(failures),
        **{f"dropped:{k}": v for k, v in sorted(dropped.items())},
    }
    return _finish(
        stage_dir,
        "clean",
        config_fp,
        converted.output_fingerprint,
        {"documents": (cleaned, CleanedDocument), "failures": (failures, Failure)},
        counts,
    )


# -- chunk ---------------------------------------------------------------------------


def chunk_fingerprint(config: RagpipeConfig) -> str:
    """Fingerprint stored on chunks: chunking config plus everything upstream of it."""
    return checkpoint.combine_fingerprints(
        [
            fingerprint(config.convert, CONVERT_VERSION),
            fingerprint(config.clean, CLEAN_VERSION),
            fingerprint(config.chunk, CHUNK_VERSION),
        ]
    )


def run_chunk(config: RagpipeConfig, cleaned: StageSummary) -> StageSummary:
    """Chunk every cleaned document."""
    stage_dir = _stage_dir(config, "chunk")
    config_fp = chunk_fingerprint(config)
    reused = _reuse(stage_dir, "chunk", config_fp, cleaned.output_fingerprint)
    if reused:
        return reused
    docs = checkpoint.read_records(
        _stage_dir(config, "clean") / "documents.parquet", CleanedDocument
    )
    counter = TokenCounter(config.chunk.tokenizer)

    def chunk_one(doc: CleanedDocument) -> list[Chunk]:
        return chunk_document(doc, doc.kind, config.chunk, config_fp, counter)

    per_doc, failures = _per_document(
        "chunk", docs, chunk_one, lambda d: (d.file_path, d.source_sha256)
    )
    chunks = [c for doc_chunks in per_doc for c in doc_chunks]
    counts = {
        "documents": len(per_doc),
        "chunks": len(chunks),
        "failed": len(failures),
        "max_tokens_seen": max((c.token_count for c in chunks), default=0),
    }
    return _finish(
        stage_dir,
        "chunk",
        config_fp,
        cleaned.output_fingerprint,
        {"chunks": (chunks, Chunk), "failures": (failures, Failure)},
        counts,
    )


# -- summary -------------------------------------------------------------------------


@dataclass
class IngestSummary:
    """What one ingest run did, end to end."""

    seen: int
    converted: int
    skipped_unchanged: int
    failed: int
    chunks: int
    skipped: int = 0  # not ingested on purpose: symlinks not followed, unsupported types
    failures_by_category: dict[str, int] = field(default_factory=dict)
    stages: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failed == 0


def write_summary(config: RagpipeConfig, stages: Sequence[StageSummary]) -> IngestSummary:
    """Gather every stage's failures into one table and write the run summary."""
    work = config.paths.work_dir
    failures: list[Failure] = []
    for stage in ("discover", "convert", "clean", "chunk"):
        path = work / stage / "failures.parquet"
        if path.is_file():
            failures.extend(checkpoint.read_records(path, Failure))
    checkpoint.write_records(work / "failures.parquet", failures, Failure)
    by_stage = {s.stage: s.counts for s in stages}
    convert_counts = by_stage.get("convert", {})
    summary = IngestSummary(
        seen=by_stage.get("discover", {}).get("seen", 0),
        converted=convert_counts.get("converted", 0),
        skipped_unchanged=convert_counts.get("skipped_unchanged", 0),
        failed=len(failures),
        chunks=by_stage.get("chunk", {}).get("chunks", 0),
        skipped=by_stage.get("discover", {}).get("skipped", 0),
        failures_by_category=dict(Counter(f"{f.stage}:{f.category}" for f in failures)),
        stages=by_stage,
    )
    payload = {**asdict(summary), "failures": [asdict(f) for f in failures]}
    checkpoint.atomic_write_bytes(work / "summary.json", json.dumps(payload, indent=2).encode())
    logger.info(
        "ingest: seen=%d converted=%d skipped_unchanged=%d failed=%d chunks=%d",
        summary.seen,
        summary.converted,
        summary.skipped_unchanged,
        summary.failed,
        summary.chunks,
    )
    return summary
