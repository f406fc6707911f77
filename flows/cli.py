"""The ``ragpipe`` command line.

Commands parse arguments, build the one configuration, and run the same
flows a deployment runs. Exit codes: 0 all good, 1 some documents failed,
2 bad configuration or a stage that cannot run, 3 deletions held by the
mass-deletion guard (additions were applied).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ragpipe.config import (
    DEFAULT_CONFIG_FILE,
    ChunkerKind,
    EmbedProvider,
    LLMProvider,
    PdfMode,
    RagpipeConfig,
    RetrievalMode,
    StoreBackend,
    load_config,
    with_sources,
)
from ragpipe.errors import ConfigError, GateFailed, MassDeletionHeld, RagpipeError
from ragpipe.progress import set_reporter

app = typer.Typer(
    help="ragpipe: keep a retrieval index fresh and measure RAG quality honestly.",
    no_args_is_help=True,
    rich_markup_mode="markdown",  # docstring paragraphs re-flow to the terminal width
    add_completion=False,
)
console = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"ragpipe {version('ragpipe')}")
        except PackageNotFoundError:
            print("ragpipe (not installed as a package)")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """ragpipe: keep a retrieval index fresh and measure RAG quality honestly."""


def _prefect_env(verbose: bool) -> None:
    # Embedded default: Prefect in ephemeral mode, quiet, no telemetry.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "ragpipe")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    if not verbose:  # before Prefect is imported: its settings are read once
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from flows.ephemeral import guard_ephemeral_server
    from flows.logs import set_library_level

    guard_ephemeral_server()  # a killed run must not leave Prefect's server behind
    set_library_level(logging.INFO if verbose else logging.WARNING)
    if not verbose:
        for name in _PREFECT_RUN_LOGGERS:
            logging.getLogger(name).addFilter(_HIDE_EXPECTED)


def _fail(exc: BaseException, code: int, label: str = "error") -> NoReturn:
    """Print an expected error as one line (never wrapped, never read as markup); exit."""
    console.print(f"[red]{label}:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code) from exc


def _error_names(cls: type[BaseException] = RagpipeError) -> set[str]:
    return {cls.__name__}.union(*(_error_names(sub) for sub in cls.__subclasses__()))


class _HideExpectedErrors(logging.Filter):
    """Drop Prefect's tracebacks of ragpipe's own errors (bad config, a held store, a full
    disk, ...): the CLI prints the one line that matters. Unexpected errors keep theirs;
    ``--verbose`` keeps everything."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, RagpipeError):
            return False
        if record.levelno < logging.ERROR:
            return True
        message = record.getMessage()
        return not any(f"exception {n}:" in message or f"{n}(" in message for n in _error_names())


_HIDE_EXPECTED = _HideExpectedErrors()
# Where Prefect logs a failed task or flow run (with the traceback).
_PREFECT_RUN_LOGGERS = ("prefect.task_runs", "prefect.flow_runs", "prefect.task_engine",
                        "prefect.flow_engine")  # fmt: skip


