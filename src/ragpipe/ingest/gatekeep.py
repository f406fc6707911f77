"""After an ingest with ``index.gate``: promote the staged version, or hold it.

The upsert stage stages a changed index instead of publishing it (see
``ragpipe.store.versions``: Edge copies, or Qdrant collections behind an alias);
``decide`` runs the gate (``ragpipe.evaluation.gate``) and records the outcome
with the version. The caller holds the ingest lock, so no other writer stages or
promotes meanwhile; readers keep the live version throughout.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import Any

from ragpipe import checkpoint
from ragpipe.config import RagpipeConfig
from ragpipe.ingest.runner import WorkDir
from ragpipe.store import published, versions

logger = logging.getLogger(__name__)

PROMOTED, HELD, STILL_HELD = "promoted", "held", "still-held"
# The working version stays off without being judged again: discarded by hand, or rolled
# back from by hand (promoted once, then another version made live).
DISCARDED, ROLLED_BACK = "discarded", "rolled-back"
ALREADY_LIVE = "already-live"  # a hand promotion of the live version: nothing changes
FINE = (PROMOTED, DISCARDED, ROLLED_BACK, ALREADY_LIVE)  # outcomes that are no failure


@dataclass(frozen=True)
class Decision:
    """What became of this run's index version."""

    outcome: str  # promoted, held, still-held
    generation: str
    live_before: str | None
    verdict: dict[str, Any]
    line: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_golden_sets(config: RagpipeConfig) -> None:
    """Before an ingest builds anything: the gate's golden sets load, hold no unreviewed
    draft items (unless ``eval.allow_draft``), and can be scored at ``eval.granularity``,
    so a run never stages a version only to refuse to judge it.

    Raises:
        ConfigError: a golden set that is missing, malformed, holds drafts, has no
            answerable item (the gate would judge nothing), or has items without
            ``chunks:`` while the gate scores by chunk.
    """
    if config.index.gate is None:
        return
    from ragpipe.evaluation.gate import refuse_unjudgeable
    from ragpipe.evaluation.golden import load_golden
    from ragpipe.evaluation.retrieval import Granularity, refuse_missing_chunks

    for path in config.index.gate.golden:
        loaded = load_golden(path)
        loaded.refuse_drafts(config.eval.allow_draft)
        refuse_unjudgeable(loaded, path, config.index.gate.metric)
        granularity = Granularity(config.eval.granularity)
        refuse_missing_chunks(loaded.answerable, granularity, f"index.gate.golden: {path}: ")


def decide(config: RagpipeConfig) -> Decision | None:
    """Judge the working version if the gate has not yet; None when there is nothing to
    decide (no gate, no store, or the version is live already)."""
    if config.index.gate is None:
        return None
    generation = versions.working_generation(config.store)
    live = versions.current(config.store)
    if generation is None:
        return None
    if generation == live:  # nothing to judge (a no-op night reads no status unless owed)
        return _unannounced(config, live)
    records = versions.statuses(config.store)
    recorded = records.get(generation, {})
    status = recorded.get("status")
    if status == published.PROMOTED and not records.get(live or "", {}).get("at", "") > (
        recorded.get("at") or ""
    ):  # a promotion killed before its switch (no one promoted anything since): redo it
        if recorded.get("by_hand"):  # a person's: finished, not judged again (and held)
            return _finish_by_hand(config, generation, live)
        status = published.STAGED
    if status in (published.DISCARDED, published.PROMOTED):  # a person decided; keep it
        outcome = DISCARDED if status == published.DISCARDED else ROLLED_BACK
        line = (
            f"version {generation[:12]} stays off: "
            + ("it was discarded by hand" if outcome == DISCARDED else
               f"version {(live or 'none')[:12]} was made live by hand after it")
            + "; the next change of the corpus or configuration makes a new version"
        )  # fmt: skip
        logger.warning("index gate: %s", line)
        return Decision(outcome, generation, live, {}, line)
    broken = versions.damaged(config.store, live)
    against, keep = live, {"previous": live}
    if broken:  # the live copy cannot be read: compare with the version it replaced
        replaced = records.get(live or "", {})
        against = replaced.get("previous") if replaced.get("keep_previous") else None
        if against is not None and versions.damaged(config.store, against):
            against = None
        keep = {"previous": against}  # only a version kept and whole is one to roll back to
        logger.warning("index gate: the live version %s is damaged: version %s is judged "
                       "against %s", (live or "")[:12], generation[:12],
                       against[:12] if against else "nothing (as a first version)")  # fmt: skip
    if status == published.HELD and not broken:  # a no-op night: judged already
        verdict = recorded.get("verdict", {})
        line = f"version {generation[:12]} is still held since {recorded.get('at', '?')}"
        logger.warning("index gate: %s (ragpipe index list; promote or discard it)", line)
        return Decision(STILL_HELD, generation, live, verdict, line)
    from ragpipe.evaluation.gate import evaluate_gate  # the query path: only with a gate

    logger.info("index gate: evaluating version %s against %s", generation[:12],
                against[:12] if against else "nothing (the first version)")  # fmt: skip
    # Said before judging: a gate that fails or is killed leaves "pending", not the last
    # night's verdict, and a promotion killed before its event is announced the next night.
    _write_gate(config, {"outcome": PENDING, "generation": generation, "live_before": live,
                         "announced": False})  # fmt: skip
    verdict = evaluate_gate(config, generation, against)
    data = verdict.as_dict()
    line = verdict.line()
    if broken:  # said: the event and the summary name the damaged version it replaced
        data["live_damaged"] = live
        line += f" (the live version {(live or '')[:12]} was damaged)"
    if verdict.passed:
        # A damaged version is no version to roll back to: the one it replaced still is.
        versions.promote(config.store, generation, {"verdict": data, **keep},
                         keep_previous=keep["previous"] is not None)  # fmt: skip
        logger.info("index gate: %s", line)
        decision = Decision(PROMOTED, generation, live, data, line)
    else:
        versions.hold(config.store, generation, data)
        logger.error("index gate: %s: %s", line, "; ".join(verdict.reasons))
        decision = Decision(HELD, generation, live, data, line)
    _write_gate(config, {**decision.as_dict(), "announced": False})
    return decision


