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
    """The run's outcome as a Prefect artifact (key ``ingest-summary``)."""
    from prefect.artifacts import create_markdown_artifact

    seconds = ", ".join(f"{stage} {s:.1f}s" for stage, s in summary.seconds.items())
    create_markdown_artifact(
        key="ingest-summary",
        markdown=(
            f"# ingest ({config.store.backend.value}: {config.store.path})\n\n"
            f"`{summary.line()}`\n\n"
            f"- failures: {summary.failed} (see `{config.paths.work_dir / 'failures.parquet'}`)\n"
            f"- deletions held by the mass-deletion guard: {summary.deletions_held}\n"
            f"- seconds per stage: {seconds}\n"
        ),
        description=summary.line(),
    )


@task(name="convert-batch", cache_policy=NO_CACHE)
def convert_batch_task(config: RagpipeConfig, sources: list[SourceFile]) -> int:
    return stages.convert_batch(config, sources)


@task(name="embed-batch", cache_policy=NO_CACHE)
def embed_batch_task(config: RagpipeConfig, chunks: list[Chunk]) -> int:
    return indexing.embed_batch(config, chunks)
