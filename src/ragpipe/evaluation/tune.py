"""Tune ``retrieve.*`` on the user's own golden set, with an honest hold-out.

The golden queries are split, by a seeded shuffle, into a tuning part and a
confirmation part. A coordinate search over the retrieval settings (mode,
fusion method, alpha, rrf_k, leg weights, document weight, prefetch depth,
fragments, quoted-phrase boost, MMR, dense pseudo-relevance feedback) picks
the best configuration on the tuning part only; the confirmation part is
never searched before the pick is final. Then the pick and the current
configuration are scored on the confirmation part, and the paired delta
(bootstrap CI, permutation p-value) decides (a split that would hold out fewer
than ``MIN_HELD_OUT`` queries, on which p < 0.05 cannot happen, is refused
before any search):

- ``recommend``: the pick differs from the current settings and gains on the
  held-out queries, its delta CI entirely above zero and the sign-flip test
  agreeing (p < 0.05);
- ``recommend, not significant``: it gains, by what the tests cannot tell
  from noise (kept in the report folder as tuned-not-significant.yaml, never
  written as tuned.yaml or to ``--out``);
- ``refused``: the pick's delta CI lies entirely below zero on the held-out
  queries: it was fitted to the tuning part, and nothing is recommended;
- ``no change``: the current settings were already the best on the tuning
  part, or the pick is no better on the held-out part.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import unicodedata
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import yaml
from pydantic_settings import SettingsError

from ragpipe import yamlio
from ragpipe.checkpoint import atomic_write_bytes
from ragpipe.config import (
    FusionMethod,
    RagpipeConfig,
    RetrievalMode,
    RetrieveConfig,
    environment_overrides,
)
from ragpipe.errors import ConfigError
from ragpipe.evaluation.check import IndexView, check_golden
from ragpipe.evaluation.golden import GoldenSet
from ragpipe.evaluation.metrics import METRICS, Interval, PairedDelta
from ragpipe.evaluation.report import html_page
from ragpipe.evaluation.retrieval import EvalResult, Granularity, Variant, run_retrieval_eval
from ragpipe.evaluation.run import checked_golden, new_run_dir
from ragpipe.evaluation.sibling import INGEST_SPACE, Sibling, build_siblings, plan_siblings
from ragpipe.progress import reporter
from ragpipe.query.retrieve import Retriever

logger = logging.getLogger(__name__)

# The values tried per setting, in the order the coordinate search visits them.
SPACE: dict[str, list[Any]] = {
    "mode": ["hybrid", "dense", "sparse"],
    "fusion_method": ["convex", "dbsf", "rrf"],
    "alpha": [0.3, 0.4, 0.5, 0.6, 0.65, 0.7, 0.8, 0.9],
    "rrf_k": [10, 30, 60, 100],
    "dense_weight": [0.5, 1.0, 2.0],
    "doc_weight": [0.0, 0.25, 0.5, 0.75],
    "prefetch": [20, 40, 80],
    "split_fragments": [True, False],
    "boost_exact": [0.0, 0.2],
    "mmr": [False, True],
    "prf": [False, True],  # dense pseudo-relevance feedback (prf_k, prf_weight at defaults)
}
# Tried only when asked for (``eval tune --llm-options``): each costs LLM calls per query
# (the rerank one per candidate, seconds each on a CPU; cached between trials).
LLM_SPACE: dict[str, list[Any]] = {
    "rerank": [False, "llm"],  # pointwise LLM yes/no over top_k x candidate_mul candidates
    "hyde": ["off", "adaptive"],  # a hypothetical answer when the top dense score is low
}
MAX_PASSES = 3
# A step of the search must beat the incumbent by this much on the tuning queries:
# smaller gains on a few dozen queries are noise, and each one adds a setting to fit.
MIN_GAIN = 0.005
# A pick that gains on the held-out queries by too little to tell from noise has a verdict
# of its own: tune.json, the Prefect description and the terminal's colour must not read the
# same "recommend" as a significant gain. It is kept in the report folder under a name that
# says so (WEAK_FILE), never as tuned.yaml or --out: a config written on noise was used.
WEAK = "recommend, not significant"
RECOMMENDED = ("recommend", WEAK)
WEAK_FILE = "tuned-not-significant.yaml"
# The held-out verdict's significance level (the sign-flip test's p-value).
P_SIGNIFICANT = 0.05
# The sign-flip test's smallest p-value on n held-out queries is 2 / 2**n (every delta of one
# sign: 2 of the 2**n sign patterns reach its mean): 0.5, 0.25, 0.125, 0.0625 for n = 2 to
# 5. On fewer than 6 no pick could be called significant, so tune refuses such a split
# (it wrote a tuned config "recommend, not significant" at p = 1 on 2 held-out queries).
MIN_HELD_OUT = next(n for n in itertools.count(1) if 2 / 2**n < P_SIGNIFICANT)
MIN_TUNING = 2


@dataclass(frozen=True)
class Split:
    """Which golden items tune and which confirm."""

    tuning: list[str]
    confirmation: list[str]


def search_space(llm_options: bool = False) -> dict[str, list[Any]]:
    """The settings ``eval tune`` tries: ``SPACE``, and ``LLM_SPACE`` when asked for."""
    return {**SPACE, **LLM_SPACE} if llm_options else dict(SPACE)


@dataclass
class Trial:
    """One configuration scored on the tuning part."""

    overrides: dict[str, Any]
    score: float


@dataclass
class TuneOutcome:
    """The pick, how it was found, and what the held-out queries say about it."""

    metric: str
    seed: int
    split: Split
    current: dict[str, Any]  # effective retrieve settings before tuning
    overrides: dict[str, Any]  # what the pick changes
    trials: list[Trial]
    tuning_current: float
    tuning_best: float  # the pick's score (the current one's when nothing cleared MIN_GAIN)
    confirmation: EvalResult
    decision: str  # recommend | recommend, not significant | refused | no change
    message: str
    deltas: dict[str, PairedDelta] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)  # setting -> tried, kept or refused
    ingest: dict[str, Any] = field(default_factory=dict)  # chunk settings the pick changes
    index: str = ""  # the store of the pick's index, when it is not the current one

    @property
    def changes(self) -> dict[str, Any]:
        """Every setting the pick changes: ``retrieve`` ones by name, chunk ones as
        ``chunk.<name>``."""
        return changed_settings(self.overrides, self.ingest)

    @property
    def delta(self) -> PairedDelta:
        """The decision metric's paired delta (pick - current) on the confirmation part."""
        return self.deltas[self.metric]

    def means(self, metric: str | None = None) -> tuple[float, float]:
        """Mean of ``metric`` on the confirmation part: (current, tuned)."""
        summary = self.confirmation.summary
        metric = metric or self.metric
        return summary["current"][metric].mean, summary["tuned"][metric].mean


