"""The ingest flow: discover → plan → convert → clean → chunk → embed → upsert.

``ingest_flow`` takes a ready configuration (the CLI, library callers);
``reindex_flow``, what the deployments run, takes a small form and loads the
configuration file itself.

Run nightly, it is the incremental re-index: unchanged files cost only
hashing, changed files are re-indexed new-version-first, vanished files are
deleted (behind the mass-deletion guard).
"""

from __future__ import annotations

import logging
import time
from typing import Any, cast
from uuid import UUID

from prefect import flow, unmapped
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State
from prefect.futures import wait
from prefect.runtime import deployment

from flows.concurrency import writer_slot
from flows.events import emit_index_decision
from flows.logs import library_logs
from ragpipe.config import RagpipeConfig, with_sources
from ragpipe.errors import MassDeletionHeld
from ragpipe.evaluation.forms import RUN_PARAMETERS, Count, run_config
from ragpipe.ingest import gatekeep
from ragpipe.ingest.convert import convert_batches
from ragpipe.ingest.embed import embed_batches
from ragpipe.ingest.pipeline import STAGES, Stage, cache_key, raise_if_held, with_mass_delete
from ragpipe.ingest.runner import RunStore, StageSummary, cached_summary
from ragpipe.ingest.summary import IngestSummary, with_gate
from ragpipe.ingest.upsert import mass_deletion_message
from ragpipe.locking import ingest_lock
from tasks.ingest import (
    STAGE_TASKS,
    convert_batch_task,
    embed_batch_task,
    gate_task,
    publish_ingest_task,
    summary_task,
    tidy_task,
)


@flow(name="ingest", log_prints=False)
def ingest_flow(
    config: RagpipeConfig | None = None,
    config_path: str | None = None,
    roots: list[str] | None = None,
    allow_mass_delete: bool = False,
    batch_size: int | None = None,
) -> IngestSummary:
    """Ingest documents into the index, re-processing only what changed.

    Args:
        config: A ready configuration; when None it is loaded from ``config_path``.
        config_path: YAML file (``ragpipe.yaml`` in the working directory if None); with
            ``config`` given, where it came from (sent with the gate's events, so that a
            triggered eval reads the same file).
        roots: Sources for this run: paths and http(s) URLs; they replace
            ``discover.roots``, ``discover.urls`` and ``discover.sitemaps``.
        allow_mass_delete: Apply deletions even above ``index.max_delete_share``.
        batch_size: Fan conversion out in batches of this many files (and embedding
            in batches of 20x as many chunks) as parallel tasks on the flow's task
            runner (see ``dask_ingest_flow``); the stages then assemble the results.

    Raises:
        MassDeletionHeld: Too many indexed files vanished; additions were
            applied, deletions held. The summary was written first.
        IndexHeld: ``index.gate`` kept the new version from readers (a
            ``ragpipe.index.held`` event was emitted; the summary was written first).
    """
    library_logs()
    cfg = config if config is not None else run_config(config_path)
    cfg = with_sources(with_mass_delete(cfg, allow_mass_delete), roots, f"{RUN_PARAMETERS}: roots")
    gatekeep.check_golden_sets(cfg)  # before anything is built
    # Progress in the Prefect UI: the share of the stages done.
    progress = cast(
        UUID, create_progress_artifact(0.0, key="ingest-progress", description="stages done (%)")
    )
    # One writer per index: across deployments a second run queues for the slot; a run
    # from the CLI or the library waits index.lock_timeout_s for it, then refuses, as a
    # writer outside this Prefect server does at the file lock.
    # The stage tasks run in this process (only the batches go to the task runner), so
    # they share one store, opened once.
    queued = deployment.id is not None  # a deployment run; the CLI and library run none
    waiting_since = time.monotonic()  # lock_timeout_s in all: the slot's wait counts
    with (
        writer_slot(cfg, None if queued else cfg.index.lock_timeout_s),
        ingest_lock(cfg, since=None if queued else waiting_since),
        RunStore(cfg) as store,
    ):
        done: list[StageSummary[Any]] = []
        for stage in STAGES:
            update_progress_artifact(progress, 100 * len(done) / len(STAGES))
            if batch_size and stage.name == "convert":  # fan out, then the stage assembles
                batches = convert_batches(cfg, done[-1], batch_size)
                wait(convert_batch_task.map(unmapped(cfg), batches))
            if batch_size and stage.name == "embed":
                wait(embed_batch_task.map(unmapped(cfg), embed_batches(cfg, batch_size * 20)))
            done.append(_run_stage(cfg, stage, done, store))
        tidy_task(cfg)  # under the lock, as a publish does it
        update_progress_artifact(progress, 100.0)
        summary = summary_task(cfg, done)
        try:  # under the lock: no other run stages or promotes meanwhile
            decision = gate_task(cfg)
        except Exception as exc:  # the run fails on it, with its summary saying so
            publish_ingest_task(cfg, summary, gate_error=str(exc))
            raise
        summary = with_gate(cfg, summary, decision)
    if decision is not None:
        emit_index_decision(cfg, decision, config_path)
        gatekeep.announced(cfg, decision)  # a run killed before this: announced next night
    publish_ingest_task(cfg, summary)
    if summary.deletions_held:
        raise MassDeletionHeld(
            mass_deletion_message(cfg, summary.deletions_held, summary.indexed_files)
        )
    raise_if_held(summary)
    return summary


