"""What every stage shares: its directory, manifest, reuse check and typed summary.

Each ``run_*`` function (one per stage module, in the order of
``pipeline.STAGES``) loads the previous checkpoint, does its work and writes
its own. Layout of the work directory::

    work_dir/discover/{files,failures,skipped}.parquet + manifest.json
    work_dir/fetch/pages.parquet, work_dir/fetch/bodies/   web pages: state, bodies
    work_dir/plan/{files,plan}.parquet + manifest.json      files to (re)process
    work_dir/plan/store-versions.parquet                    the store's file versions, cached
    work_dir/convert/{documents,failures}.parquet + manifest.json
    work_dir/convert/cache/<key>.parquet                    one per converted document
    work_dir/clean/{documents,failures}.parquet + manifest.json
    work_dir/chunk/{chunks,failures}.parquet + manifest.json
    work_dir/embed/embeddings.parquet + manifest.json       chunk_id, point_id, vector
    work_dir/embed/parts/<fingerprint>-<n>.parquet          embedded so far (crash resume)
    work_dir/upsert/manifest.json                           what the store run did
    work_dir/failures.parquet, work_dir/summary.json        written last

A stage whose manifest matches its config fingerprint and its input's
fingerprint is reused. Inputs are read through ``read_input``, which checks
that the checkpoint is this run's (its plan id) and unaltered (its SHA-256).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from ragpipe import checkpoint
from ragpipe.config import RagpipeConfig
from ragpipe.errors import InputError, StageError
from ragpipe.progress import reporter
from ragpipe.schemas import Failure

logger = logging.getLogger(__name__)


T = TypeVar("T")


R = TypeVar("R")


@dataclass
class StageSummary:
    """Counts of one stage run (small enough to pass between tasks)."""

    stage: str
    output_fingerprint: str
    counts: dict[str, int]
    reused: bool = False
    seconds: float = 0.0
    plan_id: str = ""  # the run's plan (see ``read_input``); "" before plan runs


@dataclass(frozen=True)
class WorkDir:
    """The work directory's paths (layout above): the one place that spells them."""

    root: Path

    @classmethod
    def of(cls, config: RagpipeConfig) -> WorkDir:
        return cls(config.paths.work_dir)

    def stage(self, name: str) -> Path:
        """Directory of one stage's checkpoints."""
        return self.root / name

    def stage_failures(self, name: str) -> Path:
        return self.stage(name) / "failures.parquet"

    @property
    def failures(self) -> Path:
        """The last run's failure rows, every stage's together."""
        return self.root / "failures.parquet"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def skipped(self) -> Path:
        """Paths discover left out on purpose, with the reason."""
        return self.stage("discover") / "skipped.parquet"


def stage_dir(config: RagpipeConfig, stage: str) -> Path:
    """Directory of one stage's checkpoints."""
    return WorkDir.of(config).stage(stage)


def finish_stage(
    directory: Path,
    stage: str,
    config_fp: str,
    input_fp: str,
    outputs: dict[str, tuple[Sequence[Any], type]],
    counts: dict[str, int],
    started: float,
    plan_id: str = "",
) -> StageSummary:
    """Write a stage's outputs, then its manifest (which marks it done)."""
    digests = {
        f"{name}.parquet": checkpoint.write_records(directory / f"{name}.parquet", rows, rtype)
        for name, (rows, rtype) in outputs.items()
    }
    manifest = checkpoint.Manifest(stage, config_fp, input_fp, digests, counts, plan_id=plan_id)
    checkpoint.write_manifest(directory, manifest)  # last: marks the stage done
    seconds = time.perf_counter() - started
    logger.info("%s: %s (%.1fs)", stage, ", ".join(f"{k}={v}" for k, v in counts.items()), seconds)
    return StageSummary(
        stage, manifest.output_fingerprint, counts, seconds=seconds, plan_id=plan_id
    )


