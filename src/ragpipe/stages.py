"""Stage runners: load the previous checkpoint, do the work, write this one.

Each ``run_*`` function is what one Prefect task calls (and what tests call
without Prefect). Layout of the work directory::

    work_dir/discover/{files,failures,skipped}.parquet + manifest.json
    work_dir/fetch/pages.parquet, work_dir/fetch/bodies/   web pages: state, bodies
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
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from ragpipe import checkpoint
from ragpipe.chunk import CHUNK_VERSION, TokenCounter, chunk_document
from ragpipe.clean import CLEAN_VERSION, clean_markdown
from ragpipe.config import RagpipeConfig, fingerprint
from ragpipe.convert import CONVERT_VERSION, Converter
from ragpipe.discover import discover, skip_duplicate_content
from ragpipe.errors import InputError, StageError
from ragpipe.fetch import GONE_CATEGORIES, FetchResult, fetch_pages, prune_bodies
from ragpipe.progress import reporter
from ragpipe.schemas import Chunk, CleanedDocument, Document, Failure, Skip, SourceFile, WebPage

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
    seconds: float = 0.0
    plan_id: str = ""  # the run's plan (see ``read_input``); "" before plan runs


def stage_dir(config: RagpipeConfig, stage: str) -> Path:
    """Directory of one stage's checkpoints."""
    return config.paths.work_dir / stage


def finish_stage(
    directory: Path,
    stage: str,
    config_fp: str,
    input_fp: str,
    outputs: dict[str, tuple[Sequence[Any], type]],
    counts: dict[str, int],
    started: float,
    plan_id: str = "",
) -> StageSummary:
    """Write a stage's outputs, then its manifest (which marks it done)."""
    digests = {
        f"{name}.parquet": checkpoint.write_records(directory / f"{name}.parquet", rows, rtype)
        for name, (rows, rtype) in outputs.items()
    }
    manifest = checkpoint.Manifest(stage, config_fp, input_fp, digests, counts, plan_id=plan_id)
    checkpoint.write_manifest(directory, manifest)  # last: marks the stage done
    seconds = time.perf_counter() - started
    logger.info("%s: %s (%.1fs)", stage, ", ".join(f"{k}={v}" for k, v in counts.items()), seconds)
    return StageSummary(
        stage, manifest.output_fingerprint, counts, seconds=seconds, plan_id=plan_id
    )


def reuse_stage(
    directory: Path, stage: str, config_fp: str, input_fp: str, plan_id: str = ""
) -> StageSummary | None:
    """The finished stage's summary when it already ran on these inputs and config.

    The reused output now belongs to this run's plan: its manifest is stamped with it.
    """
    manifest = checkpoint.is_current(directory, config_fp, input_fp)
    if manifest is None:
        return None
    if manifest.plan_id != plan_id:
        manifest.plan_id = plan_id
        checkpoint.write_manifest(directory, manifest)
    logger.info("%s: inputs and config unchanged, reusing checkpoint", stage)
    return StageSummary(
        stage, manifest.output_fingerprint, manifest.counts, reused=True, plan_id=plan_id
    )


def checked_manifest(config: RagpipeConfig, stage: str, plan_id: str) -> checkpoint.Manifest:
    """The finished ``stage``'s manifest, refused unless it belongs to this run's plan.

    Two runs sharing a work dir for different indexes would otherwise read each
    other's checkpoints (the ingest lock also covers the work dir; this is the
    check that holds whoever writes there).
    """
    directory = stage_dir(config, stage)
    manifest = checkpoint.read_manifest(directory)
    if manifest is None or (plan_id and manifest.plan_id != plan_id):
        found = "no finished stage" if manifest is None else f"plan {manifest.plan_id[:12] or '?'}"
        raise StageError(
            f"the {stage} checkpoint in {directory} is not this run's ({found}; this run's plan "
            f"{plan_id[:12]}): another run wrote into the work dir {config.paths.work_dir} "
            "meanwhile. Give each index its own paths.work_dir and re-run; nothing of this run "
            "was written to the store."
        )
    return manifest


