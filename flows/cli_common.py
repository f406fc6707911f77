"""What every command shares: Prefect set up quietly, expected errors as one line, an
interrupt as one line, progress bars, and the options several commands take."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from ragpipe.config import (
    EmbedProvider,
    RetrievalMode,
)
from ragpipe.errors import RagpipeError

console = Console(stderr=True)


def index_overrides(
    store_path: Path | None, embedder: EmbedProvider | None
) -> dict[str, dict[str, Any]]:
    """The config overrides of --store-path and --embedder (the index a command reads)."""
    overrides: dict[str, dict[str, Any]] = {}
    if store_path is not None:
        overrides["store"] = {"path": str(store_path)}
    if embedder is not None:
        overrides["embed"] = {"provider": embedder.value}
    return overrides


def sigterm_unwinds() -> None:
    """SIGTERM (`timeout`, `systemctl stop`, a worker cancelling) unwinds like Ctrl-C: every
    ``finally`` runs, so a reader's private copy of the index, the writer slot and the locks
    are given back and a half-done write is taken back before the process ends (exit 130).
    Left at its default, SIGTERM ends the process on the spot (exit 143) with none of that.
    Every command gets it (``flows.cli``'s root callback). Off the main thread (the CLI
    invoked from a program's thread) signals are not Python's to set: left as they are."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)


def plain_env(verbose: bool) -> None:
    """A command that runs the library without Prefect: ragpipe's log lines at INFO with
    --verbose (else WARNING), and SIGTERM unwinding like Ctrl-C."""
    sigterm_unwinds()
    logging.basicConfig(format="%(message)s")
    logging.getLogger("ragpipe").setLevel(logging.INFO if verbose else logging.WARNING)


def prefect_env(verbose: bool) -> None:
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
    sigterm_unwinds()  # the writer slot and the locks are given back before the process ends
    set_library_level(logging.INFO if verbose else logging.WARNING)
    if not verbose:
        for name in PREFECT_RUN_LOGGERS:
            logging.getLogger(name).addFilter(HIDE_EXPECTED)


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def stopped_by_signal(exc: BaseException) -> bool:
    """Whether Ctrl-C or SIGTERM is what stopped a run: ``exc`` is the signal itself, or
    Prefect's own failure to handle it.

    While a flow runs, Prefect's own SIGTERM handler raises its ``TerminationSignal``
    instead of ours. When that lands while Prefect's engine is still creating a task run,
    Prefect's crash handling itself fails (``ValueError('Task run is not set')``) and the
    flow ends with that error, the signal only in its context. Any other error raised
    while a signal unwinds (giving the writer slot back failed, say) is not the signal:
    it is shown as the error it is."""
    prefect_exceptions = sys.modules.get("prefect.exceptions")  # never imported here
    termination = getattr(prefect_exceptions, "TerminationSignal", KeyboardInterrupt)
    signals = (KeyboardInterrupt, termination)
    if isinstance(exc, signals):
        return True
    if not (isinstance(exc, ValueError) and str(exc) == "Task run is not set"):
        return False
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc.__cause__, exc.__context__]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        if isinstance(current, signals):
            return True
        seen.add(id(current))
        pending += [current.__cause__, current.__context__]
    return False


@contextmanager
def interruptible(what_is_kept: str | Callable[[], str]) -> Iterator[None]:
    """Ctrl-C or SIGTERM inside ends the command with one line, ``interrupted: ...`` saying
    what is kept, and exit 130; so does Prefect's own failure to handle the signal
    (``stopped_by_signal``), which would otherwise end it in a traceback, exit 1.

    Args:
        what_is_kept: The line's text, or a function giving it when what is kept depends
            on how far the command got.
    """
    try:
        yield
    except (KeyboardInterrupt, Exception) as exc:  # typer.Exit from fail() passes through
        if not stopped_by_signal(exc):
            raise
        kept = what_is_kept() if callable(what_is_kept) else what_is_kept
        fail(RuntimeError(kept), 130, "interrupted")


def fail(exc: BaseException, code: int, label: str = "error") -> NoReturn:
    """Print an expected error as one line (never wrapped, never read as markup); exit."""
    console.print(f"[red]{label}:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code) from exc


def error_names(cls: type[BaseException] = RagpipeError) -> set[str]:
    return {cls.__name__}.union(*(error_names(sub) for sub in cls.__subclasses__()))


# How Prefect's crashed states name Ctrl-C and SIGTERM (prefect.states).
SIGNALLED = ("an interrupt signal", "a termination signal")


class HideExpectedErrors(logging.Filter):
    """Drop Prefect's tracebacks of ragpipe's own errors (bad config, a held store, a full
    disk, ...) and of a run stopped by a signal: the CLI prints the one line that matters.
    Unexpected errors keep theirs; ``--verbose`` keeps everything."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, RagpipeError) or (exc is not None and stopped_by_signal(exc)):
            # The CLI says it: "interrupted: ..." (interruptible); a short command ends
            # silently with 130, as typer ends any command a KeyboardInterrupt reaches.
            return False
        if record.levelno < logging.ERROR:
            return True
        message = record.getMessage()
        if any(f"Execution was aborted by {by}" in message for by in SIGNALLED):
            # "Crash detected! ...", "Finished in state Crashed(...)": Ctrl-C or SIGTERM,
            # logged with no exception; the CLI's one line says it
            return False
        return not any(f"exception {n}:" in message or f"{n}(" in message for n in error_names())


HIDE_EXPECTED = HideExpectedErrors()
# Where Prefect logs a failed task or flow run (with the traceback).
PREFECT_RUN_LOGGERS = ("prefect.task_runs", "prefect.flow_runs", "prefect.task_engine",
                        "prefect.flow_engine")  # fmt: skip


class RichReporter:
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


ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (default: ./ragpipe.yaml if present)."),
]
StorePathOption = Annotated[
    Path | None, typer.Option(help="store.path: the index to query (default data/store).")
]
ModeOption = Annotated[
    RetrievalMode | None,
    typer.Option(
        help="dense, sparse (BM25) or hybrid (both, fused by retrieve.fusion_method). "
        "Default: config."
    ),
]
KOption = Annotated[int | None, typer.Option("--k", "-k", help="Chunks to return (top_k).")]
RerankOption = Annotated[
    bool | None,
    typer.Option(
        "--rerank/--no-rerank",
        help="Rerank with retrieve.reranker: a cross-encoder (must exist locally), or llm "
        "(the configured LLM judges each candidate: seconds each on a CPU, cached).",
    ),
]
FilterOption = Annotated[
    list[str] | None,
    typer.Option(
        "--filter",
        help="file=SUFFIX (the stored path ends with these whole path parts: a file name, "
        "or dir/name), heading=TEXT, sha=SOURCE_SHA256; repeat to AND different keys.",
    ),
]
EmbedderOption = Annotated[
    EmbedProvider | None,
    typer.Option(help="The embedder the index was built with (default: config)."),
]