PENDING = "pending"  # gate.json while a version is being judged


def _finish_by_hand(config: RagpipeConfig, generation: str, live: str | None) -> Decision:
    """The switch of a ``ragpipe index promote`` stopped between its record and the switch
    (killed, a power cut): made now, announced as its own event would have been."""
    versions.promote(config.store, generation, {"by_hand": True}, keep_previous=True)
    line = (f"version {generation[:12]}: its promotion by hand stopped before the switch; "
            f"finished now (was {(live or 'none')[:12]})")  # fmt: skip
    logger.warning("index gate: %s", line)
    decision = Decision(PROMOTED, generation, live, {"by_hand": True, "reasons": []}, line)
    _write_gate(config, {**decision.as_dict(), "announced": False})
    return decision


def _write_gate(config: RagpipeConfig, data: dict[str, Any]) -> None:
    checkpoint.atomic_write_bytes(
        WorkDir.of(config).root / "gate.json", json.dumps(data, indent=2).encode()
    )


def announced(config: RagpipeConfig, decision: Decision) -> None:
    """Record that ``decision``'s event was sent (the flow calls it after sending)."""
    _write_gate(config, {**decision.as_dict(), "announced": True})


def _unannounced(config: RagpipeConfig, live: str | None) -> Decision | None:
    """The promotion of ``live`` again, when the run that judged it stopped before its
    event was sent (killed after the switch): no later night decided anything, so the
    ``ragpipe.index.promoted`` event, and the evaluation it triggers, were lost for good."""
    try:
        gate = json.loads((WorkDir.of(config).root / "gate.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (
        not isinstance(gate, dict)
        or gate.get("generation") != live
        or gate.get("announced", True)
        or gate.get("outcome") not in (PENDING, PROMOTED)
    ):
        return None
    records = versions.statuses(config.store)
    if (
        records.get(live or "", {}).get("status") != published.PROMOTED
        or records.get(live or "", {}).get("by_hand")  # `index promote` sent its own event
    ):
        return None
    verdict = dict(records.get(live or "", {}).get("verdict") or gate.get("verdict") or {})
    line = (f"version {(live or '')[:12]} was promoted by a run that stopped before "
            "announcing it: announced now")  # fmt: skip
    logger.warning("index gate: %s", line)
    return Decision(PROMOTED, live or "", gate.get("live_before"), verdict, line)


def held_message(decision: Decision) -> str:
    """The error a held version fails the run with."""
    reasons = decision.verdict.get("reasons") or []
    why = "; ".join(reasons) if reasons else decision.line
    what = (
        decision.line
        if decision.outcome == STILL_HELD
        else (f"index version {decision.generation[:12]} was not promoted")
    )
    return (
        f"{what}: {why}. Readers keep "
        f"version {(decision.live_before or 'none')[:12]}. Inspect it with `ragpipe search "
        f"--version {decision.generation[:12]}`, then `ragpipe index promote "
        f"{decision.generation[:12]}` or `ragpipe index discard {decision.generation[:12]}`"
    )


def require_versions(config: RagpipeConfig) -> None:
    """ConfigError unless the index keeps versions: the Edge store always does, a Qdrant
    server with ``index.gate`` (a collection per version behind an alias)."""
    from ragpipe.config import StoreBackend
    from ragpipe.errors import ConfigError

    if config.store.backend != StoreBackend.EDGE and config.index.gate is None:
        raise ConfigError(
            "a Qdrant server's collection is written in place: it keeps index versions "
            "(a collection each, behind an alias) only with index.gate configured"
        )


def promote_by_hand(config: RagpipeConfig, version: str) -> Decision:
    """Make ``version`` (a generation or a unique prefix) live, under the ingest lock.

    Raises:
        ConfigError: the index keeps no versions (see ``require_versions``).
        StageError: no such version, or another writer holds the index.
    """
    from ragpipe.locking import ingest_lock

    require_versions(config)
    with ingest_lock(config):
        generation = versions.resolve(config.store, version)
        before = versions.current(config.store)
        if generation == before:  # it was recorded as its own roll-back target, and the
            # one to roll back to was pruned; a retried deployment run did that too
            line = f"version {generation[:12]} is live already: nothing changed"
            logger.info("index: %s", line)
            return Decision(ALREADY_LIVE, generation, before, {"by_hand": True, "reasons": []},
                            line)  # fmt: skip
        versions.promote(config.store, generation, {"by_hand": True}, keep_previous=True)
    line = f"version {generation[:12]} promoted by hand (was {(before or 'none')[:12]})"
    logger.info("index: %s", line)
    return Decision(PROMOTED, generation, before, {"by_hand": True, "reasons": []}, line)


def discard_by_hand(config: RagpipeConfig, version: str) -> str:
    """Remove ``version`` (a generation or a unique prefix; not the live one), under the
    ingest lock; returns its generation.

    Raises:
        ConfigError: the index keeps no versions (see ``require_versions``).
        StageError: no such version, it is live, or a writer or reader holds it.
    """
    from ragpipe.locking import ingest_lock

    require_versions(config)
    with ingest_lock(config):
        generation = versions.resolve(config.store, version)
        versions.discard(config.store, generation)
    logger.info("index: version %s discarded by hand", generation[:12])
    return generation
