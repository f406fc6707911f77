"""Ingest tasks: one library call each; checkpoints are the library's job.

Prefect's own caching is off: ragpipe's manifests know the config and input
fingerprints, which Prefect's source-hash cache policies cannot see.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from ragpipe import indexing, stages
from ragpipe.config import RagpipeConfig
from ragpipe.schemas import Chunk, SourceFile
from ragpipe.stages import IngestSummary, StageSummary


@task(name="discover", cache_policy=NO_CACHE)
def discover_task(config: RagpipeConfig, roots: list[Path] | None = None) -> StageSummary:
    return stages.run_discover(config, roots)


@task(name="plan", cache_policy=NO_CACHE)
def plan_task(config: RagpipeConfig, discovered: StageSummary) -> StageSummary:
    return indexing.run_plan(config, discovered)


@task(name="convert", cache_policy=NO_CACHE)
def convert_task(config: RagpipeConfig, planned: StageSummary) -> StageSummary:
    return stages.run_convert(config, planned)


@task(name="clean", cache_policy=NO_CACHE)
def clean_task(config: RagpipeConfig, converted: StageSummary) -> StageSummary:
    return stages.run_clean(config, converted)


@task(name="chunk", cache_policy=NO_CACHE)
def chunk_task(config: RagpipeConfig, cleaned: StageSummary) -> StageSummary:
    return stages.run_chunk(config, cleaned)


@task(name="embed", cache_policy=NO_CACHE)
def embed_task(config: RagpipeConfig, chunked: StageSummary) -> StageSummary:
    return indexing.run_embed(config, chunked)


@task(name="upsert", cache_policy=NO_CACHE)
def upsert_task(config: RagpipeConfig, embedded: StageSummary) -> StageSummary:
    return indexing.run_upsert(config, embedded)


@task(name="summarise", cache_policy=NO_CACHE)
def summary_task(config: RagpipeConfig, stage_summaries: list[StageSummary]) -> IngestSummary:
    return stages.write_summary(config, stage_summaries)


@task(name="publish-ingest", cache_policy=NO_CACHE)
def publish_ingest_task(config: RagpipeConfig, summary: IngestSummary) -> None:
    """The run's outcome as Prefect artifacts: ``ingest-summary`` and, when files failed,
    ``ingest-failures`` (one row per failure: stage, category, file, reason)."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    seconds = ", ".join(f"{stage} {s:.1f}s" for stage, s in summary.seconds.items())
    failures = stages.read_failures(config.paths.work_dir)
    create_markdown_artifact(
        key="ingest-summary",
        markdown=(
            f"# ingest ({config.store.backend.value}: {config.store.path})\n\n"
            f"`{summary.line()}`\n\n"
            f"- failures: {summary.failed}"
            + (" (table artifact `ingest-failures`)" if failures else "")
            + f"\n- deletions held by the mass-deletion guard: {summary.deletions_held}\n"
            f"- seconds per stage: {seconds}\n"
        ),
        description=summary.line(),
    )
    if failures:
        rows = [{"stage": f.stage, "category": f.category, "file": f.file_path,
                 "reason": f.message} for f in failures]  # fmt: skip
        create_table_artifact(
            key="ingest-failures",
            table=rows,
            description=f"{len(rows)} file(s) not indexed this run, and why",
        )


@task(name="convert-batch", cache_policy=NO_CACHE)
def convert_batch_task(config: RagpipeConfig, sources: list[SourceFile]) -> int:
    return stages.convert_batch(config, sources)


@task(name="embed-batch", cache_policy=NO_CACHE)
def embed_batch_task(config: RagpipeConfig, chunks: list[Chunk]) -> int:
    return indexing.embed_batch(config, chunks)