def verify_output(
    config: RagpipeConfig,
    stage: str,
    name: str,
    plan_id: str,
    output_fingerprint: str | None = None,
) -> Path:
    """The path of one output of a finished ``stage``, checked to be this run's.

    The manifest must be of this run's plan (once the run has one) and, when given,
    have ``output_fingerprint``; the file must still have the SHA-256 it records.
    """
    directory = stage_dir(config, stage)
    manifest = checked_manifest(config, stage, plan_id)
    path = directory / name
    recorded = {name: manifest.outputs.get(name, "")}
    same = output_fingerprint is None or manifest.output_fingerprint == output_fingerprint
    if not same or not checkpoint.outputs_intact(directory, replace(manifest, outputs=recorded)):
        raise StageError(
            f"{path} is not the file its stage finished with (another run writing into the "
            f"work dir {config.paths.work_dir}?). Give each index its own paths.work_dir and "
            "re-run; nothing of this run was written to the store."
        )
    return path


def read_output(
    config: RagpipeConfig, stage: str, name: str, record_type: type[T], plan_id: str
) -> list[T]:
    """Read one output of a finished ``stage`` (see ``verify_output``)."""
    return checkpoint.read_records(verify_output(config, stage, name, plan_id), record_type)


def read_input(
    config: RagpipeConfig, previous: StageSummary, name: str, record_type: type[T]
) -> list[T]:
    """Read an output of the stage ``previous`` summarises (see ``read_output``)."""
    path = verify_output(
        config, previous.stage, name, previous.plan_id, previous.output_fingerprint
    )
    return checkpoint.read_records(path, record_type)


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
    """Find and hash files, fetch web pages; always runs (it is how changes are seen)."""
    started = time.perf_counter()
    here = stage_dir(config, "discover")
    stale = checkpoint.remove_stale_temps(config.paths.work_dir)
    if stale:
        logger.warning("removed %d temp files left by an interrupted run", stale)
    result = discover(config.discover, roots)
    web = run_fetch(config)
    result.failures.extend(web.failures)
    result.skipped.extend(web.skipped)
    if web.files:
        result.files = sorted([*result.files, *web.files], key=lambda f: f.file_path)
        if config.discover.dedupe_content:  # a page redirected to another listed page
            skip_duplicate_content(result)
    roots_used = [str(r) for r in (roots or config.discover.roots)]
    config_fp = checkpoint.combine_fingerprints(
        [fingerprint(config.discover, "1"), json.dumps(roots_used)]
    )
    counts = {
        "seen": len(result.files),
        "failed": len(result.failures),
        "skipped": len(result.skipped),
    }
    if web.requests or web.pages:
        counts |= {
            "pages": len(web.files),
            "pages_not_modified": web.not_modified,
            "pages_downloaded": web.downloaded,
            "requests": web.requests,
        }
    return finish_stage(
        here,
        "discover",
        config_fp,
        "",
        {
            "files": (result.files, SourceFile),
            "failures": (result.failures, Failure),
            "skipped": (result.skipped, Skip),
        },
        counts,
        started,
    )


def web_pages(config: RagpipeConfig) -> list[WebPage]:
    """The fetch state: what the last run fetched of each web page ([] when none)."""
    path = stage_dir(config, "fetch") / "pages.parquet"
    if not path.is_file():
        return []
    try:
        return checkpoint.read_records(path, WebPage)
    except (StageError, ValueError) as exc:
        logger.warning("fetch state %s unreadable (%s); fetching every page in full", path, exc)
        return []


