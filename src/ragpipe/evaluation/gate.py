"""The index's quality gate: may a staged version replace the live one?

Each golden set of ``index.gate`` is replayed through both versions with the
same retrieval settings, and the gate's metric is compared item by item (the
paired delta, as ``eval compare`` does). The staged version is promoted only
when, for every golden set, its mean is at most ``max_drop`` below the live
version's and at least ``min_score``, and every canary query returns its
files. An index's first version has nothing to compare with: only the
floors and the canaries apply.

A golden item whose targets no longer exist in the staged version scores 0
there: that is the signal (a corpus that lost its answers), not an error.
Each golden set is checked against the *live* version, where its targets
must match as for any eval. A target that names several files in the staged
version is not scored there (a hit on the wrong file would count as the
answer): its item is left out and the version held, unless eval.skip_unmatched.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ragpipe.config import GateConfig, RagpipeConfig
from ragpipe.errors import ConfigError
from ragpipe.evaluation.check import IndexView, check_golden, golden_for_index
from ragpipe.evaluation.golden import GoldenSet, file_matches, load_golden
from ragpipe.evaluation.metrics import bootstrap_ci, paired_delta
from ragpipe.evaluation.retrieval import Granularity, run_retrieval_eval
from ragpipe.models.embedders import embedder_name, make_embedder
from ragpipe.query.retrieve import Retriever
from ragpipe.store import open_reader


@dataclass(frozen=True)
class GoldenVerdict:
    """One golden set's comparison."""

    golden: str
    items: int
    staged: float | None  # the mean over the compared items and the new ones; None: none
    live: float | None  # None: no live version (the first one)
    delta: float | None
    delta_low: float | None
    delta_high: float | None
    p_value: float | None
    passed: bool
    reason: str = ""
    lost: list[str] = field(default_factory=list)  # items scoring 0 staged, > 0 live
    unmatched_staged: list[str] = field(default_factory=list)  # targets gone from the staged
    # Items only the staged version can score (labels for files it adds, or a target that
    # names several files in the live version alone): scored there towards the floor, not
    # compared.
    new_items: list[str] = field(default_factory=list)
    # The staged mean over the compared items alone: what live and delta are set against.
    staged_compared: float | None = None
    # Targets that name several files in the staged version: a hit on the wrong one would
    # score there, so their items are left out of the comparison and the floor, and hold the
    # version unless eval.skip_unmatched.
    ambiguous_staged: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CanaryVerdict:
    query: str
    k: int
    missing: list[str]  # configured files not among the top k

    @property
    def passed(self) -> bool:
        return not self.missing


@dataclass(frozen=True)
class GateVerdict:
    """What the gate decided and why; recorded with the version and sent in events."""

    staged: str
    live: str | None
    metric: str
    max_drop: float
    passed: bool
    reasons: list[str]
    golden: list[GoldenVerdict]
    canaries: list[CanaryVerdict]
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for canary, verdict in zip(data["canaries"], self.canaries, strict=True):
            canary["passed"] = verdict.passed
        return data

    def line(self) -> str:
        """One line for logs and event summaries."""
        verdict = "promoted" if self.passed else "held"
        parts = [_golden_line(g, self.metric) for g in self.golden]
        if self.canaries:
            ok = sum(c.passed for c in self.canaries)
            parts.append(f"canaries {ok}/{len(self.canaries)}")
        return f"version {self.staged[:12]} {verdict}: " + "; ".join(parts)


def _golden_line(g: GoldenVerdict, metric: str) -> str:
    """Staged against live on the same items; the mean with the new items, which only
    the floor reads, apart."""
    if g.staged is None:
        return f"{g.golden}: {g.reason}"
    if g.live is None or g.delta is None:
        return f"{g.golden}: {metric} {g.staged:.4f}"
    compared = g.staged if g.staged_compared is None else g.staged_compared
    line = (
        f"{g.golden}: {metric} {compared:.4f} vs live {g.live:.4f} ({g.delta:+.4f}) "
        f"on the same {g.items} items"
    )
    if g.new_items:
        line += f", {g.staged:.4f} with the {len(g.new_items)} new"
    return line


