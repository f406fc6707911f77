"""What every stage shares: its directory (WorkDir), manifest, reuse check, typed counts
and summary, and the run's store (RunStore).

Each ``run_*`` function (one per stage module, in the order of
``pipeline.STAGES``) loads the previous checkpoint, does its work and writes
its own. Layout of the work directory::

    work_dir/discover/{files,failures,skipped}.parquet + manifest.json
    work_dir/fetch/pages.parquet, work_dir/fetch/bodies/   web pages: state, bodies
    work_dir/objects/objects.parquet, .../bodies/          object storage: state, bodies
    work_dir/records/records.parquet, .../bodies/          JSON/JSONL records: state, bodies
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

import copy
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Generic, Self, TypeVar

from ragpipe import checkpoint
from ragpipe.config import RagpipeConfig
from ragpipe.errors import InputError, StageError
from ragpipe.models.embedders import embedder_name
from ragpipe.progress import reporter
from ragpipe.schemas import Failure
from ragpipe.store import StoreMeta, VectorStore, open_store

logger = logging.getLogger(__name__)


T = TypeVar("T")


R = TypeVar("R")


@dataclass
class Counts:
    """A stage's typed counts (each stage module declares its own subclass).

    The manifest stores them flat (``as_dict``), as ``name: int`` entries. A
    ``dict[str, int]`` field with ``metadata={"prefix": p}`` is stored as ``p:key``
    entries; an ``int`` field with ``metadata={"optional": True}`` is left out when 0.
    ``from_dict`` reads them back; entries a stage no longer writes are ignored,
    missing ones are 0.
    """

    def as_dict(self) -> dict[str, int]:
        flat: dict[str, int] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if "prefix" in f.metadata:
                flat |= {f"{f.metadata['prefix']}:{k}": v for k, v in sorted(value.items())}
            elif value or not f.metadata.get("optional"):
                flat[f.name] = value
        return flat

    @classmethod
    def from_dict(cls, flat: dict[str, int]) -> Self:
        values: dict[str, Any] = {}
        for f in fields(cls):
            if "prefix" in f.metadata:
                head = f"{f.metadata['prefix']}:"
                values[f.name] = {k[len(head) :]: v for k, v in flat.items() if k.startswith(head)}
            elif f.name in flat:
                values[f.name] = int(flat[f.name])
        return cls(**values)

    def line(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.as_dict().items())

    def mark_reused(self) -> None:
        """Turn the counts of the run that wrote a checkpoint into those of a run that
        reuses it (nothing done again); stages whose counts say what was done override."""


C = TypeVar("C", bound=Counts)


@dataclass
class StageSummary(Generic[C]):
    """What one stage run hands the next: its output's fingerprint and typed counts
    (small enough to pass between tasks)."""

    stage: str
    output_fingerprint: str
    counts: C
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

    def output(self, stage: str, name: str) -> Path:
        """One Parquet output of a stage: ``name`` is its key in the stage's manifest."""
        return self.stage(stage) / f"{name}.parquet"

    def stage_failures(self, name: str) -> Path:
        return self.output(name, "failures")

    def files(self, stage: str) -> Path:
        """The files a stage hands on to convert: discover's (all) or plan's (to redo)."""
        return self.output(stage, "files")

    @property
    def fetch_state(self) -> Path:
        """What the last run fetched of each web page."""
        return self.output("fetch", "pages")

    @property
    def fetch_bodies(self) -> Path:
        return self.stage("fetch") / "bodies"

    @property
    def objects_state(self) -> Path:
        """What the last listing found of each object-storage key."""
        return self.output("objects", "objects")

    @property
    def objects_bodies(self) -> Path:
        return self.stage("objects") / "bodies"

    @property
    def records_state(self) -> Path:
        """What the last expansion found in each JSON/JSONL records file."""
        return self.output("records", "records")

    @property
    def records_bodies(self) -> Path:
        return self.stage("records") / "bodies"

    @property
    def plan(self) -> Path:
        """One row per file: added, changed, unchanged, cleanup or removed."""
        return self.output("plan", "plan")

    @property
    def store_versions(self) -> Path:
        """The store's file versions as the last scroll (or write) left them."""
        return self.output("plan", "store-versions")

    @property
    def convert_cache(self) -> Path:
        """One Parquet file per converted document, keyed by source and converter."""
        return self.stage("convert") / "cache"

    @property
    def chunks(self) -> Path:
        return self.output("chunk", "chunks")

    @property
    def embeddings(self) -> Path:
        return self.output("embed", "embeddings")

    @property
    def embed_parts(self) -> Path:
        """Vectors embedded so far by an unfinished embed (crash resume, batches)."""
        return self.stage("embed") / "parts"

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
        return self.output("discover", "skipped")