class _RichReporter:
    """Shows one progress bar per stage."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: Any = None

    def start(self, stage: str, total: int) -> None:
        # total 0: not known up front (e.g. tune's search), shown as a running count.
        self.task = self.progress.add_task(stage, total=total or None)

    def advance(self, n: int = 1) -> None:
        if self.task is not None:
            self.progress.advance(self.task, n)

    def finish(self) -> None:
        self.task = None


@app.command()
def ingest(
    sources: Annotated[
        list[str] | None,
        typer.Argument(
            help="Files, directories or http(s) URLs to ingest; they replace discover.roots, "
            "discover.urls and discover.sitemaps from config.",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", "-c", help="YAML config file (default: ./ragpipe.yaml if present)."
        ),
    ] = None,
    work_dir: Annotated[
        Path | None,
        typer.Option(help="Where checkpoints go (paths.work_dir; default data/work)."),
    ] = None,
    pdf_mode: Annotated[
        PdfMode | None,
        typer.Option(help="PDF conversion: fast (no models), accurate (Docling models), auto."),
    ] = None,
    chunker: Annotated[
        ChunkerKind | None, typer.Option(help="Chunker: recursive or sentence-window.")
    ] = None,
    embedder: Annotated[
        EmbedProvider | None,
        typer.Option(help="Embedder: local (MiniLM, default), onnx (faster, weaker), ollama."),
    ] = None,
    store: Annotated[
        StoreBackend | None,
        typer.Option(help="Vector store: edge (Qdrant Edge, default) or qdrant (qdrant-client)."),
    ] = None,
    store_path: Annotated[
        Path | None,
        typer.Option(help="store.path: the Edge shard / qdrant local-mode directory."),
    ] = None,
    allow_mass_delete: Annotated[
        bool,
        typer.Option(
            "--allow-mass-delete",
            help="Delete vanished files even when they exceed index.max_delete_share "
            "(default 20%) of the index.",
        ),
    ] = False,
    dask_workers: Annotated[
        int,
        typer.Option(
            help="Fan conversion and embedding out over a local Dask cluster of this many "
            "worker processes (prefect-dask); 0 runs them in this process.",
        ),
    ] = 0,
    batch_size: Annotated[
        int, typer.Option(help="Files per conversion batch when fanning out.")
    ] = 4,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show Prefect and stage logs.")
    ] = False,
) -> None:
    """Index documents and web pages: discover/fetch, convert, clean, chunk, embed, upsert.

    Web pages (http/https URLs here, or discover.urls / discover.sitemaps) are
    fetched with the fetch settings, obeying robots.txt; re-runs ask the server
    conditionally (ETag / Last-Modified).

    Re-runs are incremental: unchanged files cost only hashing; changed files
    are re-indexed (new version written before the old one is deleted); files
    gone from every root are deleted, unless that is more than
    index.max_delete_share of the index (exit code 3, deletions held).
    Failures are listed at the end and kept in WORK_DIR/failures.parquet; the
    exit code is 1 when any document failed.
    """
    _prefect_env(verbose)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s")
    overrides: dict[str, Any] = {}
    if work_dir is not None:
        overrides["paths"] = {"work_dir": str(work_dir)}
    if pdf_mode is not None:
        overrides["convert"] = {"pdf_mode": pdf_mode.value}
    if chunker is not None:
        overrides["chunk"] = {"chunker": chunker.value}
    if embedder is not None:
        overrides["embed"] = {"provider": embedder.value}
    if store is not None or store_path is not None:
        overrides["store"] = {
            **({"backend": store.value} if store is not None else {}),
            **({"path": str(store_path)} if store_path is not None else {}),
        }
    try:
        cfg = with_sources(load_config(config, overrides), sources)
    except RagpipeError as exc:
        _fail(exc, 2)

    from flows.ingest import dask_ingest_flow, ingest_flow  # slow import: only when running

    flow = dask_ingest_flow(dask_workers) if dask_workers > 0 else ingest_flow

    columns = (
        TextColumn("{task.description:>9}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(
        *columns, console=console, transient=False, disable=not console.is_terminal
    ) as progress:
        previous = set_reporter(_RichReporter(progress))
        try:
            summary = flow(
                config=cfg,
                allow_mass_delete=allow_mass_delete,
                batch_size=batch_size if dask_workers > 0 else None,
            )
        except MassDeletionHeld as exc:
            _print_failures(cfg.paths.work_dir)
            _fail(exc, 3, "deletions held")
        except RagpipeError as exc:
            _fail(exc, 2)
        finally:
            set_reporter(previous)

    _print_failures(cfg.paths.work_dir)
    table = Table(title=f"ingest summary ({cfg.store.backend.value}: {cfg.store.path})")
    table.add_column("files")
    table.add_column("", justify="right")
    table.add_column("index")
    table.add_column("", justify="right")
    table.add_column("seconds per stage")
    table.add_column("", justify="right")
    left = [
        ("seen", summary.seen),
        ("added", summary.added),
        ("changed", summary.changed),
        ("unchanged", summary.skipped_unchanged),
        ("removed", summary.removed),
        ("failed", summary.failed),
        ("skipped", summary.skipped),
    ]
    middle = [
        ("chunks written", summary.chunks_written),
        ("chunks deleted", summary.chunks_deleted),
        ("points in store", summary.points_total),
    ]
    right = [(k, f"{v:.1f}") for k, v in summary.seconds.items()]
    for i in range(max(len(left), len(middle), len(right))):
        row: list[str] = []
        for column in (left, middle, right):
            row += [str(x) for x in column[i]] if i < len(column) else ["", ""]
        table.add_row(*row)
    Console().print(table)
    print(summary.line())
    if summary.skipped:
        from ragpipe.checkpoint import read_records
        from ragpipe.schemas import Skip

        skipped_path = cfg.paths.work_dir / "discover" / "skipped.parquet"
        reasons = Counter(s.reason for s in read_records(skipped_path, Skip))
        console.print(
            f"{summary.skipped} path(s) not ingested on purpose "
            f"({', '.join(f'{k}: {v}' for k, v in sorted(reasons.items()))}): see {skipped_path}",
            highlight=False,
            soft_wrap=True,  # never break a path a user will copy
        )
    if not summary.ok:
        raise typer.Exit(1)


def _print_failures(work_dir: Path) -> None:
    from ragpipe.stages import failures_path, read_failures

    failures = read_failures(work_dir)
    if not failures:
        return
    table = Table(title=f"failures ({failures_path(work_dir)})")
    for col in ("file", "stage", "category", "message"):
        table.add_column(col, overflow="fold")
    for f in failures:
        table.add_row(f.file_path, f.stage, f.category, f.message)
    Console().print(table)


class OutputFormat(StrEnum):
    TEXT = "text"
    JSON = "json"
    XML = "xml"


def _query_config(
    config: Path | None,
    store_path: Path | None,
    retrieve: dict[str, Any],
    filters: list[str] | None,
    embedder: EmbedProvider | None = None,
    llm: dict[str, Any] | None = None,
) -> RagpipeConfig:
    overrides: dict[str, Any] = {"retrieve": {k: v for k, v in retrieve.items() if v is not None}}
    for item in filters or []:
        key, sep, value = item.partition("=")
        field = {"file": "filter_file", "heading": "filter_heading", "sha": "filter_source_sha"}
        if not sep or key.strip() not in field:
            raise ConfigError(
                f"--filter {item!r}: use file=SUFFIX, heading=TEXT or sha=SOURCE_SHA256 "
                "(repeat --filter to combine them with AND)"
            )
        overrides["retrieve"][field[key.strip()]] = value.strip()
    if store_path is not None:
        overrides["store"] = {"path": str(store_path)}
    if embedder is not None:
        overrides["embed"] = {"provider": embedder.value}
    if llm:
        overrides["llm"] = {k: v for k, v in llm.items() if v is not None}
    return load_config(config, overrides)


ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: ./ragpipe.yaml if present)."),
]
StorePathOption = Annotated[
    Path | None, typer.Option(help="store.path: the index to query (default data/store).")
]
ModeOption = Annotated[
    RetrievalMode | None,
    typer.Option(help="dense, sparse (BM25) or hybrid (both, fused by RRF). Default: config."),
]
KOption = Annotated[int | None, typer.Option("--k", "-k", help="Chunks to return (top_k).")]
RerankOption = Annotated[
    bool | None,
    typer.Option(
        "--rerank/--no-rerank",
        help="Rerank with the cross-encoder in retrieve.reranker (must exist locally).",
    ),
]
FilterOption = Annotated[
    list[str] | None,
    typer.Option(
        "--filter",
        help="file=SUFFIX (path ends with), heading=TEXT, sha=SOURCE_SHA256; repeat to AND.",
    ),
]
EmbedderOption = Annotated[
    EmbedProvider | None,
    typer.Option(help="The embedder the index was built with (default: config)."),
]


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="The question or keywords.")],
    mode: ModeOption = None,
    k: KOption = None,
    rerank: RerankOption = None,
    filters: FilterOption = None,
    output: Annotated[
        OutputFormat,
        typer.Option(
            "--format",
            help="text (readable), json (with every stage's scores), xml "
            "(a <retrieved_context> block for prompts).",
        ),
    ] = OutputFormat.TEXT,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    embedder: EmbedderOption = None,
) -> None:
    """Print the chunks the index returns for QUERY, ranked, with file, page, heading, scores."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from ragpipe.retrieve import Retriever, to_json, to_text, to_xml

    try:
        cfg = _query_config(
            config, store_path, {"mode": mode, "top_k": k, "rerank": rerank}, filters, embedder
        )
        with Retriever(cfg) as retriever:
            result = retriever.search(query)
    except RagpipeError as exc:
        _fail(exc, 2)
    render = {OutputFormat.TEXT: to_text, OutputFormat.JSON: to_json, OutputFormat.XML: to_xml}
    print(render[output](result))


