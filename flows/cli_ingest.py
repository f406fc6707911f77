"""`ragpipe ingest`: discover, convert, chunk, embed and upsert, incrementally."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from flows.cli_common import (
    RichReporter,
    console,
    fail,
    interruptible,
    prefect_env,
)
from ragpipe.config import (
    ChunkerKind,
    EmbedProvider,
    PdfMode,
    StoreBackend,
    load_config,
    with_sources,
)
from ragpipe.errors import IndexHeld, MassDeletionHeld, RagpipeError
from ragpipe.ingest.runner import WorkDir
from ragpipe.progress import set_reporter


def ingest(
    sources: Annotated[
        list[str] | None,
        typer.Argument(
            help="Files, directories, object-storage prefixes (s3://bucket/prefix, gs://…, "
            "az://…) or http(s) URLs to ingest; they replace discover.roots, "
            "discover.object_roots, discover.urls and discover.sitemaps from config.",
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
        typer.Option(
            help="Embedder: local (MiniLM, default), onnx (faster, weaker), ollama, openai."
        ),
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
            min=0,
        ),
    ] = 0,
    batch_size: Annotated[
        int, typer.Option(help="Files per conversion batch when fanning out.", min=1)
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
    index.max_delete_share of the index (exit code 3, deletions held). With
    index.gate a changed index goes live only when its golden sets and canaries
    say it is no worse than the live version (exit code 4 when it is held).
    Failures are listed at the end and kept in WORK_DIR/failures.parquet; the
    exit code is 1 when any document failed.
    """
    prefect_env(verbose)
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
        fail(exc, 2)

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
        previous = set_reporter(RichReporter(progress))
        with interruptible(
            "the ingest stopped; the writer slot and locks are released and the next run "
            "resumes from the checkpoints written so far"
        ):
            try:
                summary = flow(
                    config=cfg,
                    config_path=str(config) if config is not None else None,  # for the events
                    allow_mass_delete=allow_mass_delete,
                    batch_size=batch_size if dask_workers > 0 else None,
                )
            except MassDeletionHeld as exc:
                _print_failures(cfg.paths.work_dir)
                fail(exc, 3, "deletions held")
            except IndexHeld as exc:
                _print_failures(cfg.paths.work_dir)
                fail(exc, 4, "version held")
            except RagpipeError as exc:
                fail(exc, 2)
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
    if summary.gate:
        print(f"index gate: {summary.gate['line']}")
    if summary.skipped:
        from ragpipe.checkpoint import read_records
        from ragpipe.schemas import Skip

        skipped_path = WorkDir.of(cfg).skipped
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
    from ragpipe.ingest.summary import read_failures

    failures = read_failures(WorkDir(work_dir))
    if not failures:
        return
    table = Table(title=f"failures ({WorkDir(work_dir).failures})")
    for col in ("file", "stage", "category", "message"):
        table.add_column(col, overflow="fold")
    for f in failures:
        table.add_row(f.file_path, f.stage, f.category, f.message)
    Console().print(table)