class RunStore:
    """The index as one ingest run uses it: opened at most once, on first use (plan's
    scroll, embed's duplicate check or upsert's writes), then handed on; upsert closes it
    (publishing needs it closed), as does the end of the run.

    A stage given none opens and closes its own (``stage_store``): stages run in other
    processes (a Dask runner) must, since an Edge store is open in one process at a time.
    """

    def __init__(self, config: RagpipeConfig) -> None:
        self._config = config.store
        self._versioned = config.index.gate is not None  # a server: its working collection
        self._embedder = embedder_name(config.embed)
        self._store: VectorStore | None = None
        self.opened = 0  # times the store was opened

    def existing(self) -> VectorStore | None:
        """The store for reading and deleting; None while there is none yet."""
        if self._store is None:
            self._store = open_store(self._config, self._embedder, None, self._versioned)
            self.opened += self._store is not None
        return self._store

    def for_writing(self, dim: int) -> VectorStore:
        """The store for ``dim``-dimensional vectors, created on first use; one opened
        before is checked to hold vectors of this size (ConfigError if not)."""
        if self._store is None:
            store = open_store(self._config, self._embedder, dim, self._versioned)
            assert store is not None  # with a dimension the store is created
            self._store, self.opened = store, self.opened + 1
        else:
            self._store.check(StoreMeta(self._embedder, dim))
        return self._store

    def close(self) -> None:
        if self._store is not None:
            store, self._store = self._store, None
            store.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def stage_store(config: RagpipeConfig, given: RunStore | None) -> Iterator[RunStore]:
    """The run's store when the stage was given it, else the stage's own (closed after)."""
    if given is not None:
        yield given
        return
    with RunStore(config) as own:
        yield own


def finish_stage(
    directory: Path,
    stage: str,
    config_fp: str,
    input_fp: str,
    outputs: dict[str, tuple[Sequence[Any], type]],
    counts: C,
    started: float,
    plan_id: str = "",
) -> StageSummary[C]:
    """Write a stage's outputs, then its manifest (which marks it done)."""
    digests = {
        f"{name}.parquet": checkpoint.write_records(directory / f"{name}.parquet", rows, rtype)
        for name, (rows, rtype) in outputs.items()
    }
    return record_stage(directory, stage, config_fp, input_fp, digests, counts, started, plan_id)


def record_stage(
    directory: Path,
    stage: str,
    config_fp: str,
    input_fp: str,
    digests: dict[str, str],
    counts: C,
    started: float,
    plan_id: str = "",
) -> StageSummary[C]:
    """Write the manifest of a stage whose outputs (``digests``: name → SHA-256) are
    durably written; it marks the stage done. Logs the counts."""
    manifest = checkpoint.Manifest(
        stage, config_fp, input_fp, digests, counts.as_dict(), plan_id=plan_id
    )
    checkpoint.write_manifest(directory, manifest)  # last: marks the stage done
    seconds = time.perf_counter() - started
    logger.info("%s: %s (%.1fs)", stage, counts.line(), seconds)
    return StageSummary(
        stage, manifest.output_fingerprint, counts, seconds=seconds, plan_id=plan_id
    )


def reuse_stage(
    directory: Path,
    stage: str,
    config_fp: str,
    input_fp: str,
    counts: type[C],
    plan_id: str = "",
) -> StageSummary[C] | None:
    """The finished stage's summary when it already ran on these inputs and config.

    The reused output now belongs to this run's plan: its manifest is stamped with it.
    """
    manifest = checkpoint.is_current(directory, config_fp, input_fp)
    if manifest is None:
        return None
    failed = int(manifest.counts.get("failed") or 0)
    if failed:
        # Failed files are retried on every run: a timeout under load, a file back in
        # place, or a limit the key leaves out (convert.timeout_s) may pass now. The
        # documents that did not fail come from their per-document caches.
        logger.info("%s: retrying the %d failed document(s) of the last run", stage, failed)
        return None
    if manifest.plan_id != plan_id:
        manifest.plan_id = plan_id
        checkpoint.write_manifest(directory, manifest)
    logger.info("%s: inputs and config unchanged, reusing checkpoint", stage)
    reused = counts.from_dict(manifest.counts)
    reused.mark_reused()
    return StageSummary(stage, manifest.output_fingerprint, reused, reused=True, plan_id=plan_id)


def cached_summary(config: RagpipeConfig, summary: StageSummary[C]) -> StageSummary[C] | None:
    """A stage's summary from an earlier run (an orchestrator's cache), as this run's,
    when the work dir still holds exactly what that run left: its manifest, of the same
    plan and output fingerprint, and outputs with the digests it records. None: run the
    stage (another run wrote into the work dir since, or a file was lost), or a stage with
    failed documents (retried on every run, as ``reuse_stage`` does)."""
    if getattr(summary.counts, "failed", 0):
        return None
    directory = WorkDir.of(config).stage(summary.stage)
    manifest = checkpoint.read_manifest(directory)
    if (
        manifest is None
        or manifest.plan_id != summary.plan_id
        or manifest.output_fingerprint != summary.output_fingerprint
        or not checkpoint.outputs_intact(directory, manifest)
    ):
        return None
    logger.info("%s: cached (inputs, config and store unchanged since an earlier run)",
                summary.stage)  # fmt: skip
    counts = copy.deepcopy(summary.counts)
    counts.mark_reused()  # this run did none of the work the cached counts describe
    return replace(summary, counts=counts, reused=True, seconds=0.0)


def checked_manifest(config: RagpipeConfig, stage: str, plan_id: str) -> checkpoint.Manifest:
    """The finished ``stage``'s manifest, refused unless it belongs to this run's plan.

    Two runs sharing a work dir for different indexes would otherwise read each
    other's checkpoints (the ingest lock also covers the work dir; this is the
    check that holds whoever writes there).
    """
    directory = WorkDir.of(config).stage(stage)
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
    directory = WorkDir.of(config).stage(stage)
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
    config: RagpipeConfig, previous: StageSummary[Any], name: str, record_type: type[T]
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