@app.command()
def ask(
    question: Annotated[str, typer.Argument(help="The question to answer from the index.")],
    mode: ModeOption = None,
    k: KOption = None,
    rerank: RerankOption = None,
    filters: FilterOption = None,
    llm: Annotated[
        LLMProvider | None,
        typer.Option(help="llamacpp (in-process GGUF, default) or ollama."),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="llm.model: a .gguf path, or an Ollama model name.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the answer object as JSON (no streaming).")
    ] = False,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    embedder: EmbedderOption = None,
) -> None:
    """Answer QUESTION from the index, streaming a cited answer, then list the sources.

    The model is told to cite sources as [1], [2] and to answer exactly "Not found in the
    provided documents." when they do not support an answer. Citations that point at no
    source are reported.
    """
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from ragpipe.generate import answer
    from ragpipe.retrieve import Retriever, terminal_safe

    try:
        cfg = _query_config(
            config,
            store_path,
            {"mode": mode, "top_k": k, "rerank": rerank},
            filters,
            embedder,
            {"provider": llm.value if llm else None, "model": model},
        )
        with Retriever(cfg) as retriever:
            result = retriever.search(question)
            stream = None if as_json else (lambda s: print(terminal_safe(s), end="", flush=True))
            reply = answer(
                question, result.hits, retriever.llm, cfg.generate.context_tokens, stream
            )
    except RagpipeError as exc:
        _fail(exc, 2)
    if as_json:
        print(json.dumps({**reply.as_dict(), "retrieval": result.trace}, indent=2))
        return
    if not result.hits:
        print(terminal_safe(reply.text), end="")
    print("\n")
    shown = reply.cited or ([] if reply.not_found else reply.sources)
    title = "cited sources" if reply.cited else "sources given to the model (none cited)"
    if shown:
        print(title + ":")
        for s in shown:
            where = s.file_path + (f" p.{s.page}" if s.page is not None else "")
            line = f"  [{s.number}] {where}" + (f" — {s.heading}" if s.heading else "")
            print(terminal_safe(line))
    if reply.invalid_citations:
        console.print(
            f"[yellow]warning:[/yellow] the answer cites {reply.invalid_citations}, which are "
            f"not among the {len(reply.sources)} sources",
            highlight=False,
        )
    console.print(
        f"{reply.model}: {reply.tokens_in} tokens in, {reply.tokens_out} out, {reply.seconds:.1f}s",
        highlight=False,
    )