def run_fetch(config: RagpipeConfig) -> FetchResult:
    """Fetch ``discover.urls`` and ``discover.sitemaps``, then save the fetch state.

    The state is written after every body it names (bodies are written as
    they arrive), so it never points at a body that is not on disk.
    """
    here = stage_dir(config, "fetch")
    previous = web_pages(config)
    if not (config.discover.urls or config.discover.sitemaps):
        if previous:  # URL sources were removed from the config: forget them
            checkpoint.write_records(here / "pages.parquet", [], WebPage)
            prune_bodies(here / "bodies", [])
        return FetchResult()
    progress = reporter()
    started: list[int] = []  # the page count is known once the sitemaps are read

    def start(total: int) -> None:
        started.append(total)
        progress.start("fetch", total)

    try:
        result = fetch_pages(
            config.fetch,
            config.discover.urls,
            config.discover.sitemaps,
            here / "bodies",
            previous,
            progress=progress.advance,
            on_total=start,
        )
    finally:
        if started:
            progress.finish()
    # Pages that failed this time keep their last state: the next run asks conditionally.
    failed = {f.file_path for f in result.failures if f.category not in GONE_CATEGORIES}
    failed -= {p.url for p in result.pages}
    kept = [p for p in previous if p.url in failed]
    pages = sorted([*result.pages, *kept], key=lambda p: p.url)
    checkpoint.write_records(here / "pages.parquet", pages, WebPage)
    prune_bodies(here / "bodies", pages)
    return result


# -- convert -------------------------------------------------------------------------


def _cache_key(source: SourceFile, config_fp: str) -> str:
    raw = f"{source.file_path}\x1f{source.sha256}\x1f{config_fp}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def _convert_fingerprint(converter: Converter) -> str:
    # auto mode resolves to the converter actually available; it is part of the key.
    resolved = converter.pdf_converter_name()
    return checkpoint.combine_fingerprints(
        [fingerprint(converter.config, CONVERT_VERSION), resolved]
    )


def convert_batches(
    config: RagpipeConfig, planned: StageSummary, size: int
) -> list[list[SourceFile]]:
    """The planned files not converted yet, in batches of ``size`` (for fan-out)."""
    sources = checkpoint.read_records(
        stage_dir(config, planned.stage) / "files.parquet", SourceFile
    )
    cache_dir = stage_dir(config, "convert") / "cache"
    config_fp = _convert_fingerprint(Converter(config.convert))
    todo = [s for s in sources if not (cache_dir / f"{_cache_key(s, config_fp)}.parquet").is_file()]
    return [todo[i : i + size] for i in range(0, len(todo), size)]


def convert_batch(config: RagpipeConfig, sources: Sequence[SourceFile]) -> int:
    """Convert ``sources`` into the per-document cache; returns how many were converted.

    Run in parallel (one batch per worker) before ``run_convert``, which then
    finds them cached. A file that fails here is left to ``run_convert``,
    which records its failure row.
    """
    converter = Converter(config.convert)
    config_fp = _convert_fingerprint(converter)
    cache_dir = stage_dir(config, "convert") / "cache"
    converted = 0
    for source in sources:
        cached = cache_dir / f"{_cache_key(source, config_fp)}.parquet"
        if cached.is_file():
            continue
        try:
            doc = converter.convert(source, config_fp)
        except (InputError, StageError):
            continue
        checkpoint.write_records(cached, [doc], Document)
        converted += 1
    return converted


