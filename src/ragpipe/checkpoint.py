"""Durable, typed checkpoints.

A checkpoint is a Parquet file written under a temporary name, fsynced and
renamed; its manifest (JSON, same dance) is written last. A stage whose
manifest is missing did not finish, whatever Parquet files lie around.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from ragpipe.errors import DiskFull, StageError
from ragpipe.schemas import SCHEMAS

logger = logging.getLogger(__name__)

R = TypeVar("R")


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some filesystems do not allow opening directories
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_beside(path: Path) -> tuple[int, str]:
    """A new, exclusively created temp file next to ``path`` (same file system), with the
    mode ``open(path, "w")`` would give (0o666 less the umask: a group-writable project
    stays so)."""
    tmp = str(path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp


# ``_temp_beside``'s names: ".{name}.{pid}.{12 hex digits}.tmp".
_OUR_TEMP = re.compile(r"\..+\.\d+\.[0-9a-f]{12}\.tmp")


def remove_stale_temps(directory: Path, not_ours: Iterable[Path] = ()) -> int:
    """Delete temp files a killed writer left under ``directory``; returns how many.

    Only files named as ``_temp_beside`` names them, and never below ``not_ours`` (the
    corpus's roots, the store): a user's ".budget.tmp" in a root under the work dir, or
    a folder the store's publisher was copying, is no checkpoint's (deleting every
    ".*.tmp" removed the one and crashed every later run on the other).

    Call only while holding the ingest lock: no other writer is mid-write then.
    Temp files are never read (they do not carry a checkpoint's name), so this
    only reclaims space.
    """
    removed = 0
    if not directory.is_dir():
        return removed
    skip = {os.path.realpath(p) for p in not_ours}
    for here, folders, files in os.walk(directory):
        folders[:] = [f for f in folders if os.path.realpath(os.path.join(here, f)) not in skip]
        for name in files:
            path = Path(here, name)
            if _OUR_TEMP.fullmatch(name) and path.is_file() and not path.is_symlink():
                path.unlink(missing_ok=True)
                removed += 1
    return removed


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def is_no_space(exc: BaseException) -> bool:
    """True for "no space left on device" / "disk quota exceeded", also as Arrow reports it."""
    if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
        return True
    text = str(exc)
    return "No space left on device" in text or "Disk quota exceeded" in text


def free_bytes(path: Path) -> int | None:
    """Free bytes on the file system holding ``path`` (or its nearest existing parent)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def _mb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e6:.1f} MB"


def disk_full(
    path: Path, needed: int | None, exc: BaseException | None = None, why: str = ""
) -> DiskFull:
    """The one-line error for a write that found no space; nothing half-written is kept."""
    cause = f" ({exc.strerror or exc})" if isinstance(exc, OSError) else ""
    return DiskFull(
        f"no space left to write {path}{cause}: {_mb(free_bytes(path))} free, about "
        f"{_mb(needed)} needed{why}. The run stopped there; what finished is kept. Free some "
        "space (or move paths.work_dir / store.path) and re-run."
    )


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never half."""
    _write_via_temp(path, data, os.replace)


def atomic_create_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file ``path``, whole or not at all: never over a file that
    exists (``FileExistsError``, as ``open(path, "x")``), and never a cut-off one that an
    interrupt or a full disk left behind.

    Raises:
        FileExistsError: ``path`` exists (also when it was made meanwhile).
        DiskFull: No space left to write it.
    """
    # A hard link, unlike a rename, refuses an existing name: the exclusive create of "x"
    # without its half-written window.
    _write_via_temp(path, data, _link_or_claim)


# What a file system without hard links (FAT, exFAT, some network and FUSE mounts) says to
# os.link.
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EMLINK}


