"""The run's summary: every stage's failures in one table, the counts, summary.json."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from ragpipe import checkpoint
from ragpipe.config import RagpipeConfig
from ragpipe.ingest.runner import StageSummary, WorkDir
from ragpipe.schemas import Failure

logger = logging.getLogger(__name__)


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


def read_failures(work: WorkDir) -> list[Failure]:
    """The last run's failure rows (none before the first run)."""
    return checkpoint.read_records(work.failures, Failure) if work.failures.is_file() else []


def write_summary(config: RagpipeConfig, stages: Sequence[StageSummary]) -> IngestSummary:
    """Gather every stage's failures into one table and write the run summary."""
    work = WorkDir.of(config)
    failures: list[Failure] = []
    for stage in STAGES_WITH_FAILURES:
        path = work.stage_failures(stage)
        if path.is_file():
            failures.extend(checkpoint.read_records(path, Failure))
    checkpoint.write_records(work.failures, failures, Failure)
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
    checkpoint.atomic_write_bytes(work.summary, json.dumps(payload, indent=2).encode())
    logger.info("ingest: %s", summary.line())
    return summary
