"""One writer per index, and per work dir: exclusive locks held for a whole ingest run.

Two ingests against the same store never interleave, nor do two that share a
work dir (their checkpoints would mix, whatever stores they write to): the
second waits up to ``index.lock_timeout_s`` for the first to finish, saying
so, then refuses with a message naming the lock and its holder. The locks are
OS file locks (``flock``), released when the holding process exits, even by
SIGKILL: a crash never leaves a stale lock behind. An Edge store's lock is
keyed on its real path, so a store reached through a symlink is the same index.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path

from ragpipe.config import RagpipeConfig, StoreBackend
from ragpipe.errors import ConfigError, StageError

logger = logging.getLogger(__name__)

# How often a waiting run says it is still waiting.
WAIT_NOTICE_S = 30.0


def index_identity(config: RagpipeConfig) -> str:
    """What names one index: an Edge store's real path, a qdrant URL (or path) + collection."""
    store = config.store
    if store.backend == StoreBackend.EDGE:
        return str(store.path.resolve())
    return f"{store.url or store.path}|{store.collection}"


def index_resource_id(config: RagpipeConfig) -> str:
    """The Prefect resource id of the index's events (``ragpipe.index.<12 hex>``)."""
    return "ragpipe.index." + hashlib.sha256(index_identity(config).encode()).hexdigest()[:12]


def lock_path(config: RagpipeConfig) -> Path:
    """Beside an Edge store (its real path); in the work dir's parent for a qdrant server."""
    store = config.store
    if store.backend == StoreBackend.EDGE:
        real = store.path.resolve()
        return real.parent / f".{real.name}.ingest.lock"
    digest = hashlib.sha256(index_identity(config).encode()).hexdigest()[:12]
    return config.paths.work_dir.resolve().parent / f".ragpipe-{digest}.ingest.lock"


def work_dir_lock_path(config: RagpipeConfig) -> Path:
    """The work dir's own lock: inside it, so every config naming it finds the same file."""
    return config.paths.work_dir.resolve() / ".ingest.lock"


@contextmanager
def ingest_lock(
    config: RagpipeConfig, timeout_s: float | None = None, since: float | None = None
) -> Iterator[Path]:
    """Hold the index's and then the work dir's writer locks for the body.

    Always in this order, so two runs never wait on each other. Both are waited for
    up to ``index.lock_timeout_s`` (or ``timeout_s``) in all, counted from ``since``
    (a ``time.monotonic()`` value: when the caller began waiting, for the writer slot
    say; default now); a lock still taken then raises StageError naming its holder.
    """
    wait = config.index.lock_timeout_s if timeout_s is None else timeout_s
    start = time.monotonic() if since is None else since
    with ExitStack() as stack:
        path = lock_path(config)
        stack.enter_context(_flock(path, "index", start, wait))
        stack.enter_context(_flock(work_dir_lock_path(config), "work dir", start, wait))
        yield path


@contextmanager
def _flock(path: Path, what: str, start: float, wait: float) -> Iterator[None]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a part of the path is a file, or cannot be written
        field = "paths.work_dir" if what == "work dir" else "store.path (or paths.work_dir)"
        raise ConfigError(
            f"cannot create the {what} lock {path}: {exc.strerror or exc}. A part of that "
            f"path is a file or cannot be written to: set {field} to a directory this "
            "user can write"
        ) from exc
    deadline = start + wait
    try:
        said = 0.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                holder = _read_holder(path)
                if now >= deadline:
                    raise StageError(
                        f"another ingest is writing to this {what} ({holder}; lock {path}). "
                        f"Waited {now - start:.0f}s (index.lock_timeout_s {wait:g}). Runs "
                        "never interleave: try again when it has finished."
                    ) from None
                if now - said >= WAIT_NOTICE_S or not said:
                    logger.warning(
                        "waiting for the ingest holding the %s lock (%s; lock %s), "
                        "up to %.0fs more (index.lock_timeout_s)",
                        what, holder, path, deadline - now,
                    )  # fmt: skip
                    said = now
                time.sleep(min(0.5, max(0.0, deadline - now)))
        me = {"pid": os.getpid(), "host": socket.gethostname(),
              "since": datetime.now(UTC).isoformat()}  # fmt: skip
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _read_holder(path: Path) -> str:
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, json.JSONDecodeError):
        return "holder unknown"
    return f"pid {data.get('pid')} on {data.get('host')} since {data.get('since')}"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after the process's name (field 3 on: the name may hold spaces
    and parentheses), [] when unknown (not Linux, or no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return []
    return stat.rsplit(")", 1)[-1].split()


def _start_ticks(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), "" when unknown."""
    fields = _stat_fields(pid)
    return fields[19] if len(fields) > 19 else ""  # field 22


def _ended(pid: int) -> bool:
    """Whether the process has ended but not been reaped yet (a zombie, state Z or X):
    ``os.kill(pid, 0)`` still finds it, and its start time is still its own."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] in ("Z", "X")  # field 3, the state


def _pid_namespace() -> str:
    """This process's pid namespace (Linux: ``pid:[inode]``), "" when unknown. A pid means
    something only inside its namespace, and containers on one host may share its name
    (Kubernetes pods on the host network do)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def process_identity() -> dict[str, str | int]:
    """This process as a lock holder: host, pid namespace, pid, and what tells a reused
    pid apart."""
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "pid_ns": _pid_namespace(),
        "pid": pid,
        "boot_id": _boot_id(),
        "start_ticks": _start_ticks(pid),
        "since": datetime.now(UTC).isoformat(),
    }


def holder_alive(holder: dict[str, object]) -> bool | None:
    """Whether the process ``process_identity`` described is still running: None when it
    ran on another host or in another pid namespace (a container: its pid means nothing
    here), so it cannot be checked from here."""
    if holder.get("host") != socket.gethostname():
        return None
    here = _pid_namespace()
    if holder.get("pid_ns") and here and holder.get("pid_ns") != here:
        return None
    if holder.get("boot_id") and holder.get("boot_id") != _boot_id():
        return False  # the machine restarted since
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    if _ended(pid):  # killed, its parent not yet told: it holds nothing (a supervisor
        return False  # that retries a killed nightly before wait() met its pid)
    started = holder.get("start_ticks")
    return not started or started == _start_ticks(pid)  # a reused pid is another process
