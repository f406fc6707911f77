"""The whole ingest without Prefect: what the flow composes, stage by stage.

Used by tests and benchmarks (and anyone embedding ragpipe in their own
orchestrator); ``flows/ingest.py`` runs the same stages as Prefect tasks.
"""

from __future__ import annotations

from pathlib import Path

from ragpipe import indexing, stages
from ragpipe.config import RagpipeConfig
from ragpipe.errors import MassDeletionHeld
from ragpipe.locking import ingest_lock
from ragpipe.stages import IngestSummary


def with_mass_delete(config: RagpipeConfig, allow: bool) -> RagpipeConfig:
    """``config`` with ``index.allow_mass_delete`` switched on when ``allow``."""
    if not allow or config.index.allow_mass_delete:
        return config
    index = config.index.model_copy(update={"allow_mass_delete": True})
    return config.model_copy(update={"index": index})


def run_ingest(
    config: RagpipeConfig, roots: list[Path] | None = None, allow_mass_delete: bool = False
) -> IngestSummary:
    """discover → plan → convert → clean → chunk → embed → upsert → summary.

    Raises:
        MassDeletionHeld: after the summary is written, when deletions were held.
    """
    config = with_mass_delete(config, allow_mass_delete)
    with ingest_lock(config):
        discovered = stages.run_discover(config, roots)
        planned = indexing.run_plan(config, discovered)
        converted = stages.run_convert(config, planned)
        cleaned = stages.run_clean(config, converted)
        chunked = stages.run_chunk(config, cleaned)
        embedded = indexing.run_embed(config, chunked)
        upserted = indexing.run_upsert(config, embedded)
        summary = stages.write_summary(
            config, [discovered, planned, converted, cleaned, chunked, embedded, upserted]
        )
    if summary.deletions_held:
        raise MassDeletionHeld(
            indexing.mass_deletion_message(config, summary.deletions_held, summary.indexed_files)
        )
    return summary
