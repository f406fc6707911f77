"""One writer per index: an exclusive lock held for a whole ingest run.

Two ingests against the same store never interleave: the second waits up to
``index.lock_timeout_s`` for the first to finish, then refuses with a message
naming the lock and its holder. The lock is an OS file lock (``flock``),
released when the holding process exits, even by SIGKILL: a crash never
leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from ragpipe.config import RagpipeConfig, StoreBackend
from ragpipe.errors import StageError


def lock_path(config: RagpipeConfig) -> Path:
    """Beside an Edge store; in the work dir for a qdrant server or local mode."""
    store = config.store
    if store.backend == StoreBackend.EDGE:
        return store.path.parent / f".{store.path.name}.ingest.lock"
    where = f"{store.url or store.path}|{store.collection}"
    digest = hashlib.sha256(where.encode()).hexdigest()[:12]
    return config.paths.work_dir.parent / f".ragpipe-{digest}.ingest.lock"


@contextmanager
def ingest_lock(config: RagpipeConfig, timeout_s: float | None = None) -> Iterator[Path]:
    """Hold the index's writer lock for the body; wait, then raise StageError if taken."""
    path = lock_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    wait = config.index.lock_timeout_s if timeout_s is None else timeout_s
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read_holder(path)
                    raise StageError(
                        f"another ingest is writing to this index ({holder}; lock {path}). "
                        f"Waited {wait:.0f}s (index.lock_timeout_s). Runs never interleave: "
                        "try again when it has finished."
                    ) from None
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        me = {"pid": os.getpid(), "host": socket.gethostname(),
              "since": datetime.now(UTC).isoformat()}  # fmt: skip
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing releases the lock


def _read_holder(path: Path) -> str:
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, json.JSONDecodeError):
        return "holder unknown"
    return f"pid {data.get('pid')} on {data.get('host')} since {data.get('since')}"