def _run_stage(
    config: RagpipeConfig, stage: Stage, done: list[StageSummary[Any]], store: RunStore
) -> StageSummary[Any]:
    """Run one stage's task. A cached result (an unchanged night) is taken only while the
    work dir still holds what that result left there; otherwise the stage runs again and
    its cache entry is replaced."""
    stage_task = STAGE_TASKS[stage.name]
    previous = done[-1] if done else None
    if cache_key(config, stage, previous) is None:  # never cached: keep no result either
        stage_task = stage_task.with_options(cache_policy=NO_CACHE, persist_result=False)
    state: State[Any] = stage_task(config, previous, store, return_state=True)  # type: ignore[assignment]
    if state.name != "Cached":
        return cast(StageSummary[Any], state.result())
    # A result that cannot be read is a warning; one that is stale is the ordinary course
    # of a corpus that went back to an earlier state (A, B, A: A's entry, B's work dir) or
    # of another index's run in the same work dir, and its stage runs again (INFO: it
    # read like damage as a WARNING).
    level = logging.INFO
    try:
        cached = state.result()
    except Exception as exc:  # e.g. written by an older ragpipe; the stage decides again
        cached, why = None, f"the cached result cannot be read ({type(exc).__name__}: {exc})"
        level = logging.WARNING
    else:
        why = f"the cached result no longer matches the work dir {config.paths.work_dir}"
        if getattr(getattr(cached, "counts", None), "failed", 0):
            why = f"retrying the {cached.counts.failed} failed document(s) of the last run"
    if isinstance(cached, StageSummary) and cached.stage == stage.name:
        current = cached_summary(config, cached)
        if current is not None:
            return current
    logging.getLogger("ragpipe.ingest").log(level, "%s: %s; running the stage", stage.name, why)
    rerun = stage_task.with_options(refresh_cache=True)
    return rerun(config, previous, store)


@flow(name="ingest", log_prints=False)
def reindex_flow(
    config_path: str | None = None,
    roots: list[str] | None = None,
    allow_mass_delete: bool = False,
    batch_size: Count | None = None,
) -> IngestSummary:
    """Re-index the configured sources: only what changed is converted and embedded.

    The deployments' form. The configuration is the file; RAGPIPE_* variables on the
    worker override it.

    Args:
        config_path: YAML config (default: ragpipe.yaml in the worker's directory,
            RAGPIPE_HOME).
        roots: Sources for this run (paths and http(s) URLs), replacing the configured
            discover.roots, discover.urls and discover.sitemaps. Empty: the configured ones.
        allow_mass_delete: Apply the deletions even when more than index.max_delete_share
            of the indexed files vanished (after checking that a share is not unmounted).
        batch_size: Fan conversion and embedding out in parallel batches of this many files.
    """
    library_logs()
    config = run_config(config_path)
    return ingest_flow.fn(config, config_path, roots, allow_mass_delete, batch_size)


def dask_ingest_flow(workers: int = 2, threads_per_worker: int = 1) -> Any:
    """``ingest_flow`` on a local Dask cluster (``prefect-dask``): batches run in parallel
    worker processes. Point ``cluster_kwargs``/``address`` at a real Dask cluster to scale out.
    """
    from prefect_dask.task_runners import DaskTaskRunner

    runner: Any = DaskTaskRunner(
        cluster_kwargs={"n_workers": workers, "threads_per_worker": threads_per_worker,
                        "processes": True, "dashboard_address": None}
    )  # fmt: skip
    return ingest_flow.with_options(name="ingest-dask", task_runner=runner)


if __name__ == "__main__":
    ingest_flow()