def split_queries(golden: GoldenSet, seed: int, share: float = 0.5, what: str = "item(s)") -> Split:
    """A seeded shuffle of the items; the first ``share`` of it tunes.

    Items asking the same query (``query_key``: case, punctuation and spacing aside) move
    together, to one side: the same question on both sides lets the tuning part tell the
    pick what the held-out part asks. Depends only on the ids, which of them share a
    query, and the seed, never on relevance; with no query asked twice, on the ids alone.
    ``what`` names the items in the refusal ("answerable item(s)": a set of 10 with 7
    unanswerable said it "has 3 item(s)").

    Raises:
        ConfigError: ``share`` outside (0, 1), or a split that would tune on fewer than
            ``MIN_TUNING`` items or hold out fewer than ``MIN_HELD_OUT`` (no verdict
            could then be significant): the message says how many items, or what share,
            would do.
    """
    if not 0 < share < 1:
        raise ConfigError(f"tune share {share} must lie strictly between 0 and 1 (e.g. 0.5)")
    n = len(golden.items)
    cut = _cut(n, share)
    if n - cut < MIN_HELD_OUT:
        raise ConfigError(_too_few(golden.name, n, share, what))
    asked: dict[str, list[str]] = {}
    for item in golden.items:
        asked.setdefault(query_key(item.query), []).append(item.id)
    groups = sorted(sorted(ids) for ids in asked.values())  # by their first id
    tuning: list[str] = []
    confirmation: list[str] = []
    for i in np.random.default_rng(seed).permutation(len(groups)):
        # A group that no longer fits the tuning part is held out whole (so the held-out
        # part only grows, and stays at least MIN_HELD_OUT).
        fits = len(tuning) + len(groups[i]) <= cut
        (tuning if fits else confirmation).extend(groups[i])
    if len(tuning) < MIN_TUNING:
        repeated = sorted((ids for ids in groups if len(ids) > 1), key=len, reverse=True)
        raise ConfigError(
            f"golden set {golden.name!r}: items asking the same query stay on one side of "
            f"the split, and at share {share:g} that leaves {len(tuning)} of {n} to tune "
            f"(tuning needs {MIN_TUNING}); the largest group asks one query {len(repeated[0])} "
            f"times ({', '.join(repeated[0][:5])}{', ...' if len(repeated[0]) > 5 else ''}). "
            "Ask each question once, or tune on a larger share (--share)"
        )
    return Split(sorted(tuning), sorted(confirmation))


def query_key(query: str) -> str:
    """A query as the split compares it: Unicode-normalised, case-folded, without
    punctuation, spaces collapsed ("How do I install it?" is "how do i install it")."""
    text = unicodedata.normalize("NFKC", query).casefold()
    kept = "".join(" " if unicodedata.category(ch).startswith("P") else ch for ch in text)
    return " ".join(kept.split())


def _cut(n: int, share: float) -> int:
    """How many of ``n`` items tune at ``share`` (at least MIN_TUNING, and 2 held out)."""
    return min(max(round(n * share), MIN_TUNING), n - 2)