def _scores(
    config: RagpipeConfig, golden: GoldenSet, retriever: Retriever, metric: str
) -> dict[str, float]:
    result = run_retrieval_eval(
        config,
        golden,
        granularity=Granularity(config.eval.granularity),
        depth=config.eval.depth,
        resamples=config.eval.resamples,
        seed=config.eval.seed,
        retriever=retriever,
    )
    return {row.item_id: row.metrics[metric] for row in result.rows}


def _golden_verdict(
    gate: GateConfig,
    config: RagpipeConfig,
    golden: GoldenSet,
    staged: Retriever,
    live: Retriever | None,
    added: GoldenSet | None = None,
) -> GoldenVerdict:
    """``golden`` compared on both versions; ``added`` (items for files only the staged
    version has) count towards the floor only."""
    new = _scores(config, golden, staged, gate.metric) if golden.answerable else {}
    ids = list(new)
    extra = _scores(config, added, staged, gate.metric) if added and added.answerable else {}
    floor_values = [*new.values(), *extra.values()]
    staged_mean = bootstrap_ci(floor_values, config.eval.resamples, config.eval.seed)
    reasons = []
    if gate.min_score is not None and staged_mean.mean < gate.min_score:
        reasons.append(f"{gate.metric} {staged_mean.mean:.4f} is below the floor {gate.min_score}")
    if live is None or not ids:
        return GoldenVerdict(golden.name, len(floor_values), staged_mean.mean, None, None, None,
                             None, None, not reasons, "; ".join(reasons),
                             new_items=sorted(extra))  # fmt: skip
    old = _scores(config, golden, live, gate.metric)
    delta = paired_delta([old[i] for i in ids], [new[i] for i in ids], config.eval.resamples,
                         config.eval.seed)  # fmt: skip
    d = delta.interval
    if d.mean < -gate.max_drop - 1e-12:
        reasons.append(
            f"{gate.metric} fell by {-d.mean:.4f} on the same {len(ids)} items "
            f"(index.gate.max_drop {gate.max_drop})"
        )
    lost = [i for i in ids if new[i] == 0 and old[i] > 0]
    live_mean = sum(old[i] for i in ids) / len(ids)
    return GoldenVerdict(
        golden.name, len(ids), staged_mean.mean, live_mean, d.mean,
        d.low if d.shown else None, d.high if d.shown else None,  # none: no CI, or all deltas equal
        delta.p_value if delta.p_value == delta.p_value else None,
        not reasons, "; ".join(reasons), lost, new_items=sorted(extra),
        staged_compared=sum(new[i] for i in ids) / len(ids),
    )  # fmt: skip


def refuse_unjudgeable(golden: GoldenSet, path: Path, metric: str) -> None:
    """A gate set with no answerable item could judge nothing: its mean is of nothing
    (NaN), which no floor refuses, so it is refused instead."""
    if not golden.answerable:
        raise ConfigError(
            f"index.gate.golden: {path} has no answerable item, and the gate scores "
            f"{metric} on answerable items only, so it could judge nothing: add answerable "
            "items to it, or remove it from index.gate.golden"
        )


def _canary(retriever: Retriever, query: str, files: Sequence[str], k: int) -> CanaryVerdict:
    hits = retriever.search(query, top_k=k).hits
    found = [str(h.payload.get("file_path", "")) for h in hits[:k]]
    missing = [f for f in files if not any(file_matches(path, f) for path in found)]
    return CanaryVerdict(query, k, missing)


