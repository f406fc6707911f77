"""Run one ingest and SIGKILL it at a chosen point (a child process of the tests).

    python -m tests.support.crash_ingest CONFIG_JSON POINT

The process kills itself with SIGKILL, so nothing gets to clean up: no
``finally``, no ``atexit``, no flush of the Edge shard, no lock release but
the kernel's. Points (each in the stage it names):

* ``convert``: converting the second file, after the first is cached.
* ``convert-output``: convert's documents.parquet is written to its temp file
  but not yet renamed (so not its manifest either).
* ``clean`` / ``chunk``: cleaning / chunking the second document.
* ``embed``: the second part of vectors is written to a temp file, not renamed.
* ``upsert``: half of the points are in the store.
* ``delete``: every new version is stored, no stale version deleted yet.
* ``delete-partial``: the first stale version is deleted, the others not.
* ``versions``: the store is final, its saved scroll not yet renamed.
* ``upsert-manifest``: everything is written but upsert's manifest.

Web-page points (``WEB_POINTS``, for a config with ``discover.urls``):

* ``fetch-body``: the second downloaded page's body is in its temp file.
* ``fetch-state``: every body is written, the fetch state not yet renamed.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from ragpipe.config import RagpipeConfig
from ragpipe.ingest import chunk as chunk_stage
from ragpipe.ingest import clean as clean_stage
from ragpipe.ingest import embed as embed_stage
from ragpipe.ingest.convert import Converter
from ragpipe.ingest.isolate import IsolatedConverter
from ragpipe.ingest.pipeline import run_ingest
from ragpipe.store import EdgeStore, QdrantStore

POINTS = (
    "convert",
    "convert-output",
    "clean",
    "chunk",
    "embed",
    "upsert",
    "delete",
    "delete-partial",
    "versions",
    "upsert-manifest",
)

WEB_POINTS = ("fetch-body", "fetch-state")


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def on_call(n: int, real: Callable[..., Any], before: bool = True) -> Callable[..., Any]:
    """``real``, except that call number ``n`` kills the process (before or after it runs)."""
    calls = 0

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == n and before:
            die()
        result = real(*args, **kwargs)
        if calls == n:
            die()
        return result

    return wrapper


def on_rename(match: Callable[[str], bool]) -> None:
    """Kill when a checkpoint's temp file is about to be renamed onto ``match``ing path."""
    real = os.replace

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        if match(os.fspath(dst)):
            die()
        real(src, dst, **kwargs)

    os.replace = replace  # type: ignore[assignment]


def nth(fragment: str, n: int) -> Callable[[str], bool]:
    """A rename matcher true for the ``n``-th path containing ``fragment``."""
    seen = 0

    def match(path: str) -> bool:
        nonlocal seen
        seen += fragment in path
        return seen == n and fragment in path

    return match


def arm(point: str) -> None:
    store_types = (EdgeStore, QdrantStore)
    if point == "convert":  # in this process, or handing the file to the converter's child
        Converter.convert = on_call(2, Converter.convert)  # type: ignore[method-assign]
        IsolatedConverter.convert = on_call(2, IsolatedConverter.convert)  # type: ignore[method-assign]
    elif point == "convert-output":
        on_rename(lambda p: p.endswith("/convert/documents.parquet"))
    elif point == "clean":
        clean_stage.clean_markdown = on_call(2, clean_stage.clean_markdown)  # type: ignore[assignment]
    elif point == "chunk":
        chunk_stage.chunk_document = on_call(2, chunk_stage.chunk_document)  # type: ignore[assignment]
    elif point == "embed":
        embed_stage.PART_SIZE = 4
        on_rename(nth("/embed/parts/", 2))
    elif point == "upsert":
        for cls in store_types:
            real = cls.upsert

            def half(self: Any, points: Any, progress: Any = None, _real: Any = real) -> None:
                _real(self, points[: len(points) // 2], progress)
                die()

            cls.upsert = half  # type: ignore[method-assign]
    elif point in ("delete", "delete-partial"):
        for cls in store_types:
            cls.delete = on_call(1, cls.delete, before=point == "delete")  # type: ignore[method-assign]
    elif point == "versions":
        on_rename(lambda p: p.endswith("/plan/store-versions.parquet"))
    elif point == "upsert-manifest":
        on_rename(lambda p: p.endswith("/upsert/manifest.json"))
    elif point == "fetch-body":
        on_rename(nth("/fetch/bodies/", 2))
    elif point == "fetch-state":
        on_rename(lambda p: p.endswith("/fetch/pages.parquet"))
    else:
        choices = ", ".join(POINTS + WEB_POINTS)
        raise SystemExit(f"unknown crash point {point!r}; choose from {choices}")


def main() -> None:
    config = RagpipeConfig.model_validate_json(sys.argv[1])
    arm(sys.argv[2])
    run_ingest(config)
    print("finished without reaching the crash point")
    sys.exit(3)


if __name__ == "__main__":
    main()
