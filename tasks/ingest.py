"""Ingest tasks: one library call each; checkpoints are the library's job.

Prefect's own caching is off: ragpipe's manifests know the config and input
fingerprints, which Prefect's source-hash cache policies cannot see.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from ragpipe.config import RagpipeConfig
from ragpipe.ingest.convert import convert_batch
from ragpipe.ingest.embed import embed_batch
from ragpipe.ingest.gatekeep import Decision, decide
from ragpipe.ingest.pipeline import STAGES
from ragpipe.ingest.runner import StageSummary, WorkDir
from ragpipe.ingest.summary import IngestSummary, read_failures, write_summary
from ragpipe.schemas import Chunk, SourceFile

# One task per stage of the library's one stage list, named after it.
STAGE_TASKS = {
    stage.name: task(name=stage.name, cache_policy=NO_CACHE)(stage.run) for stage in STAGES
}


@task(name="summarise", cache_policy=NO_CACHE)
def summary_task(config: RagpipeConfig, stage_summaries: list[StageSummary[Any]]) -> IngestSummary:
    return write_summary(config, stage_summaries)


@task(name="index-gate", cache_policy=NO_CACHE)
def gate_task(config: RagpipeConfig) -> Decision | None:
    """Promote or hold the version this run staged (``index.gate``); None: no gate."""
    return decide(config)


@task(name="publish-ingest", cache_policy=NO_CACHE)
def publish_ingest_task(config: RagpipeConfig, summary: IngestSummary) -> None:
    """The run's outcome as Prefect artifacts: ``ingest-summary`` and, when files failed,
    ``ingest-failures`` (one row per failure: stage, category, file, reason)."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    seconds = ", ".join(f"{stage} {s:.1f}s" for stage, s in summary.seconds.items())
    failures = read_failures(WorkDir.of(config))
    create_markdown_artifact(
        key="ingest-summary",
        markdown=(
            f"# ingest ({config.store.backend.value}: {config.store.path})\n\n"
            f"`{summary.line()}`\n\n"
            f"- failures: {summary.failed}"
            + (" (table artifact `ingest-failures`)" if failures else "")
            + f"\n- deletions held by the mass-deletion guard: {summary.deletions_held}\n"
            + (f"- index gate: {summary.gate['line']}\n" if summary.gate else "")
            + f"- seconds per stage: {seconds}\n"
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
    return convert_batch(config, sources)


@task(name="embed-batch", cache_policy=NO_CACHE)
def embed_batch_task(config: RagpipeConfig, chunks: list[Chunk]) -> int:
    return embed_batch(config, chunks)
