"""The ingest flow: discover → plan → convert → clean → chunk → embed → upsert.

Run nightly, it is the incremental re-index: unchanged files cost only
hashing, changed files are re-indexed new-version-first, vanished files are
deleted (behind the mass-deletion guard).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast
from uuid import UUID

from prefect import flow
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from ragpipe.config import RagpipeConfig, load_config
from ragpipe.errors import MassDeletionHeld
from ragpipe.indexing import mass_deletion_message
from ragpipe.locking import ingest_lock
from ragpipe.pipeline import with_mass_delete
from ragpipe.stages import IngestSummary
from tasks.ingest import (
    chunk_task,
    clean_task,
    convert_task,
    discover_task,
    embed_task,
    plan_task,
    publish_ingest_task,
    summary_task,
    upsert_task,
)


@flow(name="ingest", log_prints=False)
def ingest_flow(
    config: RagpipeConfig | None = None,
    config_path: str | None = None,
    roots: list[str] | None = None,
    allow_mass_delete: bool = False,
) -> IngestSummary:
    """Ingest documents into the index, re-processing only what changed.

    Args:
        config: A ready configuration; when None it is loaded from ``config_path``.
        config_path: YAML file (``ragpipe.yaml`` in the working directory if None).
        roots: Paths that replace ``discover.roots`` for this run.
        allow_mass_delete: Apply deletions even above ``index.max_delete_share``.

    Raises:
        MassDeletionHeld: Too many indexed files vanished; additions were
            applied, deletions held. The summary was written first.
    """
    cfg = config if config is not None else load_config(Path(config_path) if config_path else None)
    cfg = with_mass_delete(cfg, allow_mass_delete)
    root_paths = [Path(r) for r in roots] if roots else None
    # Progress in the Prefect UI: the share of the seven stages done.
    progress = cast(
        UUID, create_progress_artifact(0.0, key="ingest-progress", description="stages done (%)")
    )
    with ingest_lock(cfg):  # one writer per index: a second run waits or refuses
        discovered = discover_task(cfg, root_paths)
        done = [discovered]
        for stage in (plan_task, convert_task, clean_task, chunk_task, embed_task, upsert_task):
            update_progress_artifact(progress, 100 * len(done) / 7)
            done.append(stage(cfg, done[-1]))
        update_progress_artifact(progress, 100.0)
        summary = summary_task(cfg, done)
    publish_ingest_task(cfg, summary)
    if summary.deletions_held:
        raise MassDeletionHeld(
            mass_deletion_message(cfg, summary.deletions_held, summary.indexed_files)
        )
    return summary


if __name__ == "__main__":
    ingest_flow()
