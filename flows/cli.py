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
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ragpipe.config import (
    ChunkerKind,
    EmbedProvider,
    LLMProvider,
    PdfMode,
    RagpipeConfig,
    RetrievalMode,
    StoreBackend,
    load_config,
)
from ragpipe.errors import ConfigError, MassDeletionHeld, RagpipeError
from ragpipe.progress import set_reporter

app = typer.Typer(
    help="ragpipe: keep a retrieval index fresh and measure RAG quality honestly.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console(stderr=True)


@app.callback()
def _root() -> None:
    """ragpipe: keep a retrieval index fresh and measure RAG quality honestly."""


def _prefect_env(verbose: bool) -> None:
    # Embedded default: Prefect in ephemeral mode, quiet, no telemetry.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "ragpipe")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    if not verbose:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


class _RichReporter:
    """Shows one progress bar per stage."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: Any = None

    def start(self, stage: str, total: int) -> None:
        self.task = self.progress.add_task(stage, total=total)

    def advance(self, n: int = 1) -> None:
        if self.task is not None:
            self.progress.advance(self.task, n)

    def finish(self) -> None:
        self.task = None


@app.command()
def ingest(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(help="Files or directories to ingest; replace discover.roots from config."),
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
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show Prefect and stage logs.")
    ] = False,
) -> None:
    """Index documents: discover, convert, clean, chunk, embed, upsert into Qdrant.

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
        cfg = load_config(config, overrides)
    except RagpipeError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from exc

    from flows.ingest import ingest_flow  # Prefect import is slow: only when running

    columns = (
        TextColumn("{task.description:>9}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        previous = set_reporter(_RichReporter(progress))
        try:
            summary = ingest_flow(
                config=cfg,
                roots=[str(p) for p in paths] if paths else None,
                allow_mass_delete=allow_mass_delete,
            )
        except MassDeletionHeld as exc:
            _print_failures(cfg.paths.work_dir)
            console.print(f"[red]deletions held:[/red] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(3) from exc
        except RagpipeError as exc:
            console.print(f"[red]error:[/red] {exc}", highlight=False)
            raise typer.Exit(2) from exc
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
        console.print(
            f"{summary.skipped} path(s) not ingested on purpose (symlinks, unsupported types): "
            f"see {cfg.paths.work_dir / 'discover' / 'skipped.parquet'}",
            highlight=False,
            soft_wrap=True,  # never break a path a user will copy
        )
    if not summary.ok:
        raise typer.Exit(1)


def _print_failures(work_dir: Path) -> None:
    from ragpipe.checkpoint import read_records
    from ragpipe.schemas import Failure

    path = work_dir / "failures.parquet"
    failures = read_records(path, Failure) if path.is_file() else []
    if not failures:
        return
    table = Table(title=f"failures ({path})")
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
        console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from exc
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
    from ragpipe.retrieve import Retriever

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
            stream = None if as_json else (lambda s: print(s, end="", flush=True))
            reply = answer(
                question, result.hits, retriever.llm, cfg.generate.context_tokens, stream
            )
    except RagpipeError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from exc
    if as_json:
        print(json.dumps({**reply.as_dict(), "retrieval": result.trace}, indent=2))
        return
    if not result.hits:
        print(reply.text, end="")
    print("\n")
    shown = reply.cited or ([] if reply.not_found else reply.sources)
    title = "cited sources" if reply.cited else "sources given to the model (none cited)"
    if shown:
        print(title + ":")
        for s in shown:
            where = s.file_path + (f" p.{s.page}" if s.page is not None else "")
            print(f"  [{s.number}] {where}" + (f" — {s.heading}" if s.heading else ""))
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


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
