"""The whole ingest without Prefect: the one stage list and the run over it.

``STAGES`` is the order every runner walks: ``run_ingest`` here, the Prefect
flow (``flows/ingest.py``, one task per stage) and the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ragpipe.config import RagpipeConfig
from ragpipe.errors import IndexHeld, MassDeletionHeld
from ragpipe.ingest import gatekeep
from ragpipe.ingest.chunk import run_chunk
from ragpipe.ingest.clean import run_clean
from ragpipe.ingest.convert import run_convert
from ragpipe.ingest.discover import run_discover
from ragpipe.ingest.embed import run_embed
from ragpipe.ingest.plan import run_plan
from ragpipe.ingest.runner import RunStore, StageSummary, stage_store
from ragpipe.ingest.summary import IngestSummary, with_gate, write_summary
from ragpipe.ingest.upsert import mass_deletion_message, run_upsert
from ragpipe.locking import ingest_lock


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
    ``uses_store``, the run's store (``RunStore``; None: the stage opens its own)."""

    name: str
    run: Callable[..., StageSummary[Any]]
    uses_store: bool = False

    def arguments(
        self, config: RagpipeConfig, done: Sequence[StageSummary[Any]], store: RunStore | None
    ) -> tuple[Any, ...]:
        """What ``run`` takes after the stages ``done`` so far."""
        return (config, *done[-1:], *((store,) if self.uses_store else ()))


def _discover(config: RagpipeConfig) -> StageSummary[Any]:
    return run_discover(config)


# The one stage order: run_ingest, the Prefect flow and the tests all walk it. Plan runs
# before convert so that only added and changed files are converted.
STAGES: tuple[Stage, ...] = (
    Stage("discover", _discover),
    Stage("plan", run_plan, uses_store=True),
    Stage("convert", run_convert),
    Stage("clean", run_clean),
    Stage("chunk", run_chunk),
    Stage("embed", run_embed, uses_store=True),
    Stage("upsert", run_upsert, uses_store=True),
)
STAGE_NAMES = tuple(stage.name for stage in STAGES)


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
    with ingest_lock(config):
        summary = write_summary(config, run_stages(config))
        summary = with_gate(config, summary, gatekeep.decide(config))
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
