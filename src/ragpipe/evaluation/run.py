"""An evaluation run, end to end: score, summarise (typed), write the report files.

``run_retrieval`` (one configuration, or a comparison of variants) and ``run_rag``
score ``config.eval.golden`` and hand their result to the one writer, ``write_run``,
which lays out ``<reports_dir>/<UTC time>-<name>/``::

    per_query.parquet   one row per (variant, question): RETRIEVAL_QUERY_SCHEMA or
                        RAG_QUERY_SCHEMA
    summary.json        RunSummary.as_json(): everything needed to trust or reproduce
                        the numbers (secrets masked)
    report.md, report.html   rendered by ``ragpipe.evaluation.report``

and appends the run's means to ``<reports_dir>/history.parquet``. Both return the
``RunSummary`` (with ``report_dir``) that the Prefect tasks hand on.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ragpipe.checkpoint import atomic_write_bytes, signals_deferred, write_table
from ragpipe.config import RagpipeConfig
from ragpipe.errors import ConfigError
from ragpipe.evaluation.check import (
    GoldenCheck,
    IndexView,
    evidence,
    evidence_changes,
    golden_for_index,
)
from ragpipe.evaluation.golden import GoldenSet, item_digest, load_golden
from ragpipe.evaluation.metrics import METHOD, METRICS, SAME, Interval
from ragpipe.evaluation.rag import ALL_RAG_METRICS, RAG_METRICS, RagEvalResult, run_rag_eval
from ragpipe.evaluation.report import WITHHELD, render_html, render_markdown
from ragpipe.evaluation.retrieval import (
    EvalResult,
    Gate,
    Granularity,
    Variant,
    corpus_fingerprint,
    run_retrieval_eval,
)
from ragpipe.models.embedders import embedder_name
from ragpipe.query.retrieve import Retriever

logger = logging.getLogger(__name__)

HISTORY = "history.parquet"
# Flagged and withheld metrics, apart: a reader of history.parquet (an older ragpipe on the
# same reports folder too) takes every row there for a value.
FLAGGED_HISTORY = "history-flagged.parquet"
HISTORY_LOCK = ".history.lock"
PACKAGES = (
    "ragpipe",
    "qdrant-edge-py",
    "qdrant-client",
    "sentence-transformers",
    "numpy",
    "xllamacpp",
    "rank-bm25",
)
HISTORY_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("finished_at", pa.string()),
        ("name", pa.string()),
        ("golden", pa.string()),
        ("granularity", pa.string()),
        ("variant", pa.string()),
        ("kind", pa.string()),  # retrieval, compare, rag
        ("queries", pa.int64()),  # golden items scored (a --limit or skipped run has fewer)
        # Which items, at what depth (scope()): runs of another scope share no trend line.
        ("scope", pa.string()),
        # A judged metric's judge (judge_identity(); "" for the others): runs of another
        # judge share no trend line either.
        ("judge", pa.string()),
        # A RAG run's generator (generator_identity(); "" for other runs, null in files from
        # before it): answers of another model or settings share no trend line.
        ("generator", pa.string()),
        ("metric", pa.string()),
        ("mean", pa.float64()),
        ("ci_low", pa.float64()),
        ("ci_high", pa.float64()),
        ("n", pa.int64()),
        # Items the metric failed on and did not apply to (null in files from before),
        # shown beside n as the headline shows them.
        ("n_failed", pa.int64()),
        ("n_not_applicable", pa.int64()),
        ("git_revision", pa.string()),
        # Why the number is not to be read as a value (a judge not calibrated, too many
        # items not scored; a withheld metric has no mean either); null for a value. Such
        # a row is never a trend point; the lists of runs show it with its flag.
        ("flag", pa.string()),
    ]
)
# per_query.parquet of a retrieval or compare run: one row per (variant, question).
RETRIEVAL_QUERY_SCHEMA = pa.schema(
    [
        pa.field("variant", pa.string(), False),
        pa.field("item_id", pa.string(), False),
        pa.field("query", pa.string(), False),
        pa.field("retrieved", pa.list_(pa.string()), False),  # ranked, at the run's granularity
        pa.field("relevant", pa.string(), False),  # JSON: {target: grade}
        pa.field("search_seconds", pa.float64(), False),
        # Per rank, beside ``retrieved``: the chunk's file, heading path and opening text.
        pa.field("retrieved_files", pa.list_(pa.string()), False),
        pa.field("retrieved_headings", pa.list_(pa.string()), False),
        pa.field("retrieved_snippets", pa.list_(pa.string()), False),
        *(pa.field(m, pa.float64(), False) for m in METRICS),
    ]
)
# per_query.parquet of a RAG run: one row per question. A metric that could not be
# scored is null, with its status (ok, failed, not_applicable) and reason beside it.
RAG_QUERY_SCHEMA = pa.schema(
    [
        pa.field("variant", pa.string(), False),
        pa.field("item_id", pa.string(), False),
        pa.field("query", pa.string(), False),
        pa.field("answerable", pa.bool_(), False),
        pa.field("answer", pa.string(), False),
        pa.field("not_found", pa.bool_(), False),
        pa.field("cited", pa.int64(), False),
        pa.field("invalid_citations", pa.list_(pa.int64()), False),
        pa.field("tokens_in", pa.int64(), False),
        pa.field("tokens_out", pa.int64(), False),
        pa.field("generation_seconds", pa.float64(), False),
        pa.field("context_precision_kind", pa.string(), False),
        pa.field("contexts", pa.list_(pa.string()), False),  # numbered as cited
        pa.field("source_files", pa.list_(pa.string()), False),  # per source number
        pa.field("source_headings", pa.list_(pa.string()), False),
        pa.field("source_holds_target", pa.list_(pa.bool_()), False),
        pa.field("cited_numbers", pa.list_(pa.int64()), False),  # valid and invalid
        pa.field("repetition_share", pa.float64(), False),
        pa.field("flags", pa.list_(pa.string()), False),  # the answer's, as ask shows them
        pa.field("withdrawn", pa.string()),  # written before "not found" (answer_withdrawn)
        pa.field("expected_answer", pa.string()),
        *(
            f
            for m in ALL_RAG_METRICS
            for f in (
                pa.field(m, pa.float64()),
                pa.field(f"{m}_status", pa.string(), False),
                pa.field(f"{m}_reason", pa.string()),
            )
        ),
    ]
)


def git_revision(repo: Path | None = None) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=repo or Path.cwd(),
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


@dataclass
class GoldenInfo:
    name: str
    source: str
    queries: int
    selection: str = ""  # which items were scored: all, the first N, a sample (rag.item_selection)
    # Each scored item's golden.item_digest: an edited set is another trend line (scope)
    # and named in the run's warnings (with_drift). Empty in runs from before it.
    items: dict[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        """The scored items' digests together (8 hex digits); "" when not recorded."""
        if not self.items:
            return ""
        joined = json.dumps(sorted(self.items.items())).encode()
        return hashlib.sha256(joined).hexdigest()[:8]


