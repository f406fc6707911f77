"""Published versions of an embedded (Qdrant Edge) index: readers never meet the writer.

A Qdrant Edge shard can be open in one process at a time, so a search, an
eval or ``ask`` holding the index would fail the nightly ingest, and the other
way round. Instead:

* the ingest writes the working shard at ``store.path``, as always, and when it
  has finished (store closed) **publishes** it: a copy into
  ``.NAME.published/<generation>/`` and then, atomically, the ``CURRENT``
  pointer. The generation is the working shard's own token (rewritten by every
  session that writes), so an ingest that changed nothing publishes nothing.
* a reader takes the ``CURRENT`` generation under a shared lock, copies it
  into a private directory (``.NAME.published/readers/``) and opens that copy,
  which it removes again when it closes. It never touches the working shard
  or waits for the writer; a reader opened after a publish sees the new version.
* the writer removes a superseded generation when no reader is copying it
  (an exclusive lock it does not wait for), and private copies whose process
  is gone.

The qdrant server backend needs none of this: the server serves readers and
writers at once.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ragpipe.checkpoint import atomic_write_bytes, disk_full, fsync_dir, is_no_space
from ragpipe.errors import StageError

logger = logging.getLogger(__name__)

CURRENT = "CURRENT"
VERSION_FILE = "ragpipe-version.json"
READERS = "readers"


@dataclass(frozen=True)
class IndexVersion:
    """What a published version holds; recorded in every report that read it."""

    generation: str
    published_at: str
    points: int
    files: int
    index_fingerprint: str  # converter, cleaner, chunker and embedder settings
    publish_seconds: float = 0.0
    bytes: int = 0

    @classmethod
    def read(cls, directory: Path) -> IndexVersion | None:
        try:
            data = json.loads((directory / VERSION_FILE).read_text(encoding="utf-8"))
            return cls(**data)
        except (OSError, ValueError, TypeError):
            return None


def root(store_path: Path) -> Path:
    """Where the published versions of the Edge store at ``store_path`` live."""
    real = store_path.resolve()
    return real.parent / f".{real.name}.published"


def current(store_path: Path) -> str | None:
    """The generation readers open now, or None before the first publish."""
    try:
        return (root(store_path) / CURRENT).read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def _copy_tree(source: Path, target: Path) -> None:
    """Copy a shard directory: reflinked where the file system can, holes kept sparse."""
    try:
        _copy(source, target)
    except OSError as exc:
        shutil.rmtree(target, ignore_errors=True)
        if is_no_space(exc):
            raise disk_full(target, _disk_bytes(source), exc) from exc
        raise


def _copy(source: Path, target: Path) -> None:
    cp = shutil.which("cp")
    if cp is not None:
        done = subprocess.run(
            [cp, "-R", "--reflink=auto", "--sparse=always", str(source), str(target)],
            capture_output=True,
            text=True,
        )
        if done.returncode == 0:
            return
        shutil.rmtree(target, ignore_errors=True)
        logger.debug("cp failed (%s); copying with shutil", done.stderr.strip())
    shutil.copytree(source, target)


def _disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in directory.rglob("*") if p.is_file())


def publish(
    store_path: Path, generation: str, points: int, files: int, index_fingerprint: str
) -> IndexVersion | None:
    """Publish the working shard as ``generation`` (the caller holds the ingest lock and
    has closed the store). Returns the new version, or None when it was current already."""
    base = root(store_path)
    if current(store_path) == generation and (base / generation).is_dir():
        return None
    started = time.perf_counter()
    base.mkdir(parents=True, exist_ok=True)
    target = base / generation
    version = IndexVersion.read(target) if target.is_dir() else None
    if version is None:  # written once, before any reader can see the directory
        shutil.rmtree(target, ignore_errors=True)  # a publish killed before its version file
        tmp = base / f".{generation}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            _copy_tree(store_path, tmp)
            version = IndexVersion(
                generation, datetime.now(UTC).isoformat(), points, files, index_fingerprint,
                round(time.perf_counter() - started, 3), _disk_bytes(tmp),
            )  # fmt: skip
            atomic_write_bytes(tmp / VERSION_FILE, json.dumps(asdict(version)).encode())
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(base)
    _lock_file(base, generation).touch()
    atomic_write_bytes(base / CURRENT, generation.encode())
    seconds = time.perf_counter() - started
    removed = remove_unused(store_path)
    logger.info(
        "published index version %s (%d points, %.1f MB) in %.2fs%s",
        generation[:12], points, version.bytes / 1e6, seconds,
        f"; removed {removed} old version(s)" if removed else "",
    )  # fmt: skip
    return version


def _lock_file(base: Path, generation: str) -> Path:
    return base / f"{generation}.lock"


def remove_unused(store_path: Path) -> int:
    """Remove superseded versions no reader is copying, temp dirs and dead readers' copies."""
    base = root(store_path)
    if not base.is_dir():
        return 0
    keep = current(store_path)
    removed = 0
    for entry in base.iterdir():
        if entry.name.endswith(".tmp") and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)  # a publish killed mid-copy
        elif entry.is_dir() and entry.name not in (keep, READERS):
            fd = os.open(_lock_file(base, entry.name), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a reader is copying it: the next publish removes it
            finally:
                os.close(fd)  # released either way; readers check the directory exists
            shutil.rmtree(entry, ignore_errors=True)
            _lock_file(base, entry.name).unlink(missing_ok=True)
            removed += 1
    for lock in base.glob("*.lock"):  # locks of versions removed meanwhile
        if lock.stem != keep and not (base / lock.stem).is_dir():
            lock.unlink(missing_ok=True)
    readers = base / READERS
    if readers.is_dir():
        for copy in readers.iterdir():
            pid = copy.name.split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(copy, ignore_errors=True)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def _shared(lock: Path) -> Iterator[bool]:
    """Hold a shared lock on ``lock`` if it exists; yields False when it does not."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield True
    finally:
        os.close(fd)


def reader_copy(store_path: Path) -> tuple[Path, IndexVersion | None] | None:
    """A private copy of the current published version, for one reader to open.

    None when nothing is published yet. The caller removes the copy when done
    (``EdgeStore`` does, on close).
    """
    base = root(store_path)
    for _ in range(5):  # a publish may replace CURRENT between reading it and locking
        generation = current(store_path)
        if generation is None:
            return None
        lock = _lock_file(base, generation)
        if not lock.exists():  # removed with its version a moment ago, or not made yet
            with suppress(OSError):
                lock.touch()
        with _shared(lock) as held:
            source = base / generation
            if not held or not source.is_dir():
                continue
            readers = base / READERS
            readers.mkdir(exist_ok=True)
            target = readers / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                _copy_tree(source, target)
            except BaseException:
                shutil.rmtree(target, ignore_errors=True)
                raise
        return target, IndexVersion.read(target)
    raise StageError(
        f"the published versions of {store_path} changed five times while opening one; try again"
    )


def describe(version: IndexVersion | None) -> dict[str, Any]:
    """The version fields a report records (empty when unknown)."""
    return asdict(version) if version is not None else {}