eval_app = typer.Typer(
    help="Evaluate retrieval on a golden set: metrics with bootstrap 95% CIs, reports.",
    no_args_is_help=True,
)
app.add_typer(eval_app, name="eval")

GoldenOption = Annotated[
    Path | None,
    typer.Option(help="Golden set YAML (eval.golden; default eval/golden/r-faq-dev.yaml)."),
]
GranularityOption = Annotated[
    str | None,
    typer.Option(help="chunk (the golden set's chunk targets) or file (de-duplicated by file)."),
]
NameOption = Annotated[
    str | None, typer.Option(help="Run name (report directory suffix; default: the set's name).")
]
ReportsOption = Annotated[
    Path | None, typer.Option(help="eval.reports_dir (default eval/reports).")
]


def _eval_config(
    config: Path | None,
    store_path: Path | None,
    embedder: EmbedderOption,
    retrieve: dict[str, Any],
    evaluation: dict[str, Any],
) -> RagpipeConfig:
    overrides: dict[str, Any] = {
        "retrieve": {k: v for k, v in retrieve.items() if v is not None},
        "eval": {k: str(v) if isinstance(v, Path) else v
                 for k, v in evaluation.items() if v is not None},
    }  # fmt: skip
    if store_path is not None:
        overrides["store"] = {"path": str(store_path)}
    if embedder is not None:
        overrides["embed"] = {"provider": embedder.value}
    return load_config(config, overrides)