@dataclass
class GateOutcome:
    """The gate of a compare run: ``passed`` unless a variant's ``metric`` delta CI lies
    entirely below ``threshold`` (``failures`` say which)."""

    metric: str
    threshold: float
    passed: bool
    failures: list[str]


# A metric's mean with its 95% CI and counts ({mean, ci_low, ci_high, n, n_failed,
# n_not_applicable, flag, withheld}; mean null when n = 0, CI null when n < MIN_CI_N or
# every value is the same: metrics.Interval.as_dict), or a paired delta ({mean, ci_low,
# ci_high, n, p_value}): as written to summary.json.
Stats = dict[str, Any]


def stats(
    ci: Interval, failed: int = 0, not_applicable: int = 0, flag: str | None = None,
    withheld: bool = False,
) -> Stats:  # fmt: skip
    """A metric as summary.json holds it: the CI, how many items it scored, failed and did
    not apply to, and why it is not to be read as a value (``flag``, ``withheld``). A
    withheld metric has no mean and no CI here either (a reader of ``.mean`` got the
    unreliable judge's number); its per-item scores stay in per_query.parquet."""
    values = ci.as_dict()
    if withheld:
        values.update(mean=None, ci_low=None, ci_high=None)
    return {
        **values,
        "n_failed": failed,
        "n_not_applicable": not_applicable,
        "flag": flag,
        "withheld": withheld,
    }


@dataclass
class RunSummary:
    """What one evaluation run measured, and everything needed to trust or reproduce it.

    ``summary.json`` is ``as_json()``; ``report_dir`` is where the run's files are.
    """

    run_id: str
    name: str
    kind: Literal["retrieval", "compare", "rag"]
    metric_names: list[str]
    finished_at: str
    golden: GoldenInfo
    granularity: str  # file, chunk; "answer" for RAG
    depth: int
    corpus: dict[str, Any]  # files, points, sha256, index_version (retrieval.corpus_fingerprint)
    models: dict[str, Any]
    variants: dict[str, dict[str, Any]]  # variant -> effective retrieve settings
    baseline: str
    statistics: dict[str, Any]
    metrics: dict[str, dict[str, Stats]]  # variant -> metric -> mean and CI
    deltas: dict[str, dict[str, Stats]]  # variant -> metric -> paired delta vs baseline
    warnings: list[str]
    config: dict[str, Any]  # the effective configuration, secrets masked
    versions: dict[str, str]
    git_revision: str | None
    gate: GateOutcome | None = None
    judge: dict[str, Any] | None = None  # RAG: model, outcome counts, calibration, PPI
    # RAG: how many answers carry each of generate's flags, and the untrusted ones
    # (rag.answer_flag_counts); None for retrieval runs and runs from before it.
    answer_flags: dict[str, Any] | None = None
    golden_check: dict[str, Any] | None = None  # targets checked, unmatched, skipped items
    timing: dict[str, float] = field(default_factory=dict)
    # Per item, the files its targets name and their source SHA-256 (check.evidence); the
    # items whose evidence changed since the last run of the same golden set, and why.
    evidence: dict[str, dict[str, str]] = field(default_factory=dict)
    evidence_changed: dict[str, str] = field(default_factory=dict)
    evidence_since: dict[str, Any] | None = None  # that run: run_id, index version
    report_dir: str = ""

    @property
    def gate_failed(self) -> bool:
        return self.gate is not None and not self.gate.passed

    def as_json(self) -> dict[str, Any]:
        """summary.json's content (everything but ``report_dir``)."""
        data = asdict(self)
        del data["report_dir"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], report_dir: str = "") -> RunSummary:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["golden"] = GoldenInfo(**data["golden"])
        values["gate"] = GateOutcome(**data["gate"]) if data.get("gate") else None
        values["report_dir"] = report_dir
        return cls(**values)