def evaluate_gate(config: RagpipeConfig, staged: str, live: str | None) -> GateVerdict:
    """Replay ``index.gate`` against version ``staged`` and (when there is one) ``live``.

    Raises:
        ConfigError: a golden set is missing or invalid, or its targets do not match
            the live version (GoldenMismatch: fix the golden set, or eval.skip_unmatched).
    """
    gate = config.index.gate
    if gate is None:
        raise ValueError("evaluate_gate needs index.gate")
    started = time.perf_counter()
    embedder = make_embedder(config.embed, query_side=True)
    name = embedder_name(config.embed)
    readers: list[Retriever] = []
    try:
        staged_store = open_reader(config.store, name, staged)
        assert staged_store is not None  # a named version opens or raises
        readers.append(Retriever(config, embedder=embedder, store=staged_store))
        if live is not None:
            live_store = open_reader(config.store, name, live)
            assert live_store is not None
            readers.append(Retriever(config, embedder=embedder, store=live_store))
        new, old = readers[0], readers[1] if live is not None else None
        goldens = []
        scope = config.eval.granularity
        staged_view = IndexView(new.store)
        live_view = IndexView(old.store) if old is not None else None
        for path in gate.golden:
            loaded = load_golden(path)
            loaded.refuse_drafts(config.eval.allow_draft)
            refuse_unjudgeable(loaded, path, gate.metric)  # also checked before the ingest
            # Items written for files only the staged version has are new labels: scored
            # there (the floor), not compared. Targets that match nothing in either version
            # are the golden set's fault, as for any eval; those the staged version lost
            # are the signal (they score 0 there). A target naming several files in the
            # staged version matches, but a hit on the wrong file would score as the answer:
            # the item's staged score is no evidence, so it is left out (and holds the
            # version unless eval.skip_unmatched).
            on_staged = check_golden(loaded, staged_view, scope)
            unsure = [u for u in on_staged.unmatched if u.ambiguous]
            left_out = set(on_staged.ambiguous_items)
            loaded = replace(loaded, items=[i for i in loaded.items if i.id not in left_out])
            added: list[str] = []
            if live_view is not None:
                off_live = set(check_golden(loaded, live_view, scope).unmatched_items)
                off_staged = set(on_staged.unmatched_items)
                added = sorted(off_live - off_staged)
            golden, _ = golden_for_index(
                replace(loaded, items=[i for i in loaded.items if i.id not in added]),
                live_view or staged_view, skip_unmatched=config.eval.skip_unmatched,
                origin="index.gate.golden", scope=scope,
            )  # fmt: skip
            new_set = replace(loaded, items=[i for i in loaded.items if i.id in added])
            if not golden.answerable and not new_set.answerable:
                verdict = GoldenVerdict(loaded.name, 0, None, None, None, None, None, None,
                                        False, "no answerable item is left to judge")  # fmt: skip
            else:
                verdict = _golden_verdict(gate, config, golden, new, old, new_set)
            gone = check_golden(golden, staged_view, scope)
            verdict = replace(verdict, unmatched_staged=gone.lines(),
                              ambiguous_staged=[u.line() for u in unsure])  # fmt: skip
            if unsure and not config.eval.skip_unmatched:
                why = (
                    f"{len(left_out)} item(s) have a target that names several files in the "
                    "staged version, so a hit on the wrong file would score as the answer: "
                    "give those targets a longer path in the golden set, or set "
                    "eval.skip_unmatched to judge without them"
                )
                reason = "; ".join(r for r in (verdict.reason, why) if r)
                verdict = replace(verdict, passed=False, reason=reason)
            goldens.append(verdict)
        canaries = [_canary(new, c.query, c.files, c.k) for c in gate.canaries]
    finally:
        for reader in readers:
            reader.close()
    reasons = [f"{g.golden}: {g.reason}" for g in goldens if not g.passed]
    reasons += [
        f"canary {c.query!r}: {', '.join(c.missing)} not in the top {c.k}"
        for c in canaries
        if not c.passed
    ]
    return GateVerdict(
        staged, live, gate.metric, gate.max_drop, not reasons, reasons, goldens, canaries,
        round(time.perf_counter() - started, 3),
    )  # fmt: skip