def _print_eval(summary: dict[str, Any]) -> None:
    names = summary.get("metric_names") or []

    table = Table(title=f"{summary['name']}: {summary['golden']['queries']} queries, "
                  f"{summary['granularity']} level, mean [95% CI]")  # fmt: skip
    table.add_column("metric")
    variants = list(summary["metrics"])
    for v in variants:
        table.add_column(v, justify="right")
    for m in names:
        row = [m]
        for v in variants:
            ci = summary["metrics"][v][m]
            cell = (
                f"{ci['mean']:.3f} [{ci['ci_low']:.3f}, {ci['ci_high']:.3f}]" if ci["n"] else "n/a"
            )
            if v in summary["deltas"]:
                d = summary["deltas"][v][m]
                cell += f"  Δ {d['mean']:+.3f} p={d['p_value']:.2f}"
            row.append(cell)
        table.add_row(*row)
    Console().print(table)
    for warning in summary["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    out = Path(summary["report_dir"])
    print(f"report: {out / 'report.html'} (also report.md, summary.json, per_query.parquet)")


@eval_app.command("retrieval")
def eval_retrieval(
    golden: GoldenOption = None,
    mode: ModeOption = None,
    rerank: RerankOption = None,
    granularity: GranularityOption = None,
    depth: Annotated[int | None, typer.Option(help="Results per query (default 10).")] = None,
    name: NameOption = None,
    reports_dir: ReportsOption = None,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    embedder: EmbedderOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Replay the golden set through the retrieval stack and write a report.

    Metrics per query (Recall@5/10, Precision@5, MRR, Success@5, Hit@3, MAP, NDCG@10 linear
    and exponential gain), means with bootstrap 95% CIs, a history row per run.
    """
    _prefect_env(verbose)
    try:
        cfg = _eval_config(
            config,
            store_path,
            embedder,
            {"mode": mode, "rerank": rerank},
            {"golden": golden, "granularity": granularity, "depth": depth,
             "reports_dir": reports_dir},
        )  # fmt: skip
        from flows.eval import evaluate_retrieval

        summary = evaluate_retrieval(cfg, name=name)
    except RagpipeError as exc:
        _fail(exc, 2)
    _print_eval(summary)


@eval_app.command("rag")
def eval_rag(
    golden: GoldenOption = None,
    limit: Annotated[
        int | None, typer.Option(help="Judge only the first N questions (eval.rag_limit).")
    ] = None,
    llm: Annotated[
        LLMProvider | None, typer.Option(help="Generator: llamacpp (default) or ollama.")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Generator model: a .gguf path or an Ollama model name.")
    ] = None,
    judge_model: Annotated[
        str | None,
        typer.Option(help="Judge model (same provider as the generator); default: the generator."),
    ] = None,
    mode: ModeOption = None,
    k: KOption = None,
    name: NameOption = None,
    reports_dir: ReportsOption = None,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    embedder: EmbedderOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Answer the golden questions and judge the answers with RAGAS.

    Faithfulness, answer relevancy, context precision, context recall (only where the item
    has expected_answer), with bootstrap 95% CIs over the scored questions. A judge failure
    is recorded as null with its reason and counted, never scored 0. Slow on CPU: about 30 s
    per question with the packaged SmolLM2 (use --limit).
    """
    _prefect_env(verbose)
    try:
        cfg = _eval_config(
            config,
            store_path,
            embedder,
            {"mode": mode, "top_k": k},
            {"golden": golden, "rag_limit": limit, "reports_dir": reports_dir},
        )
        generator = {k: v for k, v in {"provider": llm.value if llm else None,
                                       "model": model}.items() if v is not None}  # fmt: skip
        llm_cfg = cfg.llm.model_copy(update=generator)
        judge_cfg = llm_cfg.model_copy(update={"model": judge_model}) if judge_model else None
        cfg = cfg.model_copy(
            update={"llm": llm_cfg, "eval": cfg.eval.model_copy(update={"judge": judge_cfg})}
        )
        from flows.eval import evaluate_rag

        summary = evaluate_rag(cfg, name=name)
    except RagpipeError as exc:
        _fail(exc, 2)
    _print_eval(summary)
    counts = summary["judge"]["counts"]
    outcomes = [f"{m} {c['ok']}/{c['failed']}/{c['not_applicable']}" for m, c in counts.items()]
    print("judge outcomes (scored / failed / not applicable): " + ", ".join(outcomes))


@eval_app.command("import-beir")
def import_beir_command(
    dataset: Annotated[
        Path, typer.Argument(help="A BEIR dataset directory (corpus.jsonl, queries.jsonl, qrels/).")
    ],
    corpus_out: Annotated[
        Path, typer.Option(help="Where to write the corpus as Markdown files (one per document).")
    ],
    golden_out: Annotated[Path, typer.Option(help="Where to write the golden set YAML.")],
    split: Annotated[str, typer.Option(help="qrels/<split>.tsv to use.")] = "test",
) -> None:
    """Turn a BEIR dataset into documents to ingest and a golden set (qrels as graded relevance).

    Then: `ragpipe ingest CORPUS_OUT` and `ragpipe eval retrieval --golden GOLDEN_OUT
    --granularity file`.
    """
    from ragpipe.golden import import_beir, save_golden

    try:
        golden = import_beir(dataset, corpus_out, split)
    except RagpipeError as exc:
        _fail(exc, 2)
    save_golden(golden, golden_out)
    files = sum(1 for _ in corpus_out.glob("*.md"))
    print(f"wrote {files} documents to {corpus_out} and {len(golden.items)} queries to "
          f"{golden_out}")  # fmt: skip


@eval_app.command("compare")
def eval_compare(
    variants: Annotated[
        list[str],
        typer.Option(
            "--variant",
            help="NAME:key=value,... of retrieve settings, e.g. dense:mode=dense or "
            "'rrf-w:fusion_method=rrf,dense_weight=2'. The first is the baseline.",
        ),
    ],
    golden: GoldenOption = None,
    granularity: GranularityOption = None,
    gate_metric: Annotated[
        str | None,
        typer.Option(help="Fail (exit 4) when this metric's (e.g. mrr, ndcg@10) delta CI ..."),
    ] = None,
    gate_threshold: Annotated[
        float, typer.Option(help="... lies entirely below this value (e.g. -0.02).")
    ] = 0.0,
    name: NameOption = None,
    reports_dir: ReportsOption = None,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    embedder: EmbedderOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Compare retrieval settings on the same queries: paired deltas, CIs, p-values."""
    _prefect_env(verbose)
    from ragpipe.evaluate import parse_variant
    from ragpipe.metrics import METRICS

    try:
        parsed = [parse_variant(v) for v in variants]
        if gate_metric is not None and gate_metric not in METRICS:
            raise ConfigError(f"--gate-metric {gate_metric!r} is not one of {', '.join(METRICS)}")
        if len(parsed) < 2:
            raise ConfigError("give at least two --variant options (the first is the baseline)")
        cfg = _eval_config(
            config,
            store_path,
            embedder,
            {},
            {"golden": golden, "granularity": granularity, "reports_dir": reports_dir},
        )
        from flows.eval import compare_retrieval
        from ragpipe.evaluate import Gate

        gate = Gate(gate_metric, gate_threshold) if gate_metric else None
        summary = compare_retrieval(cfg, parsed, name=name or "compare", gate=gate)
    except GateFailed as exc:
        _fail(exc, 4, "gate failed")
    except RagpipeError as exc:
        _fail(exc, 2)
    _print_eval(summary)


@eval_app.command("tune")
def eval_tune(
    golden: GoldenOption = None,
    granularity: GranularityOption = None,
    metric: Annotated[
        str, typer.Option(help="Metric to maximise and to judge the pick by, e.g. ndcg@10, mrr.")
    ] = "ndcg@10",
    share: Annotated[
        float, typer.Option(help="Share of the golden queries that tune; the rest only confirm.")
    ] = 0.5,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the split and the statistics (eval.seed).")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Also write the tuned config here when the verdict is 'recommend' "
            "(pass it back with --config)."
        ),
    ] = None,
    name: NameOption = None,
    reports_dir: ReportsOption = None,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
    embedder: EmbedderOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Tune the retrieve settings on your golden set, with an honest hold-out.

    The queries are split by a seeded shuffle: a coordinate search over mode, fusion
    method, alpha, rrf_k, leg weights, document weight, prefetch depth, fragments, the
    quoted-phrase boost and MMR picks the best settings on the tuning share only. Then
    the pick and the current settings are scored on the held-out queries (paired delta,
    bootstrap 95% CI, permutation p-value). Verdict: recommend (tuned.yaml written, with
    your config's other sections kept), refused (the pick is worse on the held-out
    queries: its delta CI lies entirely below zero), or no change. Exit 0 for every
    verdict; 2 for a bad configuration or golden set.
    """
    _prefect_env(verbose)
    try:
        cfg = _eval_config(
            config,
            store_path,
            embedder,
            {},
            {
                "golden": golden,
                "granularity": granularity,
                "reports_dir": reports_dir,
                "seed": seed,
            },
        )
        from flows.eval import tune_retrieval
        from ragpipe.golden import load_golden
        from ragpipe.metrics import METRICS
        from ragpipe.tune import split_queries

        # Checked here so that a mistake is one line, not a flow run's traceback.
        if metric not in METRICS:
            raise ConfigError(f"tune metric {metric!r} is not one of {', '.join(METRICS)}")
        split_queries(load_golden(cfg.eval.golden), cfg.eval.seed, share)
        base = config or (DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None)
        columns = (TextColumn("{task.description:>9}"), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(
            *columns, console=console, transient=True, disable=not console.is_terminal
        ) as progress:
            previous = set_reporter(_RichReporter(progress))
            try:
                summary = tune_retrieval(
                    cfg,
                    config_path=str(base) if base else None,
                    name=name,
                    metric=metric,
                    share=share,
                    write_config=str(out) if out else None,
                )
            finally:
                set_reporter(previous)
    except RagpipeError as exc:
        _fail(exc, 2)
    _print_tune(summary)


def _print_tune(summary: dict[str, Any]) -> None:
    split = summary["split"]
    tuning = summary["tuning"]
    print(
        f"split (seed {summary['seed']}): {len(split['tuning'])} tuning queries, "
        f"{len(split['confirmation'])} held-out; {len(tuning['trials'])} configurations "
        f"scored on the tuning queries ({summary['metric']}: current {tuning['current']:.4f}, "
        f"best {tuning['best']:.4f})"
    )
    print("changed settings: " + (json.dumps(summary["overrides"]) or "{}"))
    table = Table(title="held-out queries: tuned - current, mean [95% CI]")
    for column in ("metric", "current", "tuned", "delta", "p"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for m, d in summary["confirmation"].items():
        table.add_row(
            m,
            f"{d['current']:.4f}",
            f"{d['tuned']:.4f}",
            f"{d['mean']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]",
            f"{d['p_value']:.3g}",
        )
    Console().print(table)
    colour = {"recommend": "green", "refused": "red"}.get(summary["decision"], "yellow")
    console.print(f"[{colour}]{summary['message']}[/{colour}]", highlight=False, soft_wrap=True)
    if summary.get("tuned_config"):
        print(f"tuned config: {summary['tuned_config']} (use it with --config)")
    print(f"report: {Path(summary['report_dir']) / 'report.md'} (also tune.json)")


@app.command()
def report(
    last: Annotated[int, typer.Option(help="How many recent runs to show side by side.")] = 5,
    metric: Annotated[str, typer.Option(help="Metric whose trend to show.")] = "mrr",
    reports_dir: ReportsOption = None,
    config: ConfigOption = None,
) -> None:
    """Show the latest evaluation runs side by side and the trend of one metric."""
    from ragpipe.metrics import METRICS
    from ragpipe.report import read_history

    try:
        cfg = load_config(
            config, {"eval": {"reports_dir": str(reports_dir)}} if reports_dir else {}
        )
    except RagpipeError as exc:
        _fail(exc, 2)
    if metric not in METRICS:
        console.print(f"[red]error:[/red] --metric must be one of {', '.join(METRICS)}")
        raise typer.Exit(2)
    rows = read_history(cfg.eval.reports_dir)
    if not rows:
        print(f"no evaluation runs in {cfg.eval.reports_dir} yet: run `ragpipe eval retrieval`")
        return
    if last < 1:
        console.print("[red]error:[/red] --last must be at least 1")
        raise typer.Exit(2)
    _print_history(rows, last, metric)


def _print_history(rows: list[dict[str, Any]], last: int, metric: str) -> None:
    """The latest ``last`` runs (every variant of each) side by side, and one metric's trend."""
    from ragpipe.metrics import METRICS
    from ragpipe.rag_eval import RAG_METRICS

    runs = list(dict.fromkeys(r["run_id"] for r in rows))
    columns = list(dict.fromkeys((r["run_id"], r["variant"]) for r in rows))
    shown = [c for c in columns if c[0] in runs[-last:]]
    table = Table(title=f"latest {min(last, len(runs))} of {len(runs)} runs (mean [95% CI])")
    table.add_column("metric", no_wrap=True)
    for run_id, variant in shown:
        stamp, _, name = run_id.partition("-")
        # Headers wrap rather than being cut: run name, time, variant on their own lines.
        table.add_column(f"{name}\n{stamp}\n{variant}", justify="right", overflow="fold")
    by_key = {(r["run_id"], r["variant"], r["metric"]): r for r in rows}
    names = [m for m in (*METRICS, *RAG_METRICS) if any((*c, m) in by_key for c in shown)]
    for m in names:
        cells = []
        for run_id, variant in shown:
            got = by_key.get((run_id, variant, m))
            cells.append(
                f"{got['mean']:.3f} [{got['ci_low']:.3f}, {got['ci_high']:.3f}]" if got else ""
            )
        table.add_row(m, *cells)
    Console().print(table)
    trend = [by_key[(run_id, variant, metric)] for run_id, variant in columns
             if (run_id, variant, metric) in by_key]  # fmt: skip
    if not trend:
        print(f"no run has {metric}")
        return
    low, high = min(r["mean"] for r in trend), max(r["mean"] for r in trend)
    print(f"trend of {metric} (oldest first; bars span {low:.3f} to {high:.3f}, not 0 to 1):")
    wide = max(len(r["run_id"]) for r in trend), max(len(r["variant"]) for r in trend)
    for r in trend:
        share = (r["mean"] - low) / (high - low) if high > low else 1.0
        bar = "█" * (1 + round(39 * share))
        print(f"  {r['run_id']:<{wide[0]}s} {r['variant']:>{wide[1]}s} {r['mean']:.3f} {bar}")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
