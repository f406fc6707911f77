"""The whole ingest without Prefect: the one stage list and the run over it.

``STAGES`` is the order every runner walks: ``run_ingest`` here, the Prefect
flow (``flows/ingest.py``, one task per stage) and the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ragpipe import __version__
from ragpipe.checkpoint import combine_fingerprints
from ragpipe.config import RagpipeConfig, fingerprint
from ragpipe.errors import IndexHeld, MassDeletionHeld
from ragpipe.ingest import gatekeep
from ragpipe.ingest.chunk import chunk_fingerprint, run_chunk
from ragpipe.ingest.clean import CLEAN_VERSION, run_clean
from ragpipe.ingest.convert import run_convert
from ragpipe.ingest.convert import stage_fingerprint as convert_fingerprint
from ragpipe.ingest.discover import run_discover
from ragpipe.ingest.embed import run_embed
from ragpipe.ingest.plan import index_fingerprint, run_plan
from ragpipe.ingest.runner import RunStore, StageSummary, WorkDir, stage_store
from ragpipe.ingest.summary import IngestSummary, with_gate, write_summary
from ragpipe.ingest.upsert import mass_deletion_message, run_upsert
from ragpipe.locking import ingest_lock
from ragpipe.store import published, store_generation


def with_mass_delete(config: RagpipeConfig, allow: bool) -> RagpipeConfig:
    """``config`` with ``index.allow_mass_delete`` switched on when ``allow``."""
    if not allow or config.index.allow_mass_delete:
        return config
    index = config.index.model_copy(update={"allow_mass_delete": True})
    return config.model_copy(update={"index": index})


@dataclass(frozen=True)
class Stage:
    """One stage: its name (and work-dir folder) and what runs it. ``run`` takes the
    configuration, the previous stage's summary (discover takes none) and, when
    ``uses_store``, the run's store (``RunStore``; None: the stage opens its own).
    ``settings``: the fingerprint of the configuration its output depends on (see
    ``cache_key``); None: it always runs."""

    name: str
    run: Callable[..., StageSummary[Any]]
    uses_store: bool = False
    settings: Callable[[RagpipeConfig], str] | None = None

    def arguments(
        self, config: RagpipeConfig, done: Sequence[StageSummary[Any]], store: RunStore | None
    ) -> tuple[Any, ...]:
        """What ``run`` takes after the stages ``done`` so far."""
        return (config, *done[-1:], *((store,) if self.uses_store else ()))


def _discover(config: RagpipeConfig) -> StageSummary[Any]:
    return run_discover(config)


def _plan_settings(config: RagpipeConfig) -> str:
    return combine_fingerprints([index_fingerprint(config), fingerprint(config.store, "1")])


def _embed_settings(config: RagpipeConfig) -> str:
    return combine_fingerprints([index_fingerprint(config), fingerprint(config.embed, "1")])


def _upsert_settings(config: RagpipeConfig) -> str:
    return combine_fingerprints(
        [index_fingerprint(config), fingerprint(config.index, "1"), fingerprint(config.store, "1")]
    )


# The one stage order: run_ingest, the Prefect flow and the tests all walk it. Plan runs
# before convert so that only added and changed files are converted. Discover is the
# walk and the hashing that tell whether anything changed: it always runs.
STAGES: tuple[Stage, ...] = (
    Stage("discover", _discover),
    Stage("plan", run_plan, uses_store=True, settings=_plan_settings),
    Stage("convert", run_convert, settings=lambda c: convert_fingerprint(c.convert)),
    Stage("clean", run_clean, settings=lambda c: fingerprint(c.clean, CLEAN_VERSION)),
    Stage("chunk", run_chunk, settings=chunk_fingerprint),
    Stage("embed", run_embed, uses_store=True, settings=_embed_settings),
    Stage("upsert", run_upsert, uses_store=True, settings=_upsert_settings),
)
STAGE_NAMES = tuple(stage.name for stage in STAGES)
STAGE_BY_NAME = {stage.name: stage for stage in STAGES}


# Bumped when what a stage's output depends on changes shape (see cache_key).
CACHE_SCHEMA = "1"


def cache_key(
    config: RagpipeConfig, stage: Stage, previous: StageSummary[Any] | None
) -> str | None:
    """A key under which ``stage``'s summary may be cached across runs (Prefect's cache policy in
    ``tasks/ingest.py``); None: never cached.

    The key is content, not pickled objects: the stage's configuration fingerprint, the previous
    stage's output fingerprint and plan, the work dir, for a stage that reads the store the Edge
    store's generation token (a store written by anyone since changes it), and for upsert the
    published version readers open (a lost, damaged or hand-promoted one makes upsert run, and
    publish, again). A qdrant server has no such token: its plan, embed and upsert always run.
    A hit is only as good as the work dir it left behind: check it with
    ``runner.cached_summary`` before trusting it.
    """
    if stage.settings is None or previous is None:
        return None
    parts = [
        CACHE_SCHEMA,
        __version__,
        stage.name,
        stage.settings(config),
        str(WorkDir.of(config).root.resolve()),
        previous.stage,
        previous.output_fingerprint,
        previous.plan_id,
    ]
    if stage.uses_store:
        generation = store_generation(config.store)
        if generation is None:
            return None
        parts += [str(config.store.path.resolve()), generation]
    if stage.name == "upsert":  # it publishes (or stages) what readers open: repair a loss
        live = published.current(config.store.path)
        there = live is not None and published.intact(published.root(config.store.path) / live)
        parts += [live or "", str(there)]
    return f"ragpipe-{stage.name}-{combine_fingerprints(parts)}"


def run_stages(
    config: RagpipeConfig,
    until: str = "upsert",
    done: Sequence[StageSummary[Any]] = (),
    store: RunStore | None = None,
) -> list[StageSummary[Any]]:
    """Run the stages in order up to and including ``until``, after the ``done`` ones
    (their summaries, in order); returns every summary. The store is opened once, on
    first use, for all of them (or ``store`` is used). No locks: see run_ingest."""
    if until not in STAGE_NAMES:
        raise ValueError(f"no stage {until!r}; stages: {', '.join(STAGE_NAMES)}")
    done = list(done)
    with stage_store(config, store) as run_store:
        for stage in STAGES[len(done) : STAGE_NAMES.index(until) + 1]:
            done.append(stage.run(*stage.arguments(config, done, run_store)))
    return done


def run_ingest(config: RagpipeConfig, allow_mass_delete: bool = False) -> IngestSummary:
    """Every stage in ``STAGES`` under the index's writer locks, then the summary.

    Raises:
        MassDeletionHeld: after the summary is written, when deletions were held.
        IndexHeld: after the summary is written, when ``index.gate`` held the version.
    """
    config = with_mass_delete(config, allow_mass_delete)
    gatekeep.check_golden_sets(config)
    with ingest_lock(config):
        summary = write_summary(config, run_stages(config))
        decision = gatekeep.decide(config)
        if decision is not None:  # no event to send from here: nothing left to announce
            gatekeep.announced(config, decision)
        summary = with_gate(config, summary, decision)
    if summary.deletions_held:
        raise MassDeletionHeld(
            mass_deletion_message(config, summary.deletions_held, summary.indexed_files)
        )
    raise_if_held(summary)
    return summary


def raise_if_held(summary: IngestSummary) -> None:
    """IndexHeld when the gate kept this run's version from readers (summary written)."""
    if summary.gate.get("outcome") in (gatekeep.HELD, gatekeep.STILL_HELD):
        raise IndexHeld(gatekeep.held_message(gatekeep.Decision(**summary.gate)))
