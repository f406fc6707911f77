"""The ingest flow: discover → plan → convert → clean → chunk → embed → upsert.

Run nightly, it is the incremental re-index: unchanged files cost only
hashing, changed files are re-indexed new-version-first, vanished files are
deleted (behind the mass-deletion guard).
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from ragpipe.config import RagpipeConfig, load_config
from ragpipe.errors import MassDeletionHeld
from ragpipe.indexing import mass_deletion_message
from ragpipe.pipeline import with_mass_delete
from ragpipe.stages import IngestSummary
from tasks.ingest import (
    chunk_task,
    clean_task,
    convert_task,
    discover_task,
    embed_task,
    plan_task,
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
    discovered = discover_task(cfg, root_paths)
    planned = plan_task(cfg, discovered)
    converted = convert_task(cfg, planned)
    cleaned = clean_task(cfg, converted)
    chunked = chunk_task(cfg, cleaned)
    embedded = embed_task(cfg, chunked)
    upserted = upsert_task(cfg, embedded)
    summary = summary_task(
        cfg, [discovered, planned, converted, cleaned, chunked, embedded, upserted]
    )
    if summary.deletions_held:
        raise MassDeletionHeld(
            mass_deletion_message(cfg, summary.deletions_held, summary.indexed_files)
        )
    return summary


if __name__ == "__main__":
    ingest_flow()
