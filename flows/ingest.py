"""The ingest flow: discover → convert → clean → chunk, with checkpoints."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from ragpipe.config import RagpipeConfig, load_config
from ragpipe.stages import IngestSummary
from tasks.ingest import chunk_task, clean_task, convert_task, discover_task, summary_task


@flow(name="ingest", log_prints=False)
def ingest_flow(
    config: RagpipeConfig | None = None,
    config_path: str | None = None,
    roots: list[str] | None = None,
) -> IngestSummary:
    """Ingest documents into checkpoints under ``paths.work_dir``.

    Args:
        config: A ready configuration; when None it is loaded from ``config_path``.
        config_path: YAML file (``ragpipe.yaml`` in the working directory if None).
        roots: Paths that replace ``discover.roots`` for this run.
    """
    cfg = config if config is not None else load_config(Path(config_path) if config_path else None)
    root_paths = [Path(r) for r in roots] if roots else None
    discovered = discover_task(cfg, root_paths)
    converted = convert_task(cfg, discovered)
    cleaned = clean_task(cfg, converted)
    chunked = chunk_task(cfg, cleaned)
    return summary_task(cfg, [discovered, converted, cleaned, chunked])


if __name__ == "__main__":
    ingest_flow()