def _too_few(name: str, n: int, share: float, what: str) -> str:
    """Why a golden set of ``n`` items cannot be split at ``share``, and what would do."""
    least = MIN_TUNING + MIN_HELD_OUT
    head = f"golden set {name!r} has {n} {what}; "
    if n < least:
        return head + (
            f"tuning needs at least {least} ({MIN_TUNING} to tune, {MIN_HELD_OUT} held out to "
            f"confirm the pick: on fewer held-out queries the sign-flip test cannot reach "
            f"p < {P_SIGNIFICANT:g}), and far more for a trustworthy pick"
        )
    held = n - _cut(n, share)
    needed = next(m for m in itertools.count(n) if m - _cut(m, share) >= MIN_HELD_OUT)
    # The largest share, in hundredths, that holds out MIN_HELD_OUT of these n.
    wider = math.floor((n - MIN_HELD_OUT) / n * 100) / 100
    return head + (
        f"a share of {share:g} holds out {held} to confirm the pick, and on {held} queries "
        f"the sign-flip test's smallest p is 2/2^{held} = {2 / 2**held:.4g}, never below "
        f"{P_SIGNIFICANT:g}: no pick could be recommended. The held-out part needs at least "
        f"{MIN_HELD_OUT} queries: add items ({needed} at share {share:g}), or tune on a "
        f"smaller share (--share {wider:g} or less), and far more for a trustworthy pick"
    )


def _subset(golden: GoldenSet, ids: Sequence[str], part: str) -> GoldenSet:
    wanted = set(ids)
    items = [item for item in golden.items if item.id in wanted]
    return GoldenSet(f"{golden.name}-{part}", items, golden.description, golden.source)


def relevant(name: str, settings: dict[str, Any]) -> bool:
    """Whether ``name`` changes anything under ``settings`` (others are not tried)."""
    mode = str(settings["mode"])
    hybrid = mode == RetrievalMode.HYBRID.value
    method = str(settings["fusion_method"])
    if name == "fusion_method":
        return hybrid
    if name == "alpha":
        return hybrid and method == FusionMethod.CONVEX.value
    if name == "rrf_k":
        return hybrid and method == FusionMethod.RRF.value
    if name == "dense_weight":
        return hybrid and method != FusionMethod.CONVEX.value
    if name in ("doc_weight", "prefetch", "prf", "hyde"):
        return mode != RetrievalMode.SPARSE.value
    return True


