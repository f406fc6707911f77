"""`ragpipe inspect ...`: look at what the index holds (files, a file's chunks, a chunk,
the numbers). Reads the live version (or ``--version``) like search does; never imports
torch or Prefect."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from flows.cli_common import ConfigOption, StorePathOption, fail, index_overrides
from ragpipe.config import RagpipeConfig, load_config
from ragpipe.errors import RagpipeError
from ragpipe.query.render import terminal_safe
from ragpipe.store.base import VectorStore

inspect_app = typer.Typer(
    help="Look at what the index holds: its files, a file's chunks, one chunk with its "
    "neighbours, and its numbers (points, versions, disk).",
    no_args_is_help=True,
)


class Format(StrEnum):
    TEXT = "text"
    JSON = "json"


FormatOption = Annotated[Format, typer.Option("--format", help="text (a table) or json.")]
VersionOption = Annotated[
    str | None,
    typer.Option(
        "--version",
        help="Inspect this index version (or a unique prefix; `ragpipe index list`) instead "
        "of the live one.",
    ),
]


@contextmanager
def _opened(
    config: Path | None, store_path: Path | None, version: str | None
) -> Iterator[tuple[RagpipeConfig, VectorStore]]:
    from ragpipe.models.embedders import embedder_name
    from ragpipe.store import require_reader

    try:
        cfg = load_config(config, index_overrides(store_path, None))
        store = require_reader(cfg.store, embedder_name(cfg.embed), version,
                               cfg.file_behind("store.path"))  # fmt: skip
    except RagpipeError as exc:
        fail(exc, 2)
    try:
        yield cfg, store
    finally:
        store.close()


def _run(work: Callable[[], Any]) -> Any:
    try:
        return work()
    except RagpipeError as exc:
        fail(exc, 2)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def _table(columns: list[str], rows: list[list[Any]]) -> None:
    from rich.console import Console

    table = Table(*columns, box=None, pad_edge=False)
    for row in rows:
        table.add_row(*[escape(terminal_safe("" if v is None else str(v))) for v in row])
    out = Console()
    if not out.is_terminal:  # piped: whole cells, no wrapping to a guessed width
        out = Console(width=100_000)
    out.print(table)


def _counter(cfg: RagpipeConfig) -> Any:
    from ragpipe.ingest.chunk import TokenCounter

    return TokenCounter(cfg.chunk.tokenizer)


@inspect_app.command("files")
def files_command(
    output: FormatOption = Format.TEXT,
    version: VersionOption = None,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
) -> None:
    """Every file in the index: chunks, when it was ingested, its SHA-256; pages and
    converter of the conversion that made its chunks (recorded in paths.work_dir, blank for
    a file converted before that record was kept); then the files the last run failed on,
    with the reason."""
    from ragpipe.index_inspect import files

    with _opened(config, store_path, version) as (cfg, store):
        rows = _run(lambda: files(store, cfg.paths.work_dir))
    if output == Format.JSON:
        _print_json([r.as_dict() for r in rows])
        return
    _table(
        ["file", "chunks", "pages", "converter", "ingested", "sha256", "failure"],
        [[r.file_path, r.chunks, r.pages, r.converter, (r.ingested_at or "")[:19],
          (r.source_sha or "")[:12], r.failure] for r in rows],
    )  # fmt: skip
    failed = sum(1 for r in rows if r.failure)
    print(f"{sum(1 for r in rows if r.chunks)} files, {sum(r.chunks for r in rows)} chunks"
          + (f"; {failed} failed in the last run" if failed else ""))  # fmt: skip


@inspect_app.command("file")
def file_command(
    path: Annotated[str, typer.Argument(help="The file: its path, or a unique end of it.")],
    output: FormatOption = Format.TEXT,
    version: VersionOption = None,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
) -> None:
    """A file's chunks in order: heading path, page, word-pieces (the chunker's tokenizer),
    first words and point id."""
    from ragpipe.index_inspect import file_chunks

    with _opened(config, store_path, version) as (cfg, store):
        full, rows = _run(lambda: file_chunks(store, path, _counter(cfg)))
    if output == Format.JSON:
        _print_json({"file_path": full, "chunks": [r.as_dict() for r in rows]})
        return
    print(terminal_safe(full))
    _table(
        ["#", "heading", "page", "tokens", "first words", "point id"],
        [[r.chunk_index, r.heading, r.page, r.tokens, r.first_words, r.point_id[:8]]
         for r in rows],
    )  # fmt: skip


@inspect_app.command("chunk")
def chunk_command(
    chunk_id: Annotated[
        str,
        typer.Argument(
            help="FILE#N (chunk N of a file: its path or a unique end of it), or a chunk's "
            "point id (or its first 4+ characters)."
        ),
    ],
    output: FormatOption = Format.TEXT,
    version: VersionOption = None,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
) -> None:
    """One chunk: its text, its payload (file, heading path, page, offsets, hashes), and the
    chunks before and after it in its document."""
    from ragpipe.index_inspect import chunk

    with _opened(config, store_path, version) as (cfg, store):
        view = _run(lambda: chunk(store, chunk_id, _counter(cfg)))
    if output == Format.JSON:
        _print_json(view.as_dict())
        return
    # Indexed text is untrusted (crawled pages): no escape sequence reaches the terminal.
    print(terminal_safe(f"chunk {view.point_id}: {view.file_path} #{view.chunk_index} "
                        f"({view.tokens} tokens)"))  # fmt: skip
    for key, value in sorted(view.payload.items()):
        print(terminal_safe(f"  {key}: {value}"))
    print("\n" + terminal_safe(view.text) + "\n")
    for label, near in (("previous", view.previous), ("next", view.next)):
        if near is not None:
            print(terminal_safe(f"{label}: #{near.chunk_index} {near.point_id}  {near.heading}  "
                                f"{near.first_words}"))  # fmt: skip
        else:
            print(f"{label}: none")


@inspect_app.command("stats")
def stats_command(
    output: FormatOption = Format.TEXT,
    version: VersionOption = None,
    config: ConfigOption = None,
    store_path: StorePathOption = None,
) -> None:
    """The index in numbers: points, files, embedder, the version read, every version kept
    (`ragpipe index list`), its size on disk (Edge) and at most how many points are not
    yet in the HNSW index (written since its last build; some may be gone since)."""
    from ragpipe.index_inspect import stats

    with _opened(config, store_path, version) as (cfg, store):
        numbers = _run(lambda: stats(store, cfg.store))
    if output == Format.JSON:
        _print_json(numbers.as_dict())
        return
    disk = "" if numbers.disk_bytes is None else f"{numbers.disk_bytes / 1e6:.1f} MB"
    for label, value in (
        ("location", numbers.location), ("backend", numbers.backend),
        ("points", numbers.points), ("files", numbers.files),
        ("embedder", numbers.embedder), ("version read", numbers.version),
        ("disk", disk), ("outside HNSW, at most", numbers.unindexed),
    ):  # fmt: skip
        if value not in (None, ""):
            print(terminal_safe(f"{label:20s} {value}"))
    if numbers.versions:
        print("versions:")
        for v in numbers.versions:
            live = " (live)" if v.get("live") else ""
            print(f"  {v['generation']}  {v['status']}{live}  {v['points']} points  "
                  f"{v['files']} files  {v['published_at']}")  # fmt: skip