def reuse_stage(
    directory: Path, stage: str, config_fp: str, input_fp: str, plan_id: str = ""
) -> StageSummary | None:
    """The finished stage's summary when it already ran on these inputs and config.

    The reused output now belongs to this run's plan: its manifest is stamped with it.
    """
    manifest = checkpoint.is_current(directory, config_fp, input_fp)
    if manifest is None:
        return None
    if manifest.plan_id != plan_id:
        manifest.plan_id = plan_id
        checkpoint.write_manifest(directory, manifest)
    logger.info("%s: inputs and config unchanged, reusing checkpoint", stage)
    return StageSummary(
        stage, manifest.output_fingerprint, manifest.counts, reused=True, plan_id=plan_id
    )


def checked_manifest(config: RagpipeConfig, stage: str, plan_id: str) -> checkpoint.Manifest:
    """The finished ``stage``'s manifest, refused unless it belongs to this run's plan.

    Two runs sharing a work dir for different indexes would otherwise read each
    other's checkpoints (the ingest lock also covers the work dir; this is the
    check that holds whoever writes there).
    """
    directory = stage_dir(config, stage)
    manifest = checkpoint.read_manifest(directory)
    if manifest is None or (plan_id and manifest.plan_id != plan_id):
        found = "no finished stage" if manifest is None else f"plan {manifest.plan_id[:12] or '?'}"
        raise StageError(
            f"the {stage} checkpoint in {directory} is not this run's ({found}; this run's plan "
            f"{plan_id[:12]}): another run wrote into the work dir {config.paths.work_dir} "
            "meanwhile. Give each index its own paths.work_dir and re-run; nothing of this run "
            "was written to the store."
        )
    return manifest


def verify_output(
    config: RagpipeConfig,
    stage: str,
    name: str,
    plan_id: str,
    output_fingerprint: str | None = None,
) -> Path:
    """The path of one output of a finished ``stage``, checked to be this run's.

    The manifest must be of this run's plan (once the run has one) and, when given,
    have ``output_fingerprint``; the file must still have the SHA-256 it records.
    """
    directory = stage_dir(config, stage)
    manifest = checked_manifest(config, stage, plan_id)
    path = directory / name
    recorded = {name: manifest.outputs.get(name, "")}
    same = output_fingerprint is None or manifest.output_fingerprint == output_fingerprint
    if not same or not checkpoint.outputs_intact(directory, replace(manifest, outputs=recorded)):
        raise StageError(
            f"{path} is not the file its stage finished with (another run writing into the "
            f"work dir {config.paths.work_dir}?). Give each index its own paths.work_dir and "
            "re-run; nothing of this run was written to the store."
        )
    return path


def read_output(
    config: RagpipeConfig, stage: str, name: str, record_type: type[T], plan_id: str
) -> list[T]:
    """Read one output of a finished ``stage`` (see ``verify_output``)."""
    return checkpoint.read_records(verify_output(config, stage, name, plan_id), record_type)


def read_input(
    config: RagpipeConfig, previous: StageSummary, name: str, record_type: type[T]
) -> list[T]:
    """Read an output of the stage ``previous`` summarises (see ``read_output``)."""
    path = verify_output(
        config, previous.stage, name, previous.plan_id, previous.output_fingerprint
    )
    return checkpoint.read_records(path, record_type)


def per_document(
    stage: str,
    items: Sequence[T],
    work: Callable[[T], R],
    key: Callable[[T], tuple[str, str | None]],
) -> tuple[list[R], list[Failure]]:
    """Run ``work`` on each item; an error in one item becomes a failure row."""
    done: list[R] = []
    failures: list[Failure] = []
    progress = reporter()
    progress.start(stage, len(items))
    try:
        for item in items:
            try:
                done.append(work(item))
            except InputError as exc:
                path, sha = key(item)
                failures.append(Failure(path, stage, exc.category, str(exc), sha))
            except StageError:
                raise
            except Exception as exc:  # one bad document never sinks the batch
                path, sha = key(item)
                logger.exception("%s failed on %s", stage, path)
                failures.append(Failure(path, stage, "error", f"{type(exc).__name__}: {exc}", sha))
            progress.advance(1)
    finally:
        progress.finish()
    return done, failures