def retrieval_summary(
    result: EvalResult, config: RagpipeConfig, corpus: dict[str, Any]
) -> RunSummary:
    """The typed summary of a retrieval or compare run (no run id or directory yet)."""
    return RunSummary(
        run_id="",
        name=result.name,
        kind="retrieval" if len(result.variants) == 1 else "compare",
        metric_names=list(METRICS),
        finished_at=datetime.now(UTC).isoformat(),
        golden=GoldenInfo(
            result.golden.name,
            result.golden.source,
            len(result.golden.items),
            f"all {len(result.golden.items)} items",
            {i.id: item_digest(i) for i in result.golden.items},
        ),
        granularity=result.granularity.value,
        depth=result.depth,
        corpus=corpus,
        models={
            "embedder": embedder_name(config.embed),
            **{
                v: {"reranker": s["reranker"] if s["rerank"] else "none"}
                for v, s in result.settings.items()
            },
        },
        variants=result.settings,
        baseline=result.baseline,
        statistics={
            "method": METHOD,
            "level": 0.95,
            "resamples": result.resamples,
            "seed": result.seed,
            "paired": "bootstrap of per-query deltas; sign-flip permutation p-value",
        },
        metrics={
            v: {m: stats(ci, 0, result.not_applicable) for m, ci in by.items()}
            for v, by in result.summary.items()
        },
        deltas={v: {m: d.as_dict() for m, d in by.items()} for v, by in result.deltas.items()},
        gate=None
        if result.gate is None
        else GateOutcome(
            result.gate.metric, result.gate.threshold, result.passed, result.gate_failures
        ),
        warnings=result.warnings,
        timing={"search_s": result.search_seconds, "metrics_and_ci_s": result.stats_seconds},
        config=config.model_dump(mode="json"),
        versions=versions(),
        git_revision=git_revision(),
    )


def retrieval_table(result: EvalResult) -> pa.Table:
    """per_query.parquet of a retrieval or compare run (RETRIEVAL_QUERY_SCHEMA)."""
    rows = result.rows
    columns: list[list[Any]] = [
        [r.variant for r in rows],
        [r.item_id for r in rows],
        [r.query for r in rows],
        [r.retrieved for r in rows],
        [json.dumps(r.relevant) for r in rows],
        [r.search_seconds for r in rows],
        [[x["file"] for x in r.ranks] for r in rows],
        [[x["heading"] for x in r.ranks] for r in rows],
        [[x["snippet"] for x in r.ranks] for r in rows],
        *([r.metrics[m] for r in rows] for m in METRICS),
    ]
    return pa.Table.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, RETRIEVAL_QUERY_SCHEMA, strict=True)],
        schema=RETRIEVAL_QUERY_SCHEMA,
    )


def _scored_digests(result: RagEvalResult) -> dict[str, str]:
    scored = {r.item_id for r in result.rows}
    return {i.id: item_digest(i) for i in result.golden.items if i.id in scored}


def rag_summary(result: RagEvalResult, config: RagpipeConfig, corpus: dict[str, Any]) -> RunSummary:
    """The typed summary of a RAG run (no run id or directory yet)."""
    return RunSummary(
        run_id="",
        name=result.name,
        kind="rag",
        metric_names=list(ALL_RAG_METRICS),
        finished_at=datetime.now(UTC).isoformat(),
        golden=GoldenInfo(result.golden.name, result.golden.source, len(result.rows),
                          result.selection, _scored_digests(result)),
        granularity="answer",
        depth=config.retrieve.top_k,
        corpus=corpus,
        models={"embedder": embedder_name(config.embed), "generator": result.generator,
                "generator_settings": result.generator_settings,
                "judge": result.judge["model"]},
        variants={"rag": config.retrieve.model_dump(mode="json")},
        baseline="rag",
        statistics={"method": f"{METHOD} over scored queries", "level": 0.95,
                    "resamples": result.resamples, "seed": result.seed},
        metrics={"rag": {
            m: stats(ci, result.counts[m]["failed"], result.counts[m]["not_applicable"],
                     result.flags.get(m), m in result.withheld)
            for m, ci in result.summary.items()
        }},
        deltas={},
        judge=result.judge,
        answer_flags=result.answer_flags,
        warnings=result.warnings,
        config=config.model_dump(mode="json"),
        versions=versions(),
        git_revision=git_revision(),
    )  # fmt: skip


