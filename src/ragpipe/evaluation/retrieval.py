"""Retrieval evaluation: replay a golden set through the retriever, score every query.

One run evaluates one or more *variants* (retrieval settings) over the same
queries. With several, the first is the baseline and every other variant
gets per-metric paired deltas (bootstrap CI and permutation p-value); an
optional gate fails the run when a metric's delta CI lies entirely below a
threshold.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from ragpipe.config import RagpipeConfig, RetrievalMode, RetrieveConfig
from ragpipe.errors import ConfigError
from ragpipe.evaluation.golden import GoldenItem, GoldenSet, file_matches
from ragpipe.evaluation.metrics import (
    METRICS,
    MIN_CI_N,
    SAME,
    Interval,
    PairedDelta,
    bootstrap_ci,
    paired_delta,
    query_metrics,
)
from ragpipe.evaluation.names import DEEPEST_CUTOFF
from ragpipe.query.results import RetrievalResult, Retrieved
from ragpipe.query.retrieve import Retriever, leg_size

logger = logging.getLogger(__name__)

SMALL_N = 50
# The deepest a file-level ranking searches, in chunks, the same bound for every variant: a
# query whose search's candidates hold fewer than ``depth`` files is searched again with
# legs and depth doubled until they do, the index has no more, or this bound is reached.
FILE_POOL_LIMIT = 2560


class Granularity(StrEnum):
    FILE = "file"
    CHUNK = "chunk"


@dataclass(frozen=True)
class Variant:
    """A named set of ``retrieve.*`` overrides."""

    name: str
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Gate:
    """Fail when the delta CI of ``metric`` (candidate - baseline) lies below ``threshold``."""

    metric: str
    threshold: float


@dataclass
class QueryRow:
    variant: str
    item_id: str
    query: str
    metrics: dict[str, float]
    retrieved: list[str]  # ranked ids at the run's granularity (file suffixes or target keys)
    relevant: dict[str, int]
    search_seconds: float
    # Per rank, what a reader needs to see what came back: file, heading path, snippet.
    ranks: list[dict[str, str]] = field(default_factory=list)
    # file granularity: the file ranking's searches (``FilePool``); None by chunk.
    pool: FilePool | None = None


@dataclass
class EvalResult:
    """Everything a report needs."""

    name: str
    golden: GoldenSet
    granularity: Granularity
    depth: int
    variants: list[Variant]
    settings: dict[str, dict[str, Any]]  # variant -> effective retrieve settings
    rows: list[QueryRow]
    summary: dict[str, dict[str, Interval]]  # variant -> metric -> CI
    deltas: dict[str, dict[str, PairedDelta]]  # variant -> metric -> delta vs baseline
    gate: Gate | None
    gate_failures: list[str]
    warnings: list[str]
    resamples: int
    seed: int
    search_seconds: float
    stats_seconds: float
    traces: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    not_applicable: int = 0  # answerable: false items, which retrieval metrics do not score

    @property
    def baseline(self) -> str:
        return self.variants[0].name

    @property
    def passed(self) -> bool:
        return not self.gate_failures


SNIPPET_CHARS = 240


def describe_hit(hit: Retrieved) -> dict[str, str]:
    """A retrieved chunk as the drill-down shows it: file, heading path, opening text."""
    text = " ".join(hit.text.split())
    snippet = text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS].rsplit(" ", 1)[0] + " …"
    return {"file": hit.file_path, "heading": hit.heading, "snippet": snippet}


def graded_targets(item: GoldenItem) -> list[int]:
    """Indexes of ``item.chunks`` that can be credited (grade > 0), in the order a chunk
    tries them: highest grade first, then by key (never the golden file's order)."""
    graded = [t for t, target in enumerate(item.chunks) if target.grade > 0]
    return sorted(graded, key=lambda t: (-item.chunks[t].grade, item.chunks[t].key))


def credit_chunks(payloads: Sequence[dict[str, Any]], item: GoldenItem) -> list[int | None]:
    """Per chunk (best first), the index in ``item.chunks`` of the target it is credited
    to, or None: each chunk takes the highest-grade target (grade > 0; ties by key) it
    satisfies that no earlier chunk took. A chunk satisfying only targets already found is
    not relevant again.

    Order-free (crediting a chunk to the first target the golden file lists did not: [A,
    B] and [B, A] scored one ranking NDCG 0.797 and 0.826), and an earlier chunk's credit
    never changes, so one more relevant chunk retrieved never lowers a score (a matching
    that moved an earlier chunk to another target could: NDCG 0.826 -> 0.797)."""
    graded = graded_targets(item)
    taken: set[int] = set()
    credited: list[int | None] = []
    for payload in payloads:
        target = next(
            (t for t in graded if t not in taken and item.chunks[t].matches(payload)), None
        )
        if target is not None:
            taken.add(target)
        credited.append(target)
    return credited


def judged(
    hits: Sequence[Retrieved], item: GoldenItem, granularity: Granularity
) -> tuple[list[str], dict[str, int]]:
    """Ranked unique ids and graded qrels for one query at the granularity.

    file: each hit becomes the golden file suffix it matches (or its own
    path), which counts once, at its best rank; chunk: every retrieved chunk
    keeps its rank, as the key of the target it is credited to
    (``credit_chunks``) or as its own point id (not relevant: a second chunk
    of a target already found adds nothing). So @5 is over the 5 chunks a
    search for 5 returns.
    """
    ranked, qrels, _ = judged_hits(hits, item, granularity)
    return ranked, qrels


def judged_hits(
    hits: Sequence[Retrieved], item: GoldenItem, granularity: Granularity
) -> tuple[list[str], dict[str, int], list[Retrieved]]:
    """``judged``, plus the hit that stands for each ranked id (its best-ranked chunk)."""
    ranked: list[str] = []
    best: list[Retrieved] = []
    if granularity == Granularity.FILE:
        qrels = dict(item.relevance)
        for hit in hits:
            key = next((s for s in qrels if file_matches(hit.file_path, s)), hit.file_path)
            if key not in ranked:
                ranked.append(key)
                best.append(hit)
        return ranked, qrels, best
    if not item.chunks:
        raise ConfigError(
            f"golden item {item.id} has no chunk targets: evaluate it with granularity 'file', "
            "or add 'chunks' (file + heading or contains) to the item"
        )
    qrels = {t.key: t.grade for t in item.chunks}
    credited = credit_chunks([h.payload for h in hits], item)
    for hit, target in zip(hits, credited, strict=True):
        key = item.chunks[target].key if target is not None else hit.point_id
        if key not in ranked:  # a chunk returned twice (several query fragments) counts once
            ranked.append(key)
            best.append(hit)
    return ranked, qrels, best


def search_depth(depth: int, granularity: Granularity, settings: dict[str, Any]) -> int:
    """Chunks a variant's own search is asked for.

    chunk: ``depth``. file: as many chunks as its legs hold (``prefetch``, at least
    ``depth``; it never ranks past its legs), since several chunks of one file rank one
    file; when those still hold fewer than ``depth`` files, ``file_search`` searches
    deeper. ``Retriever.search(depth=...)`` ranks its first top_k as a user's search does,
    so the order is the one a user gets.
    """
    if granularity == Granularity.CHUNK:
        return depth
    return max(depth, int(settings.get("prefetch", depth)))


@dataclass(frozen=True)
class FilePool:
    """How a file-level ranking was searched for one query."""

    first_files: int  # files among the variant's own search's candidates
    first_chunks: int  # the chunks that search was asked for
    files: int  # files ranked in the end (at most the eval's depth)
    chunks: int  # the chunks the deepest search was asked for
    prefetch: int  # that search's legs (the variant's own prefetch when it went no deeper)
    exhausted: bool  # the deepest search returned fewer chunks than asked: no more to find

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def file_search(
    searcher: Retriever,
    item: GoldenItem,
    depth: int,
    settings: dict[str, Any],
    overrides: Mapping[str, Any],
) -> tuple[RetrievalResult, list[str], dict[str, int], list[Retrieved], FilePool]:
    """A variant's file ranking of ``item``: its own search, then deeper ones if needed.

    A file counts at its best chunk, so a long file whose chunks fill the search's
    candidates (``prefetch`` of them) leaves fewer than ``depth`` files ranked: one file
    of 60 matching sections ranked that file alone, and recall@10 and NDCG@10 were
    computed over it. The variant's own ranking is kept as it is, and the files after it
    come from the same settings searched deeper (legs and depth doubled, up to
    ``FILE_POOL_LIMIT`` chunks), in that search's order, until ``depth`` files are ranked
    or a search returns fewer chunks than asked (nothing more to find: the index, a
    filter, a floor or the LLM filter holds no more). So every variant ranks ``depth``
    files where the index has them, and a larger ``prefetch`` cannot score higher only by
    letting more files in.

    Returns:
        The variant's own search, the ranked file keys, the qrels, the hit standing for
        each ranked file, and how the ranking was searched.
    """
    asked = search_depth(depth, Granularity.FILE, settings)
    result = searcher.search(item.query, depth=asked, **overrides)
    ranked, qrels, best = judged_hits(result.hits, item, Granularity.FILE)
    first = len(ranked)
    chosen = RetrieveConfig.model_validate(settings)
    sparse = chosen.mode == RetrievalMode.SPARSE
    legs = chosen.prefetch  # the deepest search's legs
    # A fused or dense search returns no more than its legs hold (BM25 alone ranks on).
    full = len(result.hits) >= (asked if sparse else min(asked, leg_size(chosen)))
    chunks = asked
    while len(ranked) < depth and full and chunks < FILE_POOL_LIMIT:
        chunks = min(2 * chunks, FILE_POOL_LIMIT)
        deeper = dict(overrides)
        if not sparse:  # BM25 alone has no legs: it ranks as deep as asked
            legs = deeper["prefetch"] = max(chunks, chosen.prefetch)
        more = searcher.search(item.query, depth=chunks, **deeper)
        keys, _, hits = judged_hits(more.hits, item, Granularity.FILE)
        for key, hit in zip(keys, hits, strict=True):
            if key not in ranked:
                ranked.append(key)
                best.append(hit)
        full = len(more.hits) >= chunks
    pool = FilePool(
        first_files=first,
        first_chunks=asked,
        files=min(len(ranked), depth),
        chunks=chunks,
        prefetch=legs,
        exhausted=not full,
    )
    result.trace["file_pool"] = pool.as_dict()
    return result, ranked, qrels, best, pool


def refuse_missing_chunks(
    items: Sequence[GoldenItem], granularity: Granularity, where: str = ""
) -> None:
    """Scoring by chunk needs each item's ``chunks:`` targets.

    Args:
        items: The answerable items to score.
        granularity: What a hit is judged by.
        where: Said before the message (e.g. the gate's golden set).

    Raises:
        ConfigError: some item has no chunk target and ``granularity`` is chunk.
    """
    missing = [i.id for i in items if not i.chunks]
    if granularity == Granularity.CHUNK and missing:
        raise ConfigError(
            f"{where}granularity 'chunk' needs chunk targets; {len(missing)} item(s) have "
            f"none (first: {missing[0]}): score by file with eval.granularity: file in the "
            "configuration (--granularity file on `ragpipe eval retrieval`), or add "
            "chunks: to each item (docs/reference/golden-format.md)"
        )


def corpus_fingerprint(retriever: Retriever) -> dict[str, Any]:
    """What was searched: files and versions in the store, hashed."""
    pairs = sorted(
        {
            (str(h.payload.get("file_path")), str(h.payload.get("source_sha")))
            for h in retriever.store.scroll(fields=["file_path", "source_sha"])
        }
    )
    digest = hashlib.sha256("\n".join(f"{p}\t{s}" for p, s in pairs).encode()).hexdigest()
    return {
        "files": len(pairs),
        "points": retriever.store.count(),
        "sha256": digest[:16],
        # The published index version read: generation, build fingerprint, when published.
        "index_version": retriever.index_version,
    }


def run_retrieval_eval(
    config: RagpipeConfig,
    golden: GoldenSet,
    variants: Sequence[Variant] | None = None,
    *,
    name: str | None = None,
    granularity: Granularity = Granularity.CHUNK,
    depth: int = 10,
    resamples: int = 1000,
    seed: int = 0,
    gate: Gate | None = None,
    retriever: Retriever | None = None,
    retrievers: Mapping[str, Retriever] | None = None,
    progress: Callable[[int], None] | None = None,
) -> EvalResult:
    """Score every golden query under every variant (the first is the baseline).

    ``retrievers``: variant name -> the retriever (another index of the same sources)
    that variant searches; the others search ``retriever`` (or one opened on ``config``).
    """
    variants = list(variants or [Variant("default")])
    if len({v.name for v in variants}) != len(variants):
        raise ConfigError("variant names must be unique")
    unknown = sorted(set(retrievers or {}) - {v.name for v in variants})
    if unknown:
        raise ConfigError(f"retrievers given for no variant: {', '.join(unknown)}")
    if gate is not None and gate.metric not in METRICS:
        raise ConfigError(f"gate metric {gate.metric!r} is not one of {', '.join(METRICS)}")
    if depth < DEEPEST_CUTOFF:
        raise ConfigError(
            f"depth {depth} (eval.depth, --depth) is below {DEEPEST_CUTOFF}, the deepest "
            f"cutoff scored (recall@{DEEPEST_CUTOFF}, NDCG@{DEEPEST_CUTOFF}): those would be "
            f"computed on {depth} results under the @{DEEPEST_CUTOFF} name; use a depth of "
            f"{DEEPEST_CUTOFF} or more"
        )
    settings: dict[str, dict[str, Any]] = {}
    for variant in variants:  # validate every variant before any search runs
        merged = {**config.retrieve.model_dump(mode="json"), **variant.overrides}
        try:
            settings[variant.name] = RetrieveConfig.model_validate(merged).model_dump(mode="json")
        except ValueError as exc:
            raise ConfigError(f"variant {variant.name!r}: {exc}") from exc
    items = golden.answerable
    if not items:
        raise ConfigError(
            f"golden set {golden.name!r} has no answerable item: retrieval metrics need items "
            "with targets (answerable: false items are scored by `ragpipe eval rag` only)"
        )
    refuse_missing_chunks(items, granularity)
    own = retriever is None
    retriever = retriever or Retriever(config)
    asked = {v.name: search_depth(depth, granularity, settings[v.name]) for v in variants}
    rows: list[QueryRow] = []
    traces: dict[str, list[dict[str, Any]]] = {}
    search_seconds = 0.0
    try:
        for variant in variants:
            for item in items:
                started = time.perf_counter()
                searcher = (retrievers or {}).get(variant.name, retriever)
                pool: FilePool | None = None
                if granularity == Granularity.FILE:
                    result, ranked, qrels, best, pool = file_search(
                        searcher, item, depth, settings[variant.name], variant.overrides
                    )
                else:
                    # The variant's own search, deeper: its first top_k are what it returns.
                    result = searcher.search(
                        item.query, depth=asked[variant.name], **variant.overrides
                    )
                    ranked, qrels, best = judged_hits(result.hits, item, granularity)
                elapsed = time.perf_counter() - started
                search_seconds += elapsed
                shown = [describe_hit(h) for h in best[:depth]]
                rows.append(
                    QueryRow(
                        variant.name, item.id, item.query, {}, ranked[:depth], qrels, elapsed,
                        shown, pool,
                    )
                )  # fmt: skip
                traces.setdefault(variant.name, []).append(result.trace)
                if progress is not None:
                    progress(1)
    finally:
        if own:
            retriever.close()
    started = time.perf_counter()
    for row in rows:
        row.metrics = query_metrics(row.retrieved, row.relevant)
    summary: dict[str, dict[str, Interval]] = {}
    per_variant: dict[str, dict[str, list[float]]] = {}
    for variant in variants:
        values = {m: [r.metrics[m] for r in rows if r.variant == variant.name] for m in METRICS}
        per_variant[variant.name] = values
        summary[variant.name] = {m: bootstrap_ci(v, resamples, seed) for m, v in values.items()}
    deltas: dict[str, dict[str, PairedDelta]] = {}
    base = per_variant[variants[0].name]
    for variant in variants[1:]:
        deltas[variant.name] = {
            m: paired_delta(base[m], per_variant[variant.name][m], resamples, seed) for m in METRICS
        }
    stats_seconds = time.perf_counter() - started
    gate_failures = []
    if gate is not None:
        for candidate, by_metric in deltas.items():
            delta = by_metric[gate.metric].interval
            moved = np.subtract(per_variant[candidate][gate.metric], base[gate.metric])
            alike = moved.size >= 2 and float(np.ptp(moved)) <= SAME  # a drop on each is one
            if alike:
                if delta.mean < gate.threshold:
                    gate_failures.append(
                        f"{candidate}: {gate.metric} delta is {delta.mean:+.4f} on every one "
                        f"of the {delta.n} paired queries (no CI: every delta equal), below "
                        f"{gate.threshold:+.4f} (baseline {variants[0].name})"
                    )
            elif not delta.has_ci:
                gate_failures.append(
                    f"{candidate}: {gate.metric} delta has no CI ({delta.n} paired queries): "
                    f"the gate cannot hold on fewer than {MIN_CI_N}"
                )
            elif delta.zero_width and delta.high < gate.threshold:  # every query alike
                gate_failures.append(
                    f"{candidate}: {gate.metric} delta is {delta.mean:+.4f} on every one of "
                    f"the {delta.n} paired queries (no CI: every delta equal), below "
                    f"{gate.threshold:+.4f} (baseline {variants[0].name})"
                )
            elif delta.high < gate.threshold:
                gate_failures.append(
                    f"{candidate}: {gate.metric} delta CI [{delta.low:+.4f}, {delta.high:+.4f}] "
                    f"is entirely below {gate.threshold:+.4f} (baseline {variants[0].name})"
                )
    warnings = []
    n = len(items)
    if len(items) < len(golden.items):
        warnings.append(
            f"{len(golden.items) - len(items)} answerable: false item(s) not applicable to "
            "retrieval metrics"
        )
    if n < SMALL_N:
        warnings.append(
            f"only {n} queries (< {SMALL_N}): confidence intervals are wide"
            + (f", and below {MIN_CI_N} there are none" if n < MIN_CI_N else "")
        )
    for variant in variants:  # what the search can rank is all it is scored on
        chosen = settings[variant.name]
        filtered = filter_warning(variant.name, chosen)
        if filtered:
            warnings.append(filtered)
        if granularity == Granularity.FILE:
            warnings += file_pool_warnings(
                variant.name, chosen, [r.pool for r in rows if r.variant == variant.name], depth
            )
        if chosen.get("llm_filter") and int(chosen["top_k"]) < DEEPEST_CUTOFF:
            warnings.append(
                f"{variant.name}: retrieve.llm_filter ranks at most top_k={chosen['top_k']} "
                f"chunks (what the search returns), so its @{DEEPEST_CUTOFF} metrics are over "
                "them"
            )
            continue
        if granularity == Granularity.FILE:  # file_search searched deeper where it could
            continue
        legs = leg_size(RetrieveConfig.model_validate(chosen))
        if chosen["mode"] != "sparse" and legs < asked[variant.name]:
            warnings.append(
                f"{variant.name}: its legs hold {legs} candidates (retrieve.prefetch), fewer "
                f"than the {asked[variant.name]} chunks the eval ranks, and a search never "
                f"ranks past them: its @{DEEPEST_CUTOFF} metrics may be over fewer; raise "
                "prefetch to score deeper"
            )
    return EvalResult(
        name=name or golden.name,
        golden=golden,
        granularity=granularity,
        depth=depth,
        variants=variants,
        settings=settings,
        rows=rows,
        summary=summary,
        deltas=deltas,
        gate=gate,
        gate_failures=gate_failures,
        warnings=warnings,
        resamples=resamples,
        seed=seed,
        search_seconds=search_seconds,
        stats_seconds=stats_seconds,
        traces=traces,
        not_applicable=len(golden.items) - len(items),
    )


def file_pool_warnings(
    name: str, settings: dict[str, Any], pools: Sequence[FilePool | None], depth: int
) -> list[str]:
    """What a variant's file rankings say beyond their scores: queries whose own search's
    candidates held fewer than ``depth`` files (ranked on by deeper searches), and queries
    that ranked fewer than ``depth`` files all the same (their metrics are over fewer)."""
    known = [p for p in pools if p is not None]
    out = []
    sparse = settings["mode"] == RetrievalMode.SPARSE.value
    grown = [p for p in known if p.chunks > p.first_chunks]
    if grown:
        own = f"{grown[0].first_chunks} chunks" + (
            "" if sparse else f", prefetch={settings['prefetch']}"
        )
        deepest = max(p.chunks if sparse else p.prefetch for p in grown)
        out.append(
            f"{name}: {len(grown)} of {len(known)} queries' candidates ({own}) held fewer than "
            f"{depth} files (fewest: {min(p.first_files for p in grown)}): several chunks of "
            "one file rank one file. The files after them were ranked by the same settings "
            f"searched deeper ({'depth' if sparse else 'prefetch'} up to {deepest}); a user's "
            "search sees only the first files"
        )
    # A search that reaches every chunk (dense or hybrid, nothing filtered) and ran out
    # ranked every file of the index: a complete ranking, short of depth only on a small
    # index. Anything else ranks only what its settings let through, or stopped at the bound.
    narrowing = narrowed_by(settings)
    short = [p for p in known if p.files < depth and (narrowing or not p.exhausted)]
    if short:
        bounded = sum(not p.exhausted for p in short)
        why = f"their search reaches no other file ({'; '.join(narrowing)})"
        if bounded:
            why = f"{bounded} stopped at the bound of {FILE_POOL_LIMIT} chunks" + (
                f", the others' search reaches no other file ({'; '.join(narrowing)})"
                if bounded < len(short)
                else ""
            )
        out.append(
            f"{name}: {len(short)} of {len(known)} queries ranked fewer than {depth} files "
            f"(fewest: {min(p.files for p in short)}; the first search's candidates held "
            f"{min(p.first_files for p in short)}): {why}. Their metrics are over fewer "
            f"than {depth} files"
        )
    return out


FILTERS = ("filter_file", "filter_heading", "filter_source_sha")


def narrowed_by(settings: dict[str, Any]) -> list[str]:
    """What keeps a search from reaching every chunk of the index, said per setting."""
    said = []
    if settings["mode"] == RetrievalMode.SPARSE.value:
        said.append("BM25 alone ranks only chunks that share a word with the query")
    said += [f"{k}={settings[k]!r} lets only some through" for k in FILTERS if settings.get(k)]
    if settings.get("min_dense_score") is not None:
        said.append(f"min_dense_score={settings['min_dense_score']} drops the dense leg's others")
    if settings.get("llm_filter"):
        said.append(f"the LLM filter keeps at most top_k={settings['top_k']}")
    return said


def filter_warning(name: str, settings: dict[str, Any]) -> str | None:
    """The warning for a run searching through ``retrieve.filter_*``: items whose answers
    lie outside the filter score 0 whatever the ranking (said nowhere before)."""
    filters = [f"{k}={settings[k]!r}" for k in FILTERS if settings.get(k)]
    if not filters:
        return None
    return (
        f"{name}: searches only what {', '.join(filters)} lets through; an item whose "
        "targets lie outside it scores 0, whatever the ranking (a filter set for one team's "
        "search is no setting to evaluate the index with)"
    )


def parse_variant(text: str) -> Variant:
    """``name:key=value,key=value`` (values parsed as YAML scalars) into a Variant."""
    import yaml

    name, sep, rest = text.partition(":")
    if not name.strip():
        raise ConfigError(f"variant {text!r}: use NAME:key=value,key=value (e.g. dense:mode=dense)")
    if "|" in name or not name.isprintable():
        # A column of the reports' tables: "sparse|bm25" split into two columns, and every
        # number after it stood under the wrong heading.
        raise ConfigError(
            f"variant {text!r}: the name {name.strip()!r} holds a '|' or a control character, "
            "which would break the reports' tables; name it e.g. sparse-bm25"
        )
    overrides: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))) if sep else []:
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in RetrieveConfig.model_fields:
            raise ConfigError(
                f"variant {text!r}: {part!r} is not retrieve.KEY=VALUE (keys: "
                f"{', '.join(RetrieveConfig.model_fields)})"
            )
        overrides[key.strip()] = yaml.safe_load(value)
    return Variant(name.strip(), overrides)
