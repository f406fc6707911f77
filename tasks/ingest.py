"""Ingest tasks: one library call each; checkpoints are the library's job.

The stage tasks are cached by Prefect under the library's own content key
(``ragpipe.ingest.pipeline.cache_key``: configuration, input and store
fingerprints, never pickled inputs), so an unchanged night shows them Cached;
their results (small summaries) are kept in Prefect's local result storage
(``PREFECT_LOCAL_STORAGE_PATH``). The other tasks are not cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect import Task, task
from prefect.cache_policies import NO_CACHE, CachePolicy
from prefect.context import TaskRunContext

from ragpipe.config import RagpipeConfig
from ragpipe.ingest.convert import convert_batch
from ragpipe.ingest.embed import embed_batch
from ragpipe.ingest.gatekeep import HELD, STILL_HELD, Decision, decide, held_message
from ragpipe.ingest.pipeline import STAGE_BY_NAME, STAGES, Stage, cache_key
from ragpipe.ingest.runner import RunStore, StageSummary, WorkDir
from ragpipe.ingest.summary import IngestSummary, read_failures, write_summary
from ragpipe.schemas import Chunk, SourceFile
from ragpipe.store import remove_leftovers


@dataclass
class StageCache(CachePolicy):
    """Prefect's cache key of a stage task: the library's ``cache_key`` (None: no cache)."""

    stage: str = ""

    def compute_key(
        self,
        task_ctx: TaskRunContext,
        inputs: dict[str, Any],
        flow_parameters: dict[str, Any],
        **kwargs: Any,
    ) -> str | None:
        return cache_key(inputs["config"], STAGE_BY_NAME[self.stage], inputs.get("previous"))


def _stage_task(stage: Stage) -> Task[..., StageSummary[Any]]:
    def run_stage(
        config: RagpipeConfig, previous: StageSummary[Any] | None, store: RunStore | None
    ) -> StageSummary[Any]:
        return stage.run(*stage.arguments(config, [previous] if previous else [], store))

    run_stage.__doc__ = stage.run.__doc__
    return task(
        name=stage.name,
        cache_policy=StageCache(stage=stage.name),
        persist_result=True,
        cache_result_in_memory=False,
    )(run_stage)


# One task per stage of the library's one stage list, named after it.
STAGE_TASKS = {stage.name: _stage_task(stage) for stage in STAGES}


@task(name="tidy-store", cache_policy=NO_CACHE)
def tidy_task(config: RagpipeConfig) -> int:
    """Remove dead readers' copies and unused versions; never cached, so that a night on
    which every stage is Cached removes them too."""
    return remove_leftovers(config.store)


@task(name="summarise", cache_policy=NO_CACHE)
def summary_task(config: RagpipeConfig, stage_summaries: list[StageSummary[Any]]) -> IngestSummary:
    return write_summary(config, stage_summaries)


@task(name="index-gate", cache_policy=NO_CACHE)
def gate_task(config: RagpipeConfig) -> Decision | None:
    """Promote or hold the version this run staged (``index.gate``); None: no gate."""
    return decide(config)


@task(name="publish-ingest", cache_policy=NO_CACHE)
def publish_ingest_task(
    config: RagpipeConfig, summary: IngestSummary, gate_error: str | None = None
) -> None:
    """The run's outcome as Prefect artifacts: ``ingest-summary`` and, when files failed,
    ``ingest-failures`` (one row per failure: stage, category, file, reason).

    The summary says what the index gate decided and why (its reasons, and for a held
    version which one readers keep and what to do), or ``gate: error: ...`` when the gate
    raised (``gate_error``; the run then fails on that error)."""
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
            + _gate_markdown(summary.gate, gate_error)
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


def _gate_markdown(gate: dict[str, Any], error: str | None) -> str:
    """The summary's lines on the index gate: its line, each reason, the held message."""
    if error is not None:
        return f"- index gate: error: {error}\n"
    if not gate:
        return ""
    reasons = gate.get("verdict", {}).get("reasons") or []
    text = f"- index gate: {gate['line']}\n" + "".join(f"  - {r}\n" for r in reasons)
    if gate.get("outcome") in (HELD, STILL_HELD):
        text += f"- held: {held_message(Decision(**gate))}\n"
    return text


@task(name="convert-batch", cache_policy=NO_CACHE)
def convert_batch_task(config: RagpipeConfig, sources: list[SourceFile]) -> int:
    return convert_batch(config, sources)


@task(name="embed-batch", cache_policy=NO_CACHE)
def embed_batch_task(config: RagpipeConfig, chunks: list[Chunk]) -> int:
    return embed_batch(config, chunks)