def rag_table(result: RagEvalResult) -> pa.Table:
    """per_query.parquet of a RAG run (RAG_QUERY_SCHEMA)."""
    expected = {i.id: i.expected_answer for i in result.golden.items}
    rows = [
        {
            "variant": "rag",
            "item_id": r.item_id,
            "query": r.query,
            "answerable": r.answerable,
            "answer": r.answer,
            "not_found": r.not_found,
            "cited": r.cited,
            "invalid_citations": r.invalid_citations,
            "tokens_in": r.tokens_in,
            "tokens_out": r.tokens_out,
            "generation_seconds": r.generation_seconds,
            "context_precision_kind": r.context_precision_kind,
            "contexts": r.contexts,
            "source_files": [x["file"] for x in r.sources],
            "source_headings": [x["heading"] for x in r.sources],
            "source_holds_target": [x["holds_target"] for x in r.sources],
            "cited_numbers": r.cited_numbers,
            "repetition_share": r.repetition,
            "flags": r.flags,
            "withdrawn": r.withdrawn,
            "expected_answer": expected.get(r.item_id),
            **{
                key: value
                for m in ALL_RAG_METRICS
                for key, value in (
                    (m, r.judged[m].value),
                    (f"{m}_status", r.judged[m].status),
                    (f"{m}_reason", r.judged[m].reason),
                )
            },
        }
        for r in result.rows
    ]
    return pa.Table.from_pylist(rows, schema=RAG_QUERY_SCHEMA)


# The most bytes (UTF-8) of a name in a file name: most file systems allow 255 in all, and
# a run id adds a time stamp and a -N to it.
SLUG_BYTES = 100


def file_slug(name: str, keep: str = "-_", unique: bool = False) -> str:
    """``name`` as part of a file name: letters, digits and ``keep`` as they are, anything
    else "-". Over SLUG_BYTES bytes of UTF-8 it is cut at a character and ends in "-" and
    the first 8 hex digits of the whole name's SHA-256, so that long names sharing their
    start stay apart (a run named with 60 times 評価, 360 bytes, was lost at its very end:
    "File name too long"). With ``unique`` (a file named for the name alone, no time stamp)
    so does a name the slug changed, or one with a capital letter: "faq v2" and "faq-v2"
    were one file, as "FAQ" and "faq" are on a file system blind to case."""
    slug = "".join(c if c.isalnum() or c in keep else "-" for c in name)
    mark = "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    if len(slug.encode()) > SLUG_BYTES:
        return slug.encode()[: SLUG_BYTES - len(mark)].decode("utf-8", errors="ignore") + mark
    return slug + mark if unique and (slug != name or name != name.lower()) else slug


def run_dir(root: Path, name: str) -> tuple[str, Path]:
    """A new ``<root>/<UTC time>-<slug of name>/`` directory and its run id (the slug at
    most SLUG_BYTES bytes: ``file_slug``; summary.json keeps the whole name)."""
    slug = file_slug(name)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    root.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):  # two runs of one name within a second get -2, -3, ...
        run_id = f"{stamp}-{slug}" if n == 1 else f"{stamp}-{slug}-{n}"
        out = root / run_id
        try:
            out.mkdir(exist_ok=False)
        except FileExistsError:
            continue
        return run_id, out
    raise FileExistsError(f"1,000 runs named {name!r} in {root} within one second")


# The run directories this process wrote whole, oldest first: an interrupted command says
# which report it kept, never another process's (evals may share a reports_dir).
WRITTEN_RUN_DIRS: list[Path] = []


@contextmanager
def new_run_dir(
    root: Path, name: str, committed: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, Path]]:
    """``run_dir``, removed again when an interrupt (Ctrl-C, SIGTERM) stops what writes into
    it, unless ``committed(run_id)`` says the run was already recorded (its history row
    written: a finished run, whatever came after). A report without its history row would
    pass for a finished run. An error leaves what was written, as its message says. A run
    directory kept is added to ``WRITTEN_RUN_DIRS``."""
    run_id, out = run_dir(root, name)
    try:
        yield run_id, out
    except Exception:
        raise
    except BaseException:  # KeyboardInterrupt, or Prefect's TerminationSignal
        if committed is not None and committed(run_id):  # never raises
            WRITTEN_RUN_DIRS.append(out)
        else:
            shutil.rmtree(out, ignore_errors=True)
        raise
    WRITTEN_RUN_DIRS.append(out)


def in_history(root: Path, run_id: str) -> bool:
    """Whether the history in ``root`` has rows of ``run_id`` (a run's commit marker); False
    when it cannot be read. Reads the run_id column only: this runs on an interrupt."""
    for name in (HISTORY, FLAGGED_HISTORY):
        try:
            ids = pq.read_table(root / name, columns=["run_id"])["run_id"]
        except (OSError, pa.ArrowException):  # absent, or unreadable: not recorded there
            continue
        if pc.any(pc.equal(ids, run_id)).as_py():
            return True
    return False