def _link_or_claim(tmp: str, path: Path) -> None:
    """``os.link(tmp, path)``; where the file system has no hard links, the name is claimed
    by an exclusive create (refusing an existing file as the link would) and the whole file
    renamed over the empty claim. Only in that case can an empty ``path`` be seen, between
    the claim and the rename (never a cut-off one), or left by a kill between them."""
    try:
        os.link(tmp, path)
        return
    except OSError as exc:
        if isinstance(exc, FileExistsError) or exc.errno not in _NO_LINKS:
            raise
    # Ctrl-C and SIGTERM wait: a signal raised as os.open returns (its fd never stored)
    # would leave the empty claim behind, which blocks the name.
    with signals_deferred():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            path.unlink(missing_ok=True)  # the empty claim, ours: not a file the user had
            raise


class _Held:
    """A signal handler that notes Ctrl-C and SIGTERM for later (``signals_deferred``); a
    second Ctrl-C is not held: the way out of a block stuck on a hung file system."""

    def __init__(self) -> None:
        self.caught: list[int] = []

    def __call__(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and signum in self.caught:
            raise KeyboardInterrupt
        self.caught.append(signum)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block ends, then act as they would have, so that
    a few steps that belong together (two files of one record, a file and the note that
    it was written) are all done or none. Python's handlers are swapped for one that
    notes them (a signal mask would not do: another thread takes the signal, and Python
    still raises in the main one). On the main thread only, where signal handlers run,
    and for handlers set from Python (one set by C code cannot be put back). Keep the
    block short; a second Ctrl-C ends it at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    held = _Held()
    error: BaseException | None = None
    try:
        for s, handler in previous.items():
            if handler is not None:
                signal.signal(s, held)
        yield
    finally:
        for s, handler in previous.items():
            while handler is not None:
                try:  # a handler given back may run (and raise) before the next swap
                    signal.signal(s, handler)
                    break
                except BaseException as exc:  # raised below, after the rest
                    error = error or exc
        for caught in dict.fromkeys(held.caught):  # each as it would have acted: all of them
            handler = previous[signal.Signals(caught)]
            try:
                if callable(handler):
                    handler(caught, None)
                elif handler == signal.SIG_DFL:
                    signal.raise_signal(caught)
            except BaseException as exc:  # the first is raised below
                error = error or exc
        if error is not None:
            raise error


def _write_via_temp(path: Path, data: bytes, publish: Callable[[str, Path], None]) -> None:
    """``data`` into a temp file beside ``path``, fsynced, then ``publish(temp, path)``; the
    temp file never outlives the call, whatever stops it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _temp_beside(path)
    except OSError as exc:
        if is_no_space(exc):
            raise disk_full(path, len(data), exc) from exc
        raise
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        publish(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)  # first: the free space reported counts it back
        if is_no_space(exc):
            raise disk_full(path, len(data), exc) from exc
        raise
    finally:
        Path(tmp).unlink(missing_ok=True)  # renamed away already, or a link's second name
    fsync_dir(path.parent)


def records_to_table(records: Sequence[Any], record_type: type) -> pa.Table:
    """Build an Arrow table of ``record_type`` rows with its declared schema."""
    schema = SCHEMAS[record_type]
    # Column-wise from the attributes: dataclasses.asdict deep-copies every row.
    columns = {name: [getattr(r, name) for r in records] for name in schema.names}
    return pa.Table.from_pydict(columns, schema=schema)


def write_records(path: Path, records: Sequence[Any], record_type: type) -> str:
    """Write records atomically as Parquet with the declared schema.

    Returns:
        SHA-256 of the written file, usable as the next stage's input fingerprint.
    """
    return write_table(path, records_to_table(records, record_type))


def write_table(path: Path, table: pa.Table) -> str:
    """Write an Arrow table atomically as Parquet; returns the file's SHA-256."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _temp_beside(path)
    except OSError as exc:
        if is_no_space(exc):
            raise disk_full(path, table.nbytes, exc) from exc
        raise
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd")
        with open(tmp, "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if is_no_space(exc):
            raise disk_full(path, table.nbytes, exc) from exc
        raise
    fsync_dir(path.parent)
    return digest


def read_state(path: Path, record_type: type[R], otherwise: str) -> list[R]:
    """A state file kept between runs (fetch, objects, records), or [] when there is none or it
    cannot be read (logged: ``otherwise`` says what the run does instead)."""
    if not path.is_file():
        return []
    try:
        return read_records(path, record_type)
    except (StageError, ValueError) as exc:
        logger.warning("state %s unreadable (%s); %s", path, exc, otherwise)
        return []


def read_records(path: Path, record_type: type[R]) -> list[R]:
    """Read a checkpoint, checking its schema against the declared one.

    Raises:
        StageError: The file is missing, unreadable or has another schema
            (written by another ragpipe version: delete the work dir).
    """
    schema = SCHEMAS[record_type]
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise StageError(f"cannot read checkpoint {path}: {exc}") from exc
    if not table.schema.equals(schema, check_metadata=False):
        raise StageError(
            f"checkpoint {path} has schema {table.schema} but {record_type.__name__} expects "
            f"{schema}; it was written by another ragpipe version: delete {path.parent} and re-run"
        )
    # Column-wise: far cheaper than one dict per row (table.to_pylist()).
    columns = []
    for f in schema:
        values = table.column(f.name).to_pylist()
        if pa.types.is_map(f.type):
            values = [dict(v) for v in values]
        columns.append(values)
    if [f.name for f in dataclasses.fields(record_type)] == schema.names:  # type: ignore[arg-type]
        return [record_type(*row) for row in zip(*columns, strict=True)]
    names = schema.names
    return [record_type(**dict(zip(names, row, strict=True))) for row in zip(*columns, strict=True)]


@dataclass
class Manifest:
    """What a finished stage wrote, and under which inputs and config."""

    stage: str
    config_fingerprint: str
    input_fingerprint: str
    outputs: dict[str, str]  # output name -> sha256 of the file
    counts: dict[str, int]
    written_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    # The ingest run whose plan this output belongs to (a fresh id per plan; stamped again
    # when a later run reuses the output). Stages check it before reading their input.
    plan_id: str = ""

    @property
    def output_fingerprint(self) -> str:
        """Fingerprint of everything the stage wrote (input of the next stage)."""
        joined = json.dumps(self.outputs, sort_keys=True)
        return hashlib.sha256(joined.encode()).hexdigest()[:16]


def manifest_path(stage_dir: Path) -> Path:
    return stage_dir / "manifest.json"


def write_manifest(stage_dir: Path, manifest: Manifest) -> None:
    """Mark a stage done. Call only after every output is durably written."""
    data = json.dumps(dataclasses.asdict(manifest), indent=2, sort_keys=True).encode()
    atomic_write_bytes(manifest_path(stage_dir), data)


def read_manifest(stage_dir: Path) -> Manifest | None:
    """The stage's manifest, or None when the stage never finished (or it is unreadable)."""
    path = manifest_path(stage_dir)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Manifest(**data)
    except (OSError, ValueError, TypeError) as exc:
        logger.warning("ignoring unreadable manifest %s: %s", path, exc)
        return None


def outputs_intact(stage_dir: Path, manifest: Manifest) -> bool:
    """True when every output the manifest names still exists with the recorded hash."""
    for name, digest in manifest.outputs.items():
        path = stage_dir / name
        if not path.is_file():
            return False
        with open(path, "rb") as fh:
            if hashlib.file_digest(fh, "sha256").hexdigest() != digest:
                return False
    return True


def is_current(stage_dir: Path, config_fingerprint: str, input_fingerprint: str) -> Manifest | None:
    """The manifest if the stage already ran on these inputs with this config, else None."""
    manifest = read_manifest(stage_dir)
    if manifest is None:
        return None
    if (
        manifest.config_fingerprint != config_fingerprint
        or manifest.input_fingerprint != input_fingerprint
    ):
        return None
    if not outputs_intact(stage_dir, manifest):
        logger.warning("outputs of %s changed since its manifest; re-running", stage_dir)
        return None
    return manifest


def combine_fingerprints(parts: Iterable[str]) -> str:
    """One short fingerprint over several."""
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
