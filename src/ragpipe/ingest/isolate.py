"""Conversion in a child process, each document under a wall-clock budget.

A document can make a converter run for good: 100,000 nested ``<div>``s kept
Docling's HTML backend busy past 600 s, and a pathological PDF can do the same
inside docling-parse's C++, where no Python timeout reaches. In-process, that
run holds the index lock until someone kills it, and the next nightly waits.

``IsolatedConverter`` runs ``Converter.convert`` in a child process, one
document at a time, and waits ``convert.timeout_s`` for each. A document over
the budget, or one that kills the child (a segfault, the OOM killer), becomes
a failure row (``timeout``, ``crashed``); the child is replaced and the batch
goes on.

Children are forked from a fork server that has imported Docling once, so a
replacement starts in milliseconds, and no child inherits the parent's
threads. Each child dies with its fork server (``PR_SET_PDEATHSIG``), and the
fork server with the run, so a killed ingest leaves no converter behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from ragpipe.errors import InputError, StageError

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from ragpipe.config import ConvertConfig
    from ragpipe.schemas import Document, SourceFile

logger = logging.getLogger(__name__)

# Imported once by the fork server; each child starts with them loaded.
PRELOAD = ["ragpipe.ingest.convert", "docling.document_converter"]
PR_SET_PDEATHSIG = 1


# The child's first message: it got past multiprocessing's start (which re-imports the
# parent's main script: a script that ingests at import, with no main guard, dies there).
READY = ("ready",)
START_TIMEOUT_S = 300.0  # the first start also starts the fork server, which imports Docling


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _serve(conn: Connection, config: ConvertConfig) -> None:
    """The child: says it started, then converts each (source, fingerprint) received; None
    ends it."""
    _die_with_parent()
    conn.send(READY)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    from ragpipe.ingest.convert import Converter

    converter = Converter(config)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):  # the run ended or was interrupted: nobody to answer
            return
        if job is None:
            return
        source, fingerprint = job
        reply: tuple[Any, ...]
        try:
            reply = ("ok", converter.convert(source, fingerprint))
        except InputError as exc:
            reply = ("input", exc.category, str(exc))
        except StageError as exc:
            reply = ("stage", str(exc))
        except Exception as exc:  # one bad document never sinks the batch
            reply = ("error", f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except OSError:  # the run went while this document converted
            return


def _context() -> multiprocessing.context.BaseContext:
    if "forkserver" not in multiprocessing.get_all_start_methods():  # pragma: no cover
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # takes effect if the server is not running yet
    return context


@contextlib.contextmanager
def _children_allowed() -> Iterator[None]:
    """Let a daemonic process (a Dask or multiprocessing pool worker running a convert batch)
    start the converter's child. multiprocessing refuses because a daemon's children would
    outlive it; ours cannot: the child dies with its fork server (PR_SET_PDEATHSIG), and the
    fork server with this process."""
    config = multiprocessing.current_process()._config  # type: ignore[attr-defined]
    daemon = config.pop("daemon", None)
    try:
        yield
    finally:
        if daemon is not None:
            config["daemon"] = daemon


class IsolatedConverter:
    """``Converter.convert`` in a child process with ``timeout_s`` per document."""

    def __init__(self, config: ConvertConfig, timeout_s: float) -> None:
        self.config = config
        self.timeout_s = timeout_s
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None

    def _child(self) -> Connection:
        if self._conn is None:
            context = _context()
            ours, theirs = context.Pipe()
            process = context.Process(  # type: ignore[attr-defined]
                target=_serve, args=(theirs, self.config), name="ragpipe-convert", daemon=True
            )
            try:
                with _children_allowed():
                    process.start()
            except BaseException:  # e.g. SIGTERM while the fork server starts: a child
                ours.close()  # forked all the same finds its parent's end closed and ends
                raise
            finally:
                theirs.close()
            self._process, self._conn = process, ours
            self._started(ours)
        return self._conn

    def _started(self, conn: Connection) -> None:
        """Wait for the child's READY; a child that dies or hangs before it cannot convert
        any file, so that stops the stage with the likely cause instead of failing each one."""
        try:
            ready = conn.recv() if conn.poll(START_TIMEOUT_S) else None
        except (EOFError, ConnectionResetError):
            ready = None
        if ready == READY:
            return
        code = self._stop()
        raise StageError(
            f"the converter process did not start (exit {code}). If ragpipe runs from your own "
            'Python script, put the call under `if __name__ == "__main__":`: the converter\'s '
            "process re-imports the main script, and a script that ingests at import starts "
            "another ingest there"
        )

    def convert(self, source: SourceFile, fingerprint: str) -> Document:
        """Convert one file in the child.

        Raises:
            InputError: The file cannot be converted, took longer than ``timeout_s``
                (``timeout``) or killed the converter (``crashed``).
            StageError: The converter itself cannot run (e.g. missing weights).
        """
        conn = self._child()
        try:
            conn.send((source, fingerprint))
            finished = conn.poll(self.timeout_s)
            reply = conn.recv() if finished else None
        except (EOFError, BrokenPipeError, ConnectionResetError):
            code = self._stop()
            raise InputError(
                "crashed",
                f"the converter process died on this file (exit {code}: a crash or the "
                "out-of-memory killer); the file is skipped and the batch goes on",
            ) from None
        if reply is None:
            self._stop()
            raise InputError(
                "timeout",
                f"conversion took longer than convert.timeout_s ({self.timeout_s:g} s) and was "
                "stopped; the batch goes on. Raise convert.timeout_s if such a document is "
                "legitimately slow",
            )
        kind, *rest = reply
        if kind == "ok":
            return rest[0]  # type: ignore[no-any-return]
        if kind == "input":
            raise InputError(rest[0], rest[1])
        if kind == "stage":
            raise StageError(rest[0])
        raise InputError("error", rest[0])

    def _stop(self) -> int | None:
        """Kill the child (a new one starts for the next document); its exit code."""
        process, self._process, self._conn = self._process, None, None
        if process is None:
            return None
        process.kill()
        process.join(10)
        return process.exitcode

    def close(self) -> None:
        """End the child: asked first, killed if it does not go."""
        conn, process = self._conn, self._process
        self._process, self._conn = None, None
        if conn is not None:
            with contextlib.suppress(OSError):  # gone already
                conn.send(None)
            conn.close()
        if process is not None:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(10)

    def __enter__(self) -> IsolatedConverter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:  # interrupted (SIGTERM, Ctrl-C) or failed: no waiting
            self._stop()
        self.close()
        if exc_type is not None and not issubclass(exc_type, Exception):  # an interrupt
            stop_fork_server()


def stop_fork_server() -> None:
    """Kill the fork server, and with it (``PR_SET_PDEATHSIG``) any converter child, when a
    run is interrupted: the run stops now. On its first start the server spends seconds
    importing Docling; left alone, it ran on after the interrupted run had ended (holding
    the run's stdout), and a child it forked as the interrupt came printed a traceback.
    The next converter starts a new server."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    lock = getattr(server, "_lock", None)
    if lock is None or not lock.acquire(timeout=5):  # pragma: no cover - another Python
        return
    try:
        pid = server._forkserver_pid  # type: ignore[union-attr]
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        server._stop_unlocked()  # type: ignore[union-attr]  # reaps it, frees its socket
    finally:
        lock.release()