def write_run(summary: RunSummary, table: pa.Table, root: Path) -> RunSummary:
    """The one report writer (retrieval, compare and RAG runs): a new run directory under
    ``root`` with its four files, then the history rows; an interrupt takes them back.
    Returns ``summary`` with its ``run_id`` and ``report_dir``."""
    with new_run_dir(root, summary.name, lambda run_id: in_history(root, run_id)) as (
        run_id,
        out,
    ):
        summary.run_id, summary.report_dir = run_id, str(out)
        write_table(out / "per_query.parquet", table)
        atomic_write_bytes(out / "summary.json", json.dumps(summary.as_json(), indent=2).encode())
        md = render_markdown(summary)
        atomic_write_bytes(out / "report.md", md.encode())
        atomic_write_bytes(out / "report.html", render_html(summary, md, table).encode())
        append_history(root, summary)
    return summary


def run_retrieval(
    config: RagpipeConfig,
    variants: Sequence[Variant] | None = None,
    *,
    name: str | None = None,
    gate: Gate | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[EvalResult, RunSummary]:
    """Replay ``config.eval.golden`` through the retriever (each variant) and write the
    report under ``config.eval.reports_dir``."""
    with Retriever(config) as retriever:
        view = IndexView(retriever.store)
        golden, check = checked_golden(config, view, config.eval.granularity)
        corpus = corpus_fingerprint(retriever)
        result = run_retrieval_eval(
            config,
            golden,
            variants,
            name=name,
            granularity=Granularity(config.eval.granularity),
            depth=config.eval.depth,
            resamples=config.eval.resamples,
            seed=config.eval.seed,
            gate=gate,
            retriever=retriever,
            progress=progress,
        )
    summary = with_drafts(with_check(retrieval_summary(result, config, corpus), check), golden)
    summary = with_drift(summary, golden, view, config.eval.reports_dir)
    return result, write_run(summary, retrieval_table(result), config.eval.reports_dir)


def run_rag(
    config: RagpipeConfig, *, name: str | None = None, progress: Callable[[int], None] | None = None
) -> tuple[RagEvalResult, RunSummary]:
    """Retrieve, generate and judge ``config.eval.golden`` and write the report."""
    with Retriever(config) as retriever:
        view = IndexView(retriever.store)
        golden, check = checked_golden(config, view, "answer")
        corpus = corpus_fingerprint(retriever)
        result = run_rag_eval(
            config, golden, name=name, limit=config.eval.rag_limit,
            sample=config.eval.rag_sample, retriever=retriever, view=view, progress=progress,
        )  # fmt: skip
    summary = with_drafts(with_check(rag_summary(result, config, corpus), check), golden)
    summary = with_drift(summary, golden, view, config.eval.reports_dir)
    return result, write_run(summary, rag_table(result), config.eval.reports_dir)


def checked_golden(
    config: RagpipeConfig, view: IndexView, scope: str
) -> tuple[GoldenSet, GoldenCheck]:
    """``config.eval.golden``, loaded and checked against the index before any query runs
    (``ragpipe.evaluation.check``; ``scope``: the granularity scored, or ``answer``);
    items with unmatched targets are dropped only with ``eval.skip_unmatched``."""
    golden = load_golden_from(config)
    return golden_for_index(
        golden,
        view,
        skip_unmatched=config.eval.skip_unmatched,
        origin=config.origin("eval.golden"),
        scope=scope,
    )


def load_golden_from(config: RagpipeConfig, reviewing: bool = False) -> GoldenSet:
    """``config.eval.golden``, loaded; a missing file names where its path came from. Draft
    items are refused unless ``eval.allow_draft`` (or ``reviewing``: ``eval check``)."""
    path = config.eval.golden
    if not path.is_file():
        raise ConfigError(
            f"golden set {path} not found (from {config.origin('eval.golden')}): pass --golden "
            "(eval.golden) with your golden set; its format: docs/reference/golden-format.md"
        )
    golden = load_golden(path)
    if not reviewing:
        golden.refuse_drafts(config.eval.allow_draft)
    return golden


def with_check(summary: RunSummary, check: GoldenCheck) -> RunSummary:
    """The summary with the golden check's outcome, and warnings naming skipped items and
    the check's own (items asking one question)."""
    summary.golden_check = check.as_dict()
    summary.warnings += [f"golden set: {w}" for w in check.warnings]
    if check.skipped:
        # The scope too (history, trends, lists of runs): "all 70 items" of a 75-item set is
        # not the whole set, and two runs that skipped different items are not one series.
        ids = hashlib.sha256("\n".join(sorted(check.skipped)).encode()).hexdigest()[:6]
        selection = summary.golden.selection or f"{summary.golden.queries} items"
        summary.golden.selection = (
            f"{selection} ({len(check.skipped)} of {check.items} skipped: unmatched targets, "
            f"ids #{ids})"
        )
        shown = ", ".join(check.skipped[:10]) + (", ..." if len(check.skipped) > 10 else "")
        summary.warnings.insert(
            0,
            f"{len(check.skipped)} of {check.items} golden items skipped (--skip-unmatched): "
            f"their targets cannot be scored on the index ({shown}); see golden_check in "
            "summary.json",
        )
    return summary


def with_drafts(summary: RunSummary, golden: GoldenSet) -> RunSummary:
    """The summary saying which scored items are unreviewed drafts (``--allow-draft``): in
    its warnings and in the golden set's selection (so in the trend's scope). Only a log
    line said so: the report, summary.json and the history read as a reviewed set's."""
    scored = summary.golden.items
    items = [i for i in golden.drafts if not scored or i.id in scored]
    if not items:
        return summary
    drafts = [i.id for i in items]
    selection = summary.golden.selection or f"{summary.golden.queries} items"
    summary.golden.selection = f"{selection} ({len(drafts)} unreviewed drafts)"
    shown = ", ".join(drafts[:10]) + (", ..." if len(drafts) > 10 else "")
    # Said by how each was made: a heading item's question is its section's heading, also
    # the first line of the chunk it targets (scores near 1.000), and no model wrote it.
    made = [i.drafted_by for i in items]
    how = [
        said.format(n=made.count(method))
        for method, said in (
            ("heading", "{n} drafted from question headings: each asks its section's "
                        "heading, the first line of the chunk it targets, so they test lexical "
                        "matching only (expect scores near 1)"),
            ("llm", "{n} written by a model (question and targets)"),
            (None, "{n} with no provenance (marked draft by hand)"),
        )
        if made.count(method)
    ]  # fmt: skip
    summary.warnings.insert(
        0,
        f"{len(drafts)} of the {summary.golden.queries} scored golden items are unreviewed "
        f"drafts (draft: true, scored as --allow-draft asks): {shown}. No person has read "
        f"them yet: {'; '.join(how)}",
    )
    return summary


def _warn_edited(summary: RunSummary, root: Path, run_id: str) -> None:
    """A warning naming the items of the golden set that were edited, added or removed
    since ``run_id``, the last run of a set of that name: its numbers are not comparable
    with that run's (the trend starts a new line; ``scope``)."""
    try:
        data = json.loads((root / run_id / "summary.json").read_text(encoding="utf-8"))
        before = dict((data.get("golden") or {}).get("items") or {})
    except (OSError, ValueError, TypeError):
        return  # a run folder removed by hand, or from before digests were recorded
    now = summary.golden.items
    if not before or not now or before == now:
        return
    edited = {i for i in now.keys() & before.keys() if now[i] != before[i]}
    # Items in or out are a change of the set only when both runs scored all of it (a
    # --limit or --sample run scores some, --skip-unmatched leaves some out: no edit).
    selections = (summary.golden.selection, (data.get("golden") or {}).get("selection", ""))
    whole = all(  # unreviewed drafts are scored items too (with_drafts)
        re.fullmatch(r"all \d+ items(?: \(\d+ unreviewed drafts\))?", str(selection))
        for selection in selections
    )
    changes = [
        (what, sorted(ids))
        for what, ids in (
            ("edited", edited),
            ("added", now.keys() - before.keys() if whole else set()),
            ("removed", before.keys() - now.keys() if whole else set()),
        )
        if ids
    ]
    if not changes:
        return
    said = "; ".join(
        f"{what} {', '.join(ids[:10])}{', ...' if len(ids) > 10 else ''}" for what, ids in changes
    )
    summary.warnings.append(
        f"the questions of {summary.golden.name!r} changed since its last run ({run_id}): "
        f"{said}. Its numbers are not comparable with that run's: the trend starts a new line"
    )


def with_drift(summary: RunSummary, golden: GoldenSet, view: IndexView, root: Path) -> RunSummary:
    """The summary with each item's evidence, and the items whose evidence changed since
    the last run of the same golden set in ``root`` (a metric that moves there may be a
    stale label rather than retrieval)."""
    summary.evidence = evidence(golden, view)
    try:
        history = read_history(root)
    except ConfigError as exc:  # the run goes on; its history is mended when it is recorded
        logger.warning("no drift check: %s", exc)
        history = []
    runs = sorted({(r["finished_at"], r["run_id"]) for r in history
                   if r["golden"] == golden.name}, reverse=True)  # fmt: skip
    if runs:
        _warn_edited(summary, root, runs[0][1])
    here = _store_identity(summary.config)
    for _, run_id in runs[:DRIFT_LOOKBACK]:  # the last run of this set on this index
        try:
            data = json.loads((root / run_id / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a run folder removed by hand
        if _store_identity(data.get("config") or {}) == here:
            break
    else:
        return summary
    last = {"run_id": run_id}
    if not data.get("evidence"):
        return summary  # a run from before evidence was recorded
    version = ((data.get("corpus") or {}).get("index_version") or {}).get("generation") or ""
    changes = evidence_changes(data["evidence"], summary.evidence)
    summary.evidence_since = {"run_id": last["run_id"], "index_version": version}
    since = f"index version {version[:12]}" if version else f"run {last['run_id']}"
    summary.evidence_changed = {
        item: f"evidence changed since {since}: {what}" for item, what in changes.items()
    }
    if changes:
        shown = ", ".join(sorted(changes)[:10]) + (", ..." if len(changes) > 10 else "")
        summary.warnings.append(
            f"{len(changes)} golden item(s) target files that changed since the last run of "
            f"this set ({last['run_id']}, {since}): {shown}. A metric that moves on them may "
            "be a stale label, not retrieval; see 'Evidence changed' below"
        )
    return summary


DRIFT_LOOKBACK = 50  # runs of the same golden set looked at for one on the same index


def _store_identity(config: dict[str, Any]) -> tuple[Any, ...]:
    """Which index a run's (dumped) configuration read."""
    store = config.get("store") or {}
    return (store.get("backend"), store.get("path"), store.get("url"), store.get("collection"))


# What makes a judge's verdicts: runs that differ in any share no trend line of its metrics.
JUDGE_SETTINGS = ("temperature", "ragas", "metric_classes", "faithfulness_verdicts",
                  "prompts", "context_verdicts", "answer_relevancy_questions", "embedder",
                  "max_tokens")  # fmt: skip


def scope(summary: RunSummary) -> str:
    """Which items a run scored and how deep it looked: mrr and map count a hit down to
    the depth, and a sample or the first N items are not the whole set."""
    g = summary.golden
    depth = "top_k" if summary.kind == "rag" else "depth"
    questions = f", questions {g.digest}" if g.digest else ""  # an edited set: a new line
    return f"{g.selection or f'{g.queries} items'}, {depth} {summary.depth}{questions}"


# The answer metrics whose rules changed on 2026-12-03 (citation recall counts targets; a
# refusal, a hedge and an empty answer score 0 in correctness; an empty answer's refusal
# metric fails; a loop is a run that repeats itself, not a table or list of one shape):
# a run scored by the rules before is no point of their trend line.
ANSWER_RULES = "2026-12-03"
RULED = ("answer_f1", "answer_rouge_l", "answer_cosine", "citation_recall", "false_refusal",
         "correct_refusal", "degenerate")  # fmt: skip


def judge_identity(summary: RunSummary, metric: str) -> str:
    """The judge behind a judged metric of a RAG run: its model and a hash of the settings
    that make its verdicts (JUDGE_SETTINGS: prompts, ways of asking, ragas, the embedder of
    answer relevancy, ...); "" for any other metric. Faithfulness by one judge and by
    another are two instruments, not a trend."""
    if summary.kind != "rag" or not summary.judge:
        return ""
    rules = f"answer rules {ANSWER_RULES}"  # scored otherwise before: another line
    if metric == "answer_cosine":  # measured by the embedder: another one, another scale
        return f"embedder {summary.judge.get('embedder')}, {rules}"
    if metric not in RAG_METRICS:
        return rules if metric in RULED else ""
    settings = {k: summary.judge.get(k) for k in JUDGE_SETTINGS}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
    return f"{summary.judge.get('model')} (settings {digest})"


def generator_identity(summary: RunSummary) -> str:
    """The generator behind a RAG run's metrics: its model and a hash of the settings that
    make its answers (``rag.generator_settings``: provider, temperature, seed, token
    limit, window, context budget, citation grammar, relevance floor, loop stop); "" for
    other runs. Every metric of a RAG run rests on its answers or on the sources cut to
    its budget: a big model's answer F1 and a tiny one's were one trend line, a drop read
    as a regression. A summary from before the settings were recorded names the model
    alone."""
    models = getattr(summary, "models", None) or {}
    if summary.kind != "rag" or not models.get("generator"):
        return ""
    settings = {k: v for k, v in (models.get("generator_settings") or {}).items()
                if k != "model"}  # fmt: skip
    if not settings:
        return str(models["generator"])
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
    return f"{models['generator']} (settings {digest})"


def _history_flag(ci: Stats) -> str | None:
    if ci.get("withheld"):
        return WITHHELD + str(ci.get("flag") or "not shown as a value")
    return ci.get("flag") or None


def _variant_settings(summary: RunSummary, variant: str) -> str:
    """A compare's variant is a name typed on the command line: ``x:mode=dense`` one night
    and ``x:mode=sparse`` the next were one trend line. Its effective settings, hashed,
    are part of its scope ("" for other runs: a retrieval run's line follows its config)."""
    if summary.kind != "compare" or variant not in summary.variants:
        return ""
    settings = json.dumps(summary.variants[variant], sort_keys=True, default=str)
    return f", settings {hashlib.sha256(settings.encode()).hexdigest()[:8]}"


def append_history(root: Path, summary: RunSummary) -> None:
    """One row per (variant, metric) with a mean in history.parquet: the trend ``ragpipe
    report`` shows; the flagged and withheld ones (``flag``) in history-flagged.parquet,
    for the lists of runs."""
    rows = [
        {
            "run_id": summary.run_id,
            "finished_at": summary.finished_at,
            "name": summary.name,
            "golden": summary.golden.name,
            "granularity": summary.granularity,
            "variant": variant,
            "kind": summary.kind,
            "queries": summary.golden.queries,
            "scope": scope(summary) + _variant_settings(summary, variant),
            "judge": judge_identity(summary, metric),
            "generator": generator_identity(summary),
            "metric": metric,
            "mean": None if ci.get("withheld") else ci["mean"],
            "ci_low": None if ci.get("withheld") else ci["ci_low"],
            "ci_high": None if ci.get("withheld") else ci["ci_high"],
            "n": ci["n"],
            "n_failed": ci.get("n_failed"),
            "n_not_applicable": ci.get("n_not_applicable"),
            "git_revision": summary.git_revision or "",
            # A withheld or flagged number (an uncalibrated judge's) is no trend point.
            "flag": _history_flag(ci),
        }
        for variant, by_metric in summary.metrics.items()
        for metric, ci in by_metric.items()
        if ci["n"] or ci.get("flag") or ci.get("withheld")
    ]
    # Read, add, replace: two runs finishing together (a nightly's retrieval and RAG evals
    # on one reports_dir) would each write the file without the other's rows. An OS lock
    # (released when its process ends, even killed) makes them take turns. Either file
    # marks the run recorded (in_history); a kill or an error between the two (Ctrl-C and
    # SIGTERM wait) loses a flagged metric's cell in the lists of runs, never a trend point.
    with open(root / HISTORY_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with signals_deferred():  # Ctrl-C and SIGTERM: both files or neither
            _append_both(root, rows)


def _append_both(root: Path, rows: list[dict[str, Any]]) -> None:
    for name, mine in ((HISTORY, [r for r in rows if not r["flag"]]),
                       (FLAGGED_HISTORY, [r for r in rows if r["flag"]])):  # fmt: skip
        path = root / name
        if not mine and (name == FLAGGED_HISTORY or path.is_file()):
            continue
        new = pa.Table.from_pylist(mine, schema=HISTORY_SCHEMA)
        if path.is_file():
            try:
                new = pa.concat_tables([_history_table(path), new])
            except ConfigError as exc:  # kept aside, not lost, and the run still recorded
                aside = path.with_name(f"{path.name}.damaged-{datetime.now(UTC):%Y%m%dT%H%M%SZ}")
                os.replace(path, aside)
                logger.warning("%s; moved to %s, a new history starts with this run", exc, aside)
        write_table(path, new)


def _history_table(path: Path) -> pa.Table:
    """history.parquet in today's schema (files from before the ``kind`` column get it from
    their granularity: ``answer`` is a RAG run)."""
    try:
        return _read_history_table(path)
    except PermissionError:  # a file it may not read is not a damaged one: not moved aside
        raise
    except (OSError, pa.ArrowException, KeyError) as exc:  # corrupt pages are plain OSErrors
        raise ConfigError(
            f"{path} is not a ragpipe history file ({type(exc).__name__}: {exc}); move it "
            "away (the next evaluation run starts a new one) or restore it from a backup"
        ) from exc


def _read_history_table(path: Path) -> pa.Table:
    table = pq.read_table(path)
    if "kind" not in table.column_names:
        kinds = ["rag" if g == "answer" else "retrieval" for g in table["granularity"].to_pylist()]
        table = table.append_column("kind", pa.array(kinds, pa.string()))
    for name, kind in (("queries", pa.int64()), ("scope", pa.string()), ("judge", pa.string()),
                       ("generator", pa.string()), ("flag", pa.string()),
                       ("n_failed", pa.int64()), ("n_not_applicable", pa.int64())):  # fmt: skip
        if name not in table.column_names:  # files from before the column
            table = table.append_column(name, pa.nulls(table.num_rows, kind))
    table = table.select(HISTORY_SCHEMA.names).cast(HISTORY_SCHEMA)
    # Rows written before n < 2 (or all values equal) meant "no CI" hold a zero-width
    # interval: drop it.
    width = pc.subtract(table["ci_high"], table["ci_low"])
    flat = pc.fill_null(pc.less_equal(width, SAME), False)
    one = pc.or_(pc.less(table["n"], 2), flat)
    for name in ("ci_low", "ci_high"):
        column = pc.if_else(one, pa.scalar(None, pa.float64()), table[name])
        table = table.set_column(table.schema.get_field_index(name), name, column)
    return table


def read_history(root: Path, *, flagged: bool = False) -> list[dict[str, Any]]:
    """history.parquet's rows, oldest first: the values only (trend points), or with
    ``flagged`` also the flagged and withheld metrics (``flag`` set; a withheld one has no
    mean), for a list of runs that shows each with its flag."""
    rows = []
    for name in (HISTORY, FLAGGED_HISTORY) if flagged else (HISTORY,):
        path = root / name
        if path.is_file():
            rows += [r for r in _history_table(path).to_pylist() if flagged or not r["flag"]]
    # The runs in the order they finished, each run's rows together (a stable sort).
    return sorted(rows, key=lambda r: str(r["finished_at"])) if flagged else rows
