"""Who owns a reader's private copy, and whether that owner is gone.

Each copy under ``readers/`` has a record beside it, ``<copy>.owner.json``: the owner's
identity (``locking.process_identity``: host, pid namespace, pid, start time). The owner
also **holds a shared lock** on the record for as long as the copy is open, and **beats**:
it touches the record every ``HEARTBEAT_S`` seconds.

A cleanup (every ingest) judges a copy by its record:

* an owner of this host and pid namespace is checked by its pid and start time, which is
  exact;
* an owner it cannot check that way (another host, or another container sharing the
  store's volume) is gone when nobody holds the record's lock **and** the record has not
  been touched for ``STALE_S``. The kernel (or an NFS server) drops the lock with the
  process, and the heartbeat stops with it; needing both keeps a live reader's copy on a
  filesystem whose locks do not reach across hosts. A pod restarted in a new pid namespace
  so no longer leaks its copies for good, as it did when such copies were kept until
  removed by hand.

Records written before the lock and the heartbeat (no ``heartbeat_s`` field) cannot be
judged this way and are kept: their copies are removed by hand once those readers have
stopped. A record that cannot be read at all (a disk error) is judged by the lock and the
heartbeat alone, which need no content.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import threading
import time
import uuid
from pathlib import Path

from ragpipe.locking import holder_alive, process_identity

logger = logging.getLogger(__name__)

HEARTBEAT_S = 300.0  # how often an owner touches its record
STALE_S = 3600.0  # untouched this long, and unlocked: the owner is gone
TEMP_STALE_S = 3600.0  # a record half-written this long ago was left by a killed process

# flock's errors on a filesystem that has no locks
NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})

_held: dict[Path, int] = {}  # record -> the open descriptor that holds its lock
_guard = threading.Lock()
_beating: threading.Thread | None = None


def claim(record: Path) -> None:
    """Write ``record`` for this process, locked from before it has its name: a cleanup
    never finds it unlocked while its owner lives. Beats until ``release``."""
    identity = {**process_identity(), "heartbeat_s": HEARTBEAT_S}
    temp = record.with_name(f"{record.name}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # kept across the rename: it is the inode's
        os.write(fd, json.dumps(identity).encode())
        os.fsync(fd)
        os.rename(temp, record)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    with _guard:
        _held[record] = fd
        _start_beating()


def release(record: Path) -> None:
    """Stop beating for ``record`` and drop its lock (the caller removes the file)."""
    with _guard:
        fd = _held.pop(record, None)
    if fd is not None:
        os.close(fd)


def _start_beating() -> None:
    """Under ``_guard``: a heartbeat thread, unless one runs (a forked child has none)."""
    global _beating
    if _beating is None or not _beating.is_alive():
        _beating = threading.Thread(target=_beat_forever, name="ragpipe-reader-heartbeat",
                                    daemon=True)  # fmt: skip
        _beating.start()


def _forked() -> None:
    """In a forked child: no heartbeat thread, a fresh guard (the parent's may have been
    held at the fork), and none of the parent's records. Closing the child's duplicates
    leaves the parent's locks held: a lock belongs to the open file, which the parent
    still has open."""
    global _guard, _beating
    _guard, _beating = threading.Lock(), None
    for fd in _held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_forked)


def _beat_forever() -> None:
    global _beating
    while True:
        time.sleep(HEARTBEAT_S)
        try:
            beat()
        except Exception:  # never end silently: the records would go quiet
            logger.exception("the reader heartbeat failed; trying again in %.0f s", HEARTBEAT_S)
        with _guard:  # decided under the guard: a claim meanwhile finds no thread, starts one
            if not _held:
                _beating = None
                return


def beat() -> int:
    """Touch every record this process holds; the number touched. Under the guard: a
    descriptor released meanwhile could be reused for another file."""
    touched = 0
    with _guard:
        for record, fd in _held.items():
            try:
                os.utime(fd)
                touched += 1
            except OSError as exc:  # the volume went away, say
                logger.warning("could not touch the owner record %s: %s", record, exc)
    return touched


def gone(record: Path, now: float | None = None) -> bool:
    """Whether the owner of ``record`` is gone (its copy may be removed); when in doubt,
    False: kept rather than removed under a reader."""
    try:
        owner = json.loads(record.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return False  # removed meanwhile, by its owner
    except (OSError, ValueError):
        owner = None
    if not isinstance(owner, dict):  # unreadable: the lock and the heartbeat need no content
        return _untouched(record, STALE_S, now) and not _locked(record)
    alive = holder_alive(owner)
    if alive is not None:
        return not alive
    if not owner.get("heartbeat_s"):
        return False  # an older record: nothing else to judge it by
    return _untouched(record, STALE_S, now) and not _locked(record)


def _untouched(path: Path, seconds: float, now: float | None) -> bool:
    """Not modified for ``seconds`` (False when it cannot be found out)."""
    try:
        touched = path.stat().st_mtime
    except OSError:
        return False
    return (time.time() if now is None else now) - touched > seconds


def _locked(path: Path) -> bool:
    """Whether someone holds a lock on ``path``: True when that cannot be found out; False
    on a filesystem without locks (the heartbeat alone decides there)."""
    try:  # writable: NFS emulates flock with byte-range locks, and LOCK_EX needs it
        fd = os.open(path, os.O_RDWR)
    except PermissionError:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return True
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError as exc:
        return exc.errno not in NO_LOCKS  # any other failure: kept, as if locked
    finally:
        os.close(fd)  # the probe's own lock, if it got one, goes with it
    return False


def stale_temp(path: Path, now: float | None = None) -> bool:
    """A half-written record (``*.tmp``) a killed process left, old enough that no live
    writer is between creating and renaming it."""
    return _untouched(path, TEMP_STALE_S, now)