def run_convert(config: RagpipeConfig, discovered: StageSummary) -> StageSummary:
    """Convert every discovered file, reusing per-document cache entries."""
    started = time.perf_counter()
    here = stage_dir(config, "convert")
    converter = Converter(config.convert)
    config_fp = _convert_fingerprint(converter)
    plan_id = discovered.plan_id
    reused = reuse_stage(here, "convert", config_fp, discovered.output_fingerprint, plan_id)
    if reused:
        reused.counts = {
            **reused.counts,
            "converted": 0,
            "skipped_unchanged": reused.counts["documents"],
        }
        return reused
    # The files to convert: the plan's (only new and changed files) or discover's (all).
    sources = read_input(config, discovered, "files.parquet", SourceFile)
    cache_dir = here / "cache"
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
    return finish_stage(
        here,
        "convert",
        config_fp,
        discovered.output_fingerprint,
        {"documents": (docs, Document), "failures": (failures, Failure)},
        counts,
        started,
        plan_id,
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
    started = time.perf_counter()
    here = stage_dir(config, "clean")
    config_fp = fingerprint(config.clean, CLEAN_VERSION)
    reused = reuse_stage(here, "clean", config_fp, converted.output_fingerprint, converted.plan_id)
    if reused:
        return reused
    docs = read_input(config, converted, "documents.parquet", Document)

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
    return finish_stage(
        here,
        "clean",
        config_fp,
        converted.output_fingerprint,
        {"documents": (cleaned, CleanedDocument), "failures": (failures, Failure)},
        counts,
        started,
        converted.plan_id,
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
    started = time.perf_counter()
    here = stage_dir(config, "chunk")
    config_fp = chunk_fingerprint(config)
    reused = reuse_stage(here, "chunk", config_fp, cleaned.output_fingerprint, cleaned.plan_id)
    if reused:
        return reused
    docs = read_input(config, cleaned, "documents.parquet", CleanedDocument)
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
    return finish_stage(
        here,
        "chunk",
        config_fp,
        cleaned.output_fingerprint,
        {"chunks": (chunks, Chunk), "failures": (failures, Failure)},
        counts,
        started,
        cleaned.plan_id,
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
    added: int = 0
    changed: int = 0
    removed: int = 0
    chunks_written: int = 0
    chunks_deleted: int = 0
    deletions_held: int = 0
    indexed_files: int = 0
    points_total: int = 0
    failures_by_category: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    stages: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.deletions_held == 0

    def line(self) -> str:
        """One greppable line: the counts a nightly log needs."""
        return (
            f"seen={self.seen} added={self.added} changed={self.changed} "
            f"unchanged={self.skipped_unchanged} removed={self.removed} failed={self.failed} "
            f"chunks-written={self.chunks_written} chunks-deleted={self.chunks_deleted} "
            f"points={self.points_total} skipped={self.skipped}"
            + (f" deletions-held={self.deletions_held}" if self.deletions_held else "")
        )


STAGES_WITH_FAILURES = ("discover", "convert", "clean", "chunk")


def failures_path(work_dir: Path) -> Path:
    """The last run's failure rows, every stage's together."""
    return work_dir / "failures.parquet"


def read_failures(work_dir: Path) -> list[Failure]:
    """The last run's failure rows (none before the first run)."""
    path = failures_path(work_dir)
    return checkpoint.read_records(path, Failure) if path.is_file() else []


def write_summary(config: RagpipeConfig, stages: Sequence[StageSummary]) -> IngestSummary:
    """Gather every stage's failures into one table and write the run summary."""
    work = config.paths.work_dir
    failures: list[Failure] = []
    for stage in STAGES_WITH_FAILURES:
        path = work / stage / "failures.parquet"
        if path.is_file():
            failures.extend(checkpoint.read_records(path, Failure))
    checkpoint.write_records(failures_path(work), failures, Failure)
    by_stage = {s.stage: s.counts for s in stages}
    plan = by_stage.get("plan")
    upsert = by_stage.get("upsert", {})
    convert_counts = by_stage.get("convert", {})
    summary = IngestSummary(
        seen=by_stage.get("discover", {}).get("seen", 0),
        converted=convert_counts.get("converted", 0),
        skipped_unchanged=(
            plan.get("unchanged", 0) + plan.get("cleanup", 0)
            if plan is not None
            else convert_counts.get("skipped_unchanged", 0)
        ),
        failed=len(failures),
        chunks=by_stage.get("chunk", {}).get("chunks", 0),
        skipped=by_stage.get("discover", {}).get("skipped", 0),
        added=(plan or {}).get("added", 0),
        changed=(plan or {}).get("changed", 0),
        removed=upsert.get("files_removed", 0),
        chunks_written=upsert.get("points_written", 0),
        chunks_deleted=upsert.get("points_deleted", 0),
        deletions_held=upsert.get("deletions_held", 0),
        indexed_files=(plan or {}).get("indexed_files", 0),
        points_total=upsert.get("points_total", 0),
        failures_by_category=dict(Counter(f"{f.stage}:{f.category}" for f in failures)),
        seconds={s.stage: round(s.seconds, 3) for s in stages},
        stages=by_stage,
    )
    payload = {**asdict(summary), "failures": [asdict(f) for f in failures]}
    checkpoint.atomic_write_bytes(work / "summary.json", json.dumps(payload, indent=2).encode())
    logger.info("ingest: %s", summary.line())
    return summary