def _valid(
    settings: dict[str, Any], current: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """``settings`` validated and dumped, or None when they are refused. With ``current``:
    a reranker without rerank is the current one (turning an LLM rerank off again must
    not leave ``reranker: llm`` behind as a change)."""
    try:
        valid = RetrieveConfig.model_validate(settings).model_dump(mode="json")
    except ValueError:
        return None
    if current is not None and not valid["rerank"]:
        valid["reranker"] = current["reranker"]
    return valid


class Search(NamedTuple):
    """What a coordinate search found."""

    best: dict[str, Any]
    trials: list[Trial]
    options: dict[str, str]  # setting -> why its last visit kept or refused a value


def _why_not(settings: dict[str, Any]) -> str:
    mode = settings["mode"]
    if mode == RetrievalMode.HYBRID.value:
        return f"not tried: does not apply with fusion_method {settings['fusion_method']}"
    return f"not tried: does not apply with mode {mode}"


def _named(name: str, settings: dict[str, Any], values: list[Any]) -> Any:
    """The value of ``name`` in ``settings`` as ``values`` spells it (the first value that
    validates to the same settings), else as stored."""
    for value in values:
        valid = _valid({**settings, name: value})
        if valid is not None and valid[name] == settings[name]:
            return value
    return settings[name]


def coordinate_search(
    current: dict[str, Any],
    score: Callable[[dict[str, Any]], float],
    space: dict[str, list[Any]] | None = None,
    passes: int = MAX_PASSES,
    min_gain: float = MIN_GAIN,
) -> Search:
    """Greedy coordinate ascent from ``current``: one setting at a time.

    A value replaces the incumbent only when it scores at least ``min_gain``
    higher; a tie or a smaller gain keeps what is there.

    Args:
        current: Effective ``retrieve`` settings to start from.
        score: Mean metric of a full settings dict (higher is better).
        space: Setting -> values to try (default ``SPACE``).
        passes: Full sweeps at most; stops early when a sweep changes nothing.
        min_gain: Smallest gain that moves the search.

    Returns:
        The best settings found, every distinct configuration scored, and for each
        setting a verdict: the value the pick keeps and the score it won by, or what its
        last visit refused (the best other value and its score), or why it was not tried.
    """
    space = space or SPACE
    cache: dict[str, float] = {}
    trials: list[Trial] = []
    options: dict[str, str] = {}
    kept: dict[str, str] = {}  # setting -> the last visit that changed it

    def evaluate(settings: dict[str, Any]) -> float:
        key = json.dumps(settings, sort_keys=True)
        if key not in cache:
            cache[key] = score(settings)
            trials.append(Trial(_changes(current, settings), cache[key]))
        return cache[key]

    best = dict(current)
    best_score = evaluate(best)
    for _ in range(passes):
        changed = False
        for name, values in space.items():
            if not relevant(name, best):
                options[name] = _why_not(best)
                continue
            # Values as the space names them ('llm' rather than the True it sets).
            before, before_score = _named(name, best, values), best_score
            winner: Any = None
            rival: tuple[Any, float] | None = None  # the best value that did not win
            for value in values:
                candidate = _valid({**best, name: value}, current)
                if candidate is None or candidate == best:
                    continue
                value_score = evaluate(candidate)
                if value_score >= best_score + min_gain:
                    best, best_score, changed, winner = candidate, value_score, True, value
                elif rival is None or value_score > rival[1]:
                    rival = (value, value_score)
            if winner is not None:
                options[name] = kept[name] = (
                    f"kept {winner!r}: {best_score:.4f} against {before_score:.4f} for {before!r}"
                )
            elif rival is not None:
                options[name] = (
                    f"refused {rival[0]!r}: {rival[1]:.4f} against {best_score:.4f} for "
                    f"{before!r} (a change needs +{min_gain:g})"
                )
            else:
                options[name] = f"not tried: no other valid value than {before!r}"
        logger.info(
            "tune: sweep done, %d configurations scored, best %.4f", len(trials), best_score
        )
        if not changed:
            break
    # A setting the pick changes says when it won; the others what their last visit refused.
    options.update(
        (n, why) for n, why in kept.items() if best[n] != current.get(n) and relevant(n, best)
    )
    return Search(best, trials, options)


def _changes(current: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if current.get(k) != v}


def run_tune(
    config: RagpipeConfig,
    golden: GoldenSet,
    *,
    granularity: Granularity = Granularity.CHUNK,
    depth: int = 10,
    metric: str = "ndcg@10",
    seed: int = 0,
    share: float = 0.5,
    resamples: int = 1000,
    space: dict[str, list[Any]] | None = None,
    siblings: Sequence[Sibling] = (),
    retriever: Retriever | None = None,
    progress: Callable[[int], None] | None = None,
) -> TuneOutcome:
    """Pick ``retrieve.*`` settings on a tuning part, judge the pick on the held-out part.

    ``siblings``: indexes of the same sources with another chunk setting each
    (``ragpipe.evaluation.sibling.build_siblings``). The same coordinate search runs
    on each, and one is picked only when its best beats this index's best by
    ``MIN_GAIN`` on the tuning queries; the held-out queries then compare the current
    settings on this index with the pick on its index.

    Raises:
        ConfigError: an unknown metric, a bad share, or too few golden items.
    """
    if metric not in METRICS:
        raise ConfigError(f"tune metric {metric!r} is not one of {', '.join(METRICS)}")
    split = split_queries(golden, seed, share)
    tuning = _subset(golden, split.tuning, "tuning")
    current = config.retrieve.model_dump(mode="json")
    space = space or SPACE

    def search(on: Retriever) -> tuple[Search, float]:
        """The coordinate search on one index, and its best score."""

        def score(settings: dict[str, Any]) -> float:
            result = run_retrieval_eval(
                config,
                tuning,
                [Variant("trial", _changes(current, settings))],
                granularity=granularity,
                depth=depth,
                resamples=100,
                seed=seed,
                retriever=on,
            )
            if progress is not None:
                progress(1)
            return result.summary["trial"][metric].mean

        found = coordinate_search(current, score, space)
        picked = _changes(current, found.best)
        return found, next(t.score for t in found.trials if t.overrides == picked)

    with ExitStack() as opened:
        if retriever is None:
            retriever = opened.enter_context(Retriever(config))
        options: dict[str, str] = {}
        tried = {s.setting for s in siblings}
        for name in [n for n in INGEST_SPACE if n not in tried]:
            # A property of the chunks: trying it means another index.
            options[f"chunk.{name}"] = (
                f"not tried: an ingest setting (this index: {getattr(config.chunk, name)}); "
                "asked for with --ingest-options (builds a second index of the sources)"
            )
        others: list[tuple[Sibling, Retriever]] = []
        for sibling in siblings:
            # Same embedder, LLM and rerankers (and their caches): only the index differs.
            other = opened.enter_context(
                Retriever(
                    sibling.config, retriever.embedder, llm=retriever.llm,
                    rerankers=retriever.rerankers,
                )
            )  # fmt: skip
            why = incomparable(retriever, other, sibling, golden, granularity)
            if why:
                options[sibling.key] = f"refused {sibling.value!r}: {why}"
            else:
                others.append((sibling, other))
        found, best_score = search(retriever)
        best, trials = found.best, list(found.trials)
        options.update(found.options)
        for name in LLM_SPACE.keys() - space.keys():
            options[name] = (
                "not tried: asked for with --llm-options (LLM calls per query: seconds each)"
            )
        ingest: dict[str, Any] = {}
        picked, index = retriever, ""
        for sibling, other in others:
            found, score = search(other)
            trials += [Trial({sibling.key: sibling.value, **t.overrides}, t.score)
                       for t in found.trials]  # fmt: skip
            where = f"on its own index against {best_score:.4f} on this one"
            if score >= best_score + MIN_GAIN:
                # The retrieve verdicts of the picked index, scored there.
                on = f" (on the {sibling.key}={sibling.value!r} index)"
                options.update((k, v + on) for k, v in found.options.items())
                options[sibling.key] = f"kept {sibling.value!r}: {score:.4f} {where}"
                best, best_score, ingest = found.best, score, {sibling.setting: sibling.value}
                picked, index = other, sibling.where
            else:
                options[sibling.key] = (
                    f"refused {sibling.value!r}: {score:.4f} {where} (a change needs +{MIN_GAIN:g})"
                )
        overrides = _changes(current, best)
        # The pick is final; only now are the held-out queries searched.
        variants = [Variant("current"), Variant("tuned", overrides)]
        confirmation = run_retrieval_eval(
            config,
            _subset(golden, split.confirmation, "confirmation"),
            variants,
            name=f"{golden.name}-tune",
            granularity=granularity,
            depth=depth,
            resamples=resamples,
            seed=seed,
            retriever=retriever,
            retrievers={"tuned": picked},
        )
    deltas = confirmation.deltas["tuned"]
    decision, message = decide(changed_settings(overrides, ingest), deltas[metric], metric)
    logger.info("tune: %d configurations tried; %s", len(trials), message)
    return TuneOutcome(
        metric=metric,
        seed=seed,
        split=split,
        current=current,
        overrides=overrides,
        trials=trials,
        tuning_current=trials[0].score,
        tuning_best=best_score,
        confirmation=confirmation,
        decision=decision,
        message=message,
        deltas=deltas,
        options=options,
        ingest=ingest,
        index=index,
    )


def incomparable(
    current: Retriever,
    other: Retriever,
    sibling: Sibling,
    golden: GoldenSet,
    granularity: Granularity,
) -> str:
    """Why ``other`` (``sibling``'s index) cannot be compared with ``current`` on
    ``golden``; empty when it can: a file or version that one holds and the other does
    not, or a golden target matching nothing in ``other``."""
    mine, theirs = IndexView(current.store), IndexView(other.store)
    files = set(mine.shas) | set(theirs.shas)
    differ = sorted(f for f in files if mine.shas.get(f) != theirs.shas.get(f))
    if differ:
        first = differ[0]
        failures = sibling.config.paths.work_dir / "failures.parquet"
        if first not in theirs.shas:
            why = f"{first} is in this index, not in the second (it failed there? see {failures})"
        elif first not in mine.shas:
            why = f"{first} is in the second index, not in this one"
        else:
            why = f"{first} has another version in the second index"
        return (
            f"the two indexes hold other files or versions ({len(differ)} differ; first: "
            f"{why}). The sources changed since this index was built, or a file failed in "
            "one of them: run `ragpipe ingest` and tune again"
        )
    check = check_golden(golden, theirs, granularity.value)
    if not check.ok:
        return (
            f"{len(check.unmatched_items)} golden item(s) cannot be scored on its index "
            f"(first: {check.lines()[0]})"
        )
    return ""


def changed_settings(overrides: dict[str, Any], ingest: dict[str, Any]) -> dict[str, Any]:
    """``retrieve`` overrides by name and chunk settings as ``chunk.<name>``, in one dict."""
    return {**overrides, **{f"chunk.{k}": v for k, v in ingest.items()}}


def delta_ci(ci: Interval) -> str:
    """A held-out delta's 95% CI as tune prints it, or why it has none: a CI of zero width
    (every held-out query moved by the same amount, most often 0) would claim certainty."""
    if ci.zero_width:
        return "no CI: every held-out query has the same delta"
    if not ci.has_ci:
        return f"no CI: {ci.n} held-out quer{'y' if ci.n == 1 else 'ies'}"
    return f"95% CI [{ci.low:+.4f}, {ci.high:+.4f}]"


def scores_said(metric: str, current: float, picked: float, highest: float) -> str:
    """The tuning queries' scores as the report and the CLI say them: the pick's, and a
    higher one tried and not taken (a change needs MIN_GAIN over what it would replace)."""
    said = f"{metric}: current {current:.4f}, picked {picked:.4f}"
    if highest > picked:
        said += f"; the highest tried, {highest:.4f}, gained less than +{MIN_GAIN:g} on its step"
    return said


def decide(changes: dict[str, Any], delta: PairedDelta, metric: str) -> tuple[str, str]:
    """recommend / recommend, not significant / refused / no change, and a sentence saying
    why."""
    if not changes:
        return "no change", (
            f"no change: nothing beat the current settings by +{MIN_GAIN:g} on the tuning queries"
        )
    ci = delta.interval
    stated = (
        f"{metric} {ci.mean:+.4f} on the held-out queries, {delta_ci(ci)}, p={delta.p_value:.3g}"
    )
    if ci.high < 0 or (not ci.shown and ci.mean < 0 and delta.p_value < P_SIGNIFICANT):
        return (
            "refused",
            f"refused: the tuned settings are worse on the held-out queries ({stated}); "
            "they were fitted to the tuning queries. Keep the current settings.",
        )
    if ci.mean <= 0:
        allows = (
            f"; the CI allows a gain of up to {ci.high:+.4f}, so a larger golden set could tell"
            if ci.shown and ci.high > 0
            else ""
        )
        return (
            "no change",
            f"no change: the tuned settings are not better on the held-out queries ({stated})"
            f"{allows}. Keep the current settings.",
        )
    if not ci.shown:  # no interval to read: the permutation test decides
        if delta.p_value < P_SIGNIFICANT:
            return "recommend", f"recommend: better on the held-out queries ({stated})"
        return (
            WEAK,
            f"recommend, not significant: {stated}; with no CI and p >= {P_SIGNIFICANT:g} the "
            "gain may be noise (a larger golden set tells)",
        )
    if ci.low > 0 and delta.p_value < P_SIGNIFICANT:
        return "recommend", f"recommend: better on the held-out queries ({stated})"
    if ci.low > 0:  # a percentile CI of few queries is too narrow; the exact-ish test is not
        return (
            WEAK,
            f"recommend, not significant: {stated}; the CI excludes 0, but with {ci.n} "
            "held-out queries a bootstrap CI is too narrow and the sign-flip test finds no "
            f"effect (p >= {P_SIGNIFICANT:g}): the gain may be noise (a larger golden set "
            "tells)",
        )
    return (
        WEAK,
        f"recommend, not significant: {stated}; the CI includes 0, so the gain may be noise "
        "(a larger golden set narrows it)",
    )


def tuned_data(outcome: TuneOutcome, base: Path | None) -> dict[str, Any]:
    """The base config file's content with the tuned ``retrieve`` (and chunk) settings
    merged in: only the changed settings; every other section of ``base`` as it was."""
    data: dict[str, Any] = {}
    if base is not None and base.is_file():
        loaded = yamlio.load(
            base.read_text(encoding="utf-8"), f"config file {base}", yamlio.CONFIG_LIMIT
        )
        data = loaded if isinstance(loaded, dict) else {}
    retrieve = dict(data.get("retrieve") or {})
    retrieve.update(outcome.overrides)
    data["retrieve"] = retrieve
    if outcome.ingest:
        data["chunk"] = {**(data.get("chunk") or {}), **outcome.ingest}
    return data


def unwritten_settings(
    config: RagpipeConfig, outcome: TuneOutcome, data: dict[str, Any]
) -> list[str]:
    """The ``retrieve`` settings tune scored that loading ``data`` (the tuned file) does not
    give, each with where it came from.

    tuned.yaml starts from the config file, but what was scored is the effective
    configuration: ``RAGPIPE_RETRIEVE__*`` variables, command-line options and a caller's
    own configuration too. One of those the file does not carry is lost when the file is
    loaded without it; and a variable still set overrides the file's own value when it is
    loaded (RAGPIPE_RETRIEVE__MODE=sparse made a tuned ``mode: hybrid`` load as sparse).
    """
    scored = {**outcome.current, **outcome.overrides}
    try:
        alone = RetrieveConfig.model_validate(data.get("retrieve") or {}).model_dump(mode="json")
        loaded = RagpipeConfig(**data).retrieve.model_dump(mode="json")  # with the environment
    except (ValueError, SettingsError, ConfigError):  # the file's own mistake: load_config says it
        return []
    said = []
    for key, value in scored.items():
        if alone[key] != value:
            said.append(
                f"retrieve.{key} was {value!r} when tune scored (from "
                f"{config.origin(f'retrieve.{key}')}); this file gives {alone[key]!r}"
            )
        elif loaded[key] != value:
            said.append(
                f"retrieve.{key}: {_variable(key)} is set ({loaded[key]!r}) and overrides this "
                f"file's {value!r} when it is loaded; unset it to get the settings tune scored"
            )
    return said


def _variable(key: str) -> str:
    """The environment variable that sets ``retrieve.<key>`` (or the whole section)."""
    names = {name.upper(): name for name in environment_overrides()}
    return names.get(f"RAGPIPE_RETRIEVE__{key.upper()}") or names.get(
        "RAGPIPE_RETRIEVE", f"RAGPIPE_RETRIEVE__{key.upper()}"
    )


def tuned_yaml(outcome: TuneOutcome, base: Path | None, unwritten: Sequence[str] = ()) -> str:
    """The base config file with the tuned ``retrieve`` (and chunk) settings merged in, as
    YAML (``tuned_data``), under a comment saying how they were chosen, and what of the
    settings scored the file does not give (``unwritten``, from ``unwritten_settings``).
    """
    data = tuned_data(outcome, base)
    d = outcome.delta
    before, after = outcome.means()
    header = [
        "# Written by `ragpipe eval tune`: settings picked on "
        f"{len(outcome.split.tuning)} tuning queries (seed {outcome.seed}),",
        f"# confirmed on {len(outcome.split.confirmation)} held-out queries: "
        f"{outcome.metric} {before:.4f} -> {after:.4f} "
        f"(delta {d.interval.mean:+.4f}, {delta_ci(d.interval)}, p={d.p_value:.3g}).",
        f"# Changed: {json.dumps(outcome.changes, sort_keys=True)}",
    ]
    if outcome.decision == WEAK:
        header += [
            "# NOT SIGNIFICANT: the held-out queries cannot tell this gain from noise, so tune",
            "# did not write it as tuned.yaml or to --out. Confirm it on more golden queries",
            "# (`ragpipe eval compare`) before you use it.",
        ]
    if unwritten:
        header += [
            "# WARNING: loaded, this file does not give every setting tune scored (set these",
            "# in it, or load it as they were set):",
            *(f"#   {line}" for line in unwritten),
        ]
    if outcome.ingest:
        header += [
            "# The chunk settings change the points: the next `ragpipe ingest` with this file",
            "# re-chunks and re-embeds every file. The index tune built with them, and scored,",
            f"# is at {outcome.index}.",
        ]
    body = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return "\n".join(header) + "\n" + body


@dataclass
class TuneSummary:
    """What a tune run decided and on what evidence; tune.json is ``as_json()``."""

    metric: str
    seed: int
    split: Split
    current: dict[str, Any]
    overrides: dict[str, Any]
    decision: str  # recommend | recommend, not significant | refused | no change
    message: str
    tuning: dict[str, Any]  # current and best score on the tuning queries, every trial
    confirmation: dict[str, dict[str, Any]]  # metric -> current, tuned, paired delta
    golden: dict[str, Any]  # name, path, check (the golden check's outcome)
    granularity: str
    depth: int
    tuned_config: str | None = None  # the tuned YAML, when the decision is "recommend"
    # The pick's YAML in the report folder (WEAK_FILE), when "recommend, not significant".
    weak_config: str | None = None
    report_dir: str = ""
    ingest: dict[str, Any] = field(default_factory=dict)  # chunk settings the pick changes
    index: str = ""  # the store of the pick's index, when it is not the current one
    warnings: list[str] = field(default_factory=list)  # of the held-out confirmation
    # Settings tune scored that the written tuned file does not give (unwritten_settings).
    config_warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """tune.json's content (everything but ``report_dir``; no tuned_config or
        weak_config unless one was written)."""
        data = asdict(self)
        del data["report_dir"]
        for key in ("tuned_config", "weak_config"):
            if data[key] is None:
                del data[key]
        return data


def tune_summary(outcome: TuneOutcome, config: RagpipeConfig, golden: str) -> TuneSummary:
    return TuneSummary(
        metric=outcome.metric,
        seed=outcome.seed,
        split=outcome.split,
        current=outcome.current,
        overrides=outcome.overrides,
        decision=outcome.decision,
        message=outcome.message,
        tuning={
            "current": outcome.tuning_current,
            "best": outcome.tuning_best,
            "highest": max(t.score for t in outcome.trials),
            "trials": [{"overrides": t.overrides, "score": t.score} for t in outcome.trials],
            "options": outcome.options,
        },
        confirmation={
            m: {"current": outcome.means(m)[0], "tuned": outcome.means(m)[1], **d.as_dict()}
            for m, d in outcome.deltas.items()
        },
        golden={"name": golden, "path": str(config.eval.golden)},
        warnings=list(outcome.confirmation.warnings),
        granularity=config.eval.granularity,
        depth=config.eval.depth,
        ingest=outcome.ingest,
        index=outcome.index,
    )


def markdown(outcome: TuneOutcome) -> str:
    """A readable account: the split, the search, the pick, the held-out verdict."""
    highest = max(t.score for t in outcome.trials)
    lines = [
        f"# Retrieval tuning: {outcome.confirmation.golden.name.removesuffix('-confirmation')}",
        "",
        f"**{outcome.message}**",
        "",
        *[f"> **warning (held-out queries):** {w}" for w in outcome.confirmation.warnings],
        *([""] if outcome.confirmation.warnings else []),
        f"- Split (seed {outcome.seed}): {len(outcome.split.tuning)} tuning queries, "
        f"{len(outcome.split.confirmation)} held-out confirmation queries.",
        f"- Search: {len(outcome.trials)} configurations scored on the tuning queries "
        f"({scores_said(outcome.metric, outcome.tuning_current, outcome.tuning_best, highest)}).",
        f"- Changed settings: `{json.dumps(outcome.changes, sort_keys=True)}`",
        *(
            [f"- The pick's chunk settings are another index: tune built it at `{outcome.index}`."]
            if outcome.ingest
            else []
        ),
        "",
        "## Held-out confirmation (tuned - current)",
        "",
        "| metric | current | tuned | delta | 95% CI | p |",
        "|---|---|---|---|---|---|",
    ]
    for m, delta in outcome.deltas.items():
        ci = delta.interval
        before, after = outcome.means(m)
        lines.append(
            f"| {m} | {before:.4f} | {after:.4f} | {ci.mean:+.4f} | "
            f"{delta_ci(ci).removeprefix('95% CI ')} | {delta.p_value:.3g} |"
        )
    lines += ["", "## What was tried, on the tuning queries", ""]
    lines += ["| setting | verdict |", "|---|---|"]
    lines += [f"| {name} | {why} |" for name, why in outcome.options.items()]
    lines += ["", "## Best configurations on the tuning queries", ""]
    lines += ["| score | changes |", "|---|---|"]
    for trial in sorted(outcome.trials, key=lambda t: -t.score)[:10]:
        lines.append(f"| {trial.score:.4f} | `{json.dumps(trial.overrides, sort_keys=True)}` |")
    return "\n".join(lines) + "\n"


def tune_plot(outcome: TuneOutcome) -> str:
    """Inline SVG: held-out deltas (tuned - current) with their 95% CIs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ragpipe.evaluation.report import mark_no_ci, svg

    names = list(outcome.deltas)
    cis = [outcome.deltas[m].interval for m in names]
    means = [ci.mean for ci in cis]
    shown = [ci.shown for ci in cis]
    low = [ci.mean - ci.low if ok else 0.0 for ci, ok in zip(cis, shown, strict=True)]
    high = [ci.high - ci.mean if ok else 0.0 for ci, ok in zip(cis, shown, strict=True)]
    fig, ax = plt.subplots(figsize=(10, 4))
    bars = ax.bar(range(len(names)), means, yerr=[low, high], capsize=3)
    mark_no_ci(ax, bars, shown)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(names)), names)
    ax.tick_params(axis="x", rotation=30)
    ax.set_ylabel("tuned - current (95% CI)")
    out = svg(fig)
    plt.close(fig)
    return out


def render_tune_html(outcome: TuneOutcome, md: str) -> str:
    """report.html of a tune run: its report.md and the held-out deltas plotted."""
    name = outcome.confirmation.golden.name.removesuffix("-confirmation")
    figures = [("Held-out confirmation: tuned - current", tune_plot(outcome))]
    return html_page(f"ragpipe tune: {name}", md, figures)


def tune_and_report(
    config: RagpipeConfig,
    *,
    metric: str = "ndcg@10",
    share: float = 0.5,
    name: str | None = None,
    base_config: Path | None = None,
    write_config: Path | None = None,
    space: dict[str, list[Any]] | None = None,
    ingest_space: dict[str, list[Any]] | None = None,
) -> tuple[TuneOutcome, TuneSummary]:
    """Tune on ``config.eval.golden`` and write ``<reports_dir>/<time>-<name>/``.

    The run directory holds ``tune.json`` (split, every trial, the held-out
    deltas), ``report.md``, and, when the decision is "recommend", ``tuned.yaml``:
    ``base_config`` with the tuned ``retrieve`` (and, with ``ingest_space``, chunk)
    settings merged in, also written to ``write_config`` when given. A "recommend,
    not significant" pick is kept in the run directory only, as ``WEAK_FILE``.
    Granularity, depth, resamples and seed come from ``config.eval``.

    Raises:
        ConfigError: a split that cannot confirm a pick (``split_queries``), refused
            before any index is built or searched.
    """
    progress = reporter()
    plan_siblings(config, ingest_space)  # a bad chunk setting is refused before any work
    with Retriever(config) as retriever:
        view = IndexView(retriever.store)
        golden, check = checked_golden(config, view, config.eval.granularity)
        scored = replace(golden, items=golden.answerable)  # unanswerable items have no ranks
        split_queries(scored, config.eval.seed, share, "answerable item(s)")  # before any index
        # Built before the tune's progress starts: their ingest reports its own stages.
        siblings = build_siblings(config, ingest_space)
        progress.start("tune", 0)  # the number of configurations is not known up front
        try:
            outcome = run_tune(
                config,
                scored,
                granularity=Granularity(config.eval.granularity),
                depth=config.eval.depth,
                metric=metric,
                seed=config.eval.seed,
                share=share,
                resamples=config.eval.resamples,
                space=space,
                siblings=siblings,
                retriever=retriever,
                progress=progress.advance,
            )
        finally:
            progress.finish()
    summary = tune_summary(outcome, config, golden.name)
    summary.golden["check"] = check.as_dict()
    text = None
    if outcome.decision in RECOMMENDED:
        unwritten = unwritten_settings(config, outcome, tuned_data(outcome, base_config))
        summary.config_warnings = unwritten
        text = tuned_yaml(outcome, base_config, unwritten)
    # An interrupt takes the run directory back (new_run_dir); write_config, outside it, is
    # written last, so that it is never a pick without its report.
    with new_run_dir(config.eval.reports_dir, f"{name or golden.name}-tune") as (_, out):
        summary.report_dir = str(out)
        if text is not None and outcome.decision == WEAK:
            atomic_write_bytes(out / WEAK_FILE, text.encode())
            summary.weak_config = str(out / WEAK_FILE)
        elif text is not None:
            atomic_write_bytes(out / "tuned.yaml", text.encode())
            summary.tuned_config = str(out / "tuned.yaml")  # --out is not written yet
        atomic_write_bytes(out / "tune.json", json.dumps(summary.as_json(), indent=2).encode())
        md = markdown(outcome)
        if summary.weak_config:
            md += (
                "\n> **Not written as tuned.yaml, nor to --out:** its gain cannot be told "
                f"from noise. The pick is kept here as `{WEAK_FILE}`; confirm it on more "
                "golden queries before you use it.\n"
            )
        if summary.config_warnings:
            md += "\n" + "".join(
                f"> **warning (the tuned config):** {w}\n" for w in summary.config_warnings
            )
        if check.skipped:
            md += (
                f"\n> **warning:** {len(check.skipped)} golden items skipped (--skip-unmatched): "
                f"their targets cannot be scored on the index ({', '.join(check.skipped)})\n"
            )
        atomic_write_bytes(out / "report.md", md.encode())
        atomic_write_bytes(out / "report.html", render_tune_html(outcome, md).encode())
    if text is not None and outcome.decision == "recommend" and write_config is not None:
        write_config.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(write_config, text.encode())
        summary.tuned_config = str(write_config)  # tune.json names the report's copy
    return outcome, summary
