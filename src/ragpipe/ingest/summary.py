"""The run's summary: every stage's failures in one table, the counts, summary.json."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

from ragpipe import checkpoint
from ragpipe.config import RagpipeConfig
from ragpipe.ingest.chunk import ChunkCounts
from ragpipe.ingest.convert import ConvertCounts
from ragpipe.ingest.discover import DiscoverCounts
from ragpipe.ingest.gatekeep import FINE
from ragpipe.ingest.plan import PlanCounts
from ragpipe.ingest.runner import Counts, StageSummary, WorkDir
from ragpipe.ingest.upsert import UpsertCounts
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
    gate: dict[str, Any] = field(default_factory=dict)  # ragpipe.ingest.gatekeep.Decision

    @property
    def ok(self) -> bool:
        return (
            self.failed == 0
            and self.deletions_held == 0
            # promoted, or kept off by a person's decision
            and self.gate.get("outcome") in (None, *FINE)
        )

    def line(self) -> str:
        """One greppable line: the counts a nightly log needs."""
        return (
            f"seen={self.seen} added={self.added} changed={self.changed} "
            f"unchanged={self.skipped_unchanged} removed={self.removed} failed={self.failed} "
            f"chunks-written={self.chunks_written} chunks-deleted={self.chunks_deleted} "
            f"points={self.points_total} skipped={self.skipped}"
            + (f" deletions-held={self.deletions_held}" if self.deletions_held else "")
            + (f" version={self.gate['outcome']}" if self.gate else "")
        )


STAGES_WITH_FAILURES = ("discover", "convert", "clean", "chunk")

C = TypeVar("C", bound=Counts)


def _counts(stages: Sequence[StageSummary[Any]], kind: type[C]) -> C:
    """The counts of the stage that reports ``kind``; all 0 if it did not run (a run
    stopped early, or tests running part of the stages)."""
    return next((s.counts for s in stages if isinstance(s.counts, kind)), kind())


def read_failures(work: WorkDir) -> list[Failure]:
    """The last run's failure rows (none before the first run)."""
    return checkpoint.read_records(work.failures, Failure) if work.failures.is_file() else []


def write_summary(config: RagpipeConfig, stages: Sequence[StageSummary[Any]]) -> IngestSummary:
    """Gather every stage's failures into one table and write the run summary."""
    work = WorkDir.of(config)
    failures: list[Failure] = []
    for stage in STAGES_WITH_FAILURES:
        path = work.stage_failures(stage)
        if path.is_file():
            failures.extend(checkpoint.read_records(path, Failure))
    checkpoint.write_records(work.failures, failures, Failure)
    discover = _counts(stages, DiscoverCounts)
    plan = _counts(stages, PlanCounts)
    convert = _counts(stages, ConvertCounts)
    upsert = _counts(stages, UpsertCounts)
    summary = IngestSummary(
        seen=discover.seen,
        converted=convert.converted,
        skipped_unchanged=(
            plan.unchanged + plan.cleanup
            if any(s.stage == "plan" for s in stages)
            else convert.skipped_unchanged
        ),
        failed=len(failures),
        chunks=_counts(stages, ChunkCounts).chunks,
        skipped=discover.skipped,
        added=plan.added,
        changed=plan.changed,
        removed=upsert.files_removed,
        chunks_written=upsert.points_written,
        chunks_deleted=upsert.points_deleted,
        deletions_held=upsert.deletions_held,
        indexed_files=plan.indexed_files,
        points_total=upsert.points_total,
        failures_by_category=dict(Counter(f"{f.stage}:{f.category}" for f in failures)),
        seconds={s.stage: round(s.seconds, 3) for s in stages},
        stages={s.stage: s.counts.as_dict() for s in stages},
    )
    _write(work, summary, failures)
    logger.info("ingest: %s", summary.line())
    return summary


def _write(work: WorkDir, summary: IngestSummary, failures: Sequence[Failure]) -> None:
    payload = {**asdict(summary), "failures": [asdict(f) for f in failures]}
    checkpoint.atomic_write_bytes(work.summary, json.dumps(payload, indent=2).encode())


def with_gate(config: RagpipeConfig, summary: IngestSummary, decision: Any) -> IngestSummary:
    """The summary with the gate's decision (``gatekeep.Decision``), written again."""
    if decision is None:
        return summary
    summary = replace(summary, gate=decision.as_dict())
    work = WorkDir.of(config)
    _write(work, summary, read_failures(work))
    logger.info("ingest: %s", summary.line())
    return summary
