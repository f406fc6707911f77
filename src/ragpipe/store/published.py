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
  (an exclusive lock it does not wait for), and private copies whose owner is
  gone (each copy has its owner's record beside it, locked and touched while
  the owner lives: ``owners``).

With a quality gate (``index.gate``) publishing becomes a decision: the ingest
**stages** the version (copied as above, ``CURRENT`` untouched), the gate
evaluates it against the live one, and only then is it **promoted** (the
``CURRENT`` switch) or **held**. Each version's status and the gate's verdict
are kept in ``versions.json`` beside them; held versions stay on disk (the
newest ``KEEP_HELD``) until promoted by hand or discarded.

A Qdrant server serves readers and writers at once and needs no copies to
read; with a gate it keeps versions as collections behind an alias
(``server_versions``).
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
from ragpipe.store import owners
from ragpipe.store.base import GENERATION_FILE

logger = logging.getLogger(__name__)

CURRENT = "CURRENT"
VERSION_FILE = "ragpipe-version.json"
# Each file of a version and its size when published: a copy a power cut or a disk cut
# short is seen (``intact``) and published again.
SIZES_FILE = "ragpipe-files.json"
READERS = "readers"
# Beside each reader's copy <pid>-<hex>: who made it (host, pid namespace, pid, start),
# locked and touched by its owner while the copy is open (``owners``).
OWNER = ".owner.json"
STATUS_FILE = "versions.json"
STATUS_COPY = "versions.copy.json"  # the same, written after it: read when it is damaged
KEEP_HELD = 3  # held or staged versions kept on disk (the newest), besides the live one

# A version's status: staged (written, not decided), held (the gate said no),
# promoted (live now or before), discarded (removed by hand; the record stays, so that the
# same working version is not staged again).
STAGED, HELD, PROMOTED, DISCARDED = "staged", "held", "promoted", "discarded"


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


def _sync_tree(directory: Path) -> dict[str, int]:
    """fsync every file and folder under ``directory`` (``cp`` syncs none: ``CURRENT``,
    synced, could name a version whose files a power cut left empty); returns each file's
    size by its path relative to ``directory``."""
    sizes: dict[str, int] = {}
    for folder, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(folder, name)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                sizes[os.path.relpath(path, directory)] = os.fstat(fd).st_size
            finally:
                os.close(fd)
        fsync_dir(Path(folder))
    return sizes


def intact(directory: Path) -> bool:
    """Whether a published version holds every file it was published with, at its size
    (True for one published before sizes were recorded, as nothing can be told)."""
    if IndexVersion.read(directory) is None:
        return False
    try:
        sizes = json.loads((directory / SIZES_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False
    try:
        return all(os.stat(directory / rel).st_size == size for rel, size in sizes.items())
    except (OSError, AttributeError):  # a file gone; not a mapping of sizes
        return False


def _disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in directory.rglob("*") if p.is_file())


def _materialize(
    store_path: Path, generation: str, points: int, files: int, index_fingerprint: str
) -> IndexVersion:
    """Copy the working shard into the versions directory as ``generation`` (once)."""
    base = root(store_path)
    started = time.perf_counter()
    base.mkdir(parents=True, exist_ok=True)
    target = base / generation
    version = IndexVersion.read(target) if target.is_dir() else None
    if version is not None and not intact(target):  # cut short: copied again from the shard
        if not _remove_version(base, generation):
            raise StageError(f"index version {generation[:12]} is damaged and a reader is "
                             "copying it; run the ingest again to write it anew")  # fmt: skip
        logger.warning("index version %s was damaged: written again", generation[:12])
        version = None
    if version is None:  # written once, before any reader can see the directory
        shutil.rmtree(target, ignore_errors=True)  # a publish killed before its version file
        tmp = base / f".{generation}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            _copy_tree(store_path, tmp)
            sizes = _sync_tree(tmp)
            atomic_write_bytes(tmp / SIZES_FILE, json.dumps(sizes, sort_keys=True).encode())
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
    return version


def _live(store_path: Path, generation: str) -> bool:
    """Whether ``generation`` is live and whole on disk."""
    base = root(store_path)
    return (
        current(store_path) == generation
        and (base / generation).is_dir()
        and intact(base / generation)
    )


def _renewed(store_path: Path, generation: str) -> str:
    """A new token for the working shard when its live copy ``generation`` is damaged: it
    is published again under the new one, so readers and servers switch to it (a server
    polls for a new token), and the damaged copy goes as any superseded version."""
    token = uuid.uuid4().hex
    atomic_write_bytes(store_path / GENERATION_FILE, token.encode())
    logger.warning(
        "the live index version %s is damaged (files missing or cut short, a power cut?): "
        "publishing the index again as %s", generation[:12], token[:12],
    )  # fmt: skip
    return token


def publish(
    store_path: Path, generation: str, points: int, files: int, index_fingerprint: str
) -> IndexVersion | None:
    """Publish the working shard as ``generation`` (the caller holds the ingest lock and
    has closed the store). Returns the new version, or None when it was current already
    (what a run killed while removing a version left, a temp copy, is removed then too)."""
    if _live(store_path, generation):
        tidy(store_path)
        return None
    if current(store_path) == generation and (root(store_path) / generation).is_dir():
        generation = _renewed(store_path, generation)
    started = time.perf_counter()
    version = _materialize(store_path, generation, points, files, index_fingerprint)
    promote(store_path, generation, {"gate": None})
    logger.info(
        "published index version %s (%d points, %.1f MB) in %.2fs",
        generation[:12], points, version.bytes / 1e6, time.perf_counter() - started,
    )  # fmt: skip
    return version


def stage(
    store_path: Path, generation: str, points: int, files: int, index_fingerprint: str
) -> IndexVersion | None:
    """Write ``generation`` beside the live version without switching readers to it (a
    gate decides). None when it is live already; a version decided before keeps its
    status (a no-op night does not re-judge a held version)."""
    was_live = current(store_path) == generation
    if _live(store_path, generation):
        tidy(store_path)  # what a killed run left, as publish does
        return None
    recorded = statuses(store_path).get(generation, {})
    if recorded.get("status") == DISCARDED:
        logger.warning("index version %s was discarded by hand: not staged again",
                       generation[:12])  # fmt: skip
        return None
    if was_live:  # lost or damaged: the live index again, nothing for a gate to decide
        if (root(store_path) / generation).is_dir():
            generation = _renewed(store_path, generation)
        version = _materialize(store_path, generation, points, files, index_fingerprint)
        # What the damaged version replaced stays the one to roll back to.
        promote(store_path, generation,
                {"gate": "the live version, published again",
                 "previous": recorded.get("previous")},
                keep_previous=bool(recorded.get("keep_previous")))  # fmt: skip
        return version
    version = _materialize(store_path, generation, points, files, index_fingerprint)
    if not recorded:
        _set_status(store_path, generation, STAGED, {})
    logger.info("staged index version %s (%d points): the gate decides", generation[:12], points)
    tidy(store_path)  # older held ones beyond KEEP_HELD
    return version


def _read_statuses(path: Path) -> dict[str, dict[str, Any]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def statuses(store_path: Path) -> dict[str, dict[str, Any]]:
    """Every version's recorded status: {generation: {status, at, ...}}. From its copy
    (``STATUS_COPY``, written after it) when ``versions.json`` is damaged or gone: the
    people's decisions live there (a discarded version, a roll-back), and without them the
    next night judged, and promoted again, the version a person had taken off."""
    base = root(store_path)
    main, copy = base / STATUS_FILE, base / STATUS_COPY
    try:
        return _read_statuses(main)
    except (FileNotFoundError, ValueError) as exc:
        damaged = exc
    try:
        recorded = _read_statuses(copy)
    except FileNotFoundError:
        if isinstance(damaged, FileNotFoundError):
            return {}
        recorded = None
    except ValueError:
        recorded = None
    if recorded is None:
        raise StageError(
            f"{main} is not valid JSON ({damaged}), nor is its copy {copy.name}; restore one, "
            "or remove both: the live version keeps serving, held versions then show as "
            "staged, and a version discarded or rolled back from by hand may be judged, and "
            "promoted, again"
        ) from damaged
    logger.warning("%s is %s: the version statuses are read from its copy %s", main,
                   "missing" if isinstance(damaged, FileNotFoundError) else "not valid JSON",
                   copy.name)  # fmt: skip
    return recorded


def _set_status(store_path: Path, generation: str, status: str, extra: dict[str, Any]) -> None:
    entries = statuses(store_path)
    entries[generation] = {"status": status, "at": datetime.now(UTC).isoformat(), **extra}
    data = json.dumps(entries, indent=1, sort_keys=True).encode()
    # The copy first: never behind the main file (a kill between the two writes left a
    # discard in the main file only; damaged later, the copy revived the version).
    atomic_write_bytes(root(store_path) / STATUS_COPY, data)
    atomic_write_bytes(root(store_path) / STATUS_FILE, data)


def hold(store_path: Path, generation: str, verdict: dict[str, Any]) -> None:
    """Record that the gate kept ``generation`` from readers; it stays on disk (the newest
    ``KEEP_HELD`` held versions do)."""
    _set_status(store_path, generation, HELD, {"verdict": verdict})
    tidy(store_path)


def promote(
    store_path: Path,
    generation: str,
    extra: dict[str, Any] | None = None,
    keep_previous: bool = False,
) -> None:
    """Switch readers to ``generation`` (atomically) and remove what is no longer kept;
    ``keep_previous`` keeps the version it replaces, to roll back to (gated and by-hand
    promotions do).

    Raises:
        StageError: no such version on disk.
    """
    base = root(store_path)
    if IndexVersion.read(base / generation) is None:
        raise StageError(f"no index version {generation} under {base}")
    if not intact(base / generation):
        raise StageError(
            f"index version {generation[:12]} under {base} is damaged (files missing or cut "
            "short): it cannot be made live; discard it (`ragpipe index discard`)"
        )
    _lock_file(base, generation).touch()
    previous = current(store_path)
    recorded = {"previous": previous, "keep_previous": keep_previous, **(extra or {})}
    # The record first: a crash before the switch leaves it saying "promoted" of a version
    # that is not live, which the next promotion rewrites; the other order could lose the
    # roll-back target's record.
    _set_status(store_path, generation, PROMOTED, recorded)
    atomic_write_bytes(base / CURRENT, generation.encode())
    removed = tidy(store_path)
    if removed:
        logger.info("removed %d superseded index version(s)", removed)


def discard(store_path: Path, generation: str) -> None:
    """Remove a version that is not live (a held one, say). Its record stays: the same
    working version (an ingest that changed nothing since) is not staged again.

    Raises:
        StageError: it is the live version, or a reader is copying it now.
    """
    base = root(store_path)
    if generation == current(store_path):
        raise StageError(f"index version {generation[:12]} is live: promote another one first")
    if not (base / generation).is_dir():
        raise StageError(f"no index version {generation} under {base}")
    # The record first, as the server backend does: removed first and killed before the
    # record, the version was staged again the next night, and held ("still held") for good.
    _set_status(store_path, generation, DISCARDED, {})
    if not _remove_version(base, generation):
        raise StageError(f"a reader is copying index version {generation[:12]}: it is "
                         "discarded, and a later run removes it")  # fmt: skip


def resolve(store_path: Path, prefix: str) -> str:
    """The one version on disk whose generation starts with ``prefix``.

    Raises:
        StageError: none or several match (the message lists the versions).
    """
    return pick([v.generation for v in list_versions(store_path)], prefix, "on disk")


def pick(generations: list[str], prefix: str, where: str) -> str:
    """The one of ``generations`` that starts with ``prefix`` (StageError otherwise)."""
    if not prefix.strip():  # "" matched the only version on disk
        raise StageError(f"give an index version (or a prefix of one), not {prefix!r}")
    found = [g for g in generations if g.startswith(prefix)]
    if len(found) == 1:
        return found[0]
    listed = ", ".join(g[:12] for g in generations) or "none"
    what = "no" if not found else f"{len(found)}"
    raise StageError(f"{what} index versions match {prefix!r} (versions {where}: {listed})")


@dataclass(frozen=True)
class VersionEntry:
    """A version on disk as ``ragpipe index list`` shows it."""

    generation: str
    status: str
    live: bool
    published_at: str
    points: int
    files: int
    decided_at: str | None
    verdict: dict[str, Any] | None


def list_versions(store_path: Path) -> list[VersionEntry]:
    """The versions on disk, newest first."""
    base = root(store_path)
    if not base.is_dir():
        return []
    live = current(store_path)
    recorded = statuses(store_path)
    entries = []
    for directory in base.iterdir():
        version = IndexVersion.read(directory) if directory.is_dir() else None
        if version is None or directory.name != version.generation:
            continue
        entries.append(entry(version, recorded, live))
    return sorted(entries, key=lambda e: e.published_at, reverse=True)


def entry(
    version: IndexVersion, recorded: dict[str, dict[str, Any]], live: str | None
) -> VersionEntry:
    """How ``ragpipe index list`` shows ``version``, given the statuses and the live one."""
    info = recorded.get(version.generation, {})
    status = info.get("status", PROMOTED if version.generation == live else STAGED)
    return VersionEntry(
        version.generation, status, version.generation == live, version.published_at,
        version.points, version.files, info.get("at"), info.get("verdict"),
    )  # fmt: skip


def kept(
    entries: list[VersionEntry], recorded: dict[str, dict[str, Any]], live: str | None
) -> set[str | None]:
    """The versions retention keeps: the live one, the one it replaced when promoted with
    ``keep_previous``, one whose promotion was killed before its switch, and the newest
    ``KEEP_HELD`` held or staged ones newer than the live one (older ones are its
    ancestors: superseded)."""
    keep = {live}
    promoted = recorded.get(live or "", {})
    if promoted.get("keep_previous") and promoted.get("previous"):
        keep.add(promoted["previous"])  # to roll back to
    # A promotion killed before its switch (recorded after the live one's): the next run
    # promotes it again (``gatekeep.decide``), so it stays.
    live_at = promoted.get("at", "")
    keep.update(
        g for g, r in recorded.items() if r.get("status") == PROMOTED and r.get("at", "") > live_at
    )
    since = next((e.published_at for e in entries if e.live), "")
    waiting = [
        e.generation for e in entries
        if not e.live and e.published_at > since
        and recorded.get(e.generation, {}).get("status", STAGED) in (STAGED, HELD)
    ]  # fmt: skip
    keep.update(waiting[:KEEP_HELD])
    return keep


def _lock_file(base: Path, generation: str) -> Path:
    return base / f"{generation}.lock"


def _remove_version(base: Path, generation: str) -> bool:
    """Remove one version unless a reader is copying it (False then)."""
    fd = os.open(_lock_file(base, generation), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a reader is copying it: the next publish removes it
        # Out of readers' sight while still exclusive: a reader that locks next finds no
        # directory, never a half-deleted one (a temp name, removed below or later).
        doomed = base / f".{generation}.{uuid.uuid4().hex[:8]}.tmp"
        os.rename(base / generation, doomed)
    finally:
        os.close(fd)  # released either way; readers check the directory exists
    shutil.rmtree(doomed, ignore_errors=True)
    _lock_file(base, generation).unlink(missing_ok=True)
    return True


def remove_unused(store_path: Path) -> int:
    """Remove superseded versions no reader is copying, temp dirs and dead readers' copies.

    Kept: the live version, the one it replaced when promoted with ``keep_previous``, and
    the newest ``KEEP_HELD`` held or staged ones."""
    base = root(store_path)
    if not base.is_dir():
        return 0
    recorded = statuses(store_path)
    keep = kept(list_versions(store_path), recorded, current(store_path))
    removed = 0
    for item in base.iterdir():
        if item.name.endswith(".tmp") and item.is_dir():
            shutil.rmtree(item, ignore_errors=True)  # a publish killed mid-copy
        elif item.is_dir() and item.name not in keep and item.name != READERS:
            removed += _remove_version(base, item.name)
    for lock in base.glob("*.lock"):  # locks of versions removed meanwhile
        if lock.stem not in keep and not (base / lock.stem).is_dir():
            lock.unlink(missing_ok=True)
    gone = [g for g, r in recorded.items()
            if not (base / g).is_dir() and r.get("status") != DISCARDED]  # fmt: skip
    if gone:  # the record follows what is on disk
        for generation in gone:
            recorded.pop(generation)
        data = json.dumps(recorded, indent=1, sort_keys=True).encode()
        atomic_write_bytes(base / STATUS_COPY, data)
        atomic_write_bytes(base / STATUS_FILE, data)
    readers = base / READERS
    if readers.is_dir():
        for entry in readers.iterdir():
            if entry.name.endswith(".tmp") and not entry.is_dir():  # a half-written record
                if owners.stale_temp(entry):
                    entry.unlink(missing_ok=True)
                continue
            name = entry.name.removesuffix(OWNER)
            if entry.name.endswith(OWNER) and (readers / name).exists():
                continue  # judged with its copy
            if _reader_gone(readers, name):
                drop_copy(readers / name)
    return removed


def tidy(store_path: Path) -> int:
    """``remove_unused``, best effort: what cannot be removed (a dead reader's copy in a
    folder this user may not write, say) is logged and left for the next run; the version
    written or switched stands, and the run that did its work is not failed for it."""
    try:
        return remove_unused(store_path)
    except (StageError, OSError) as exc:
        logger.warning(
            "could not remove what killed readers and runs left under %s (the next ingest "
            "tries again): %s", root(store_path), exc,
        )  # fmt: skip
        return 0


def drop_copy(copy: Path) -> None:
    """Remove a reader's private copy and the record of its owner (the record last: the
    copy is never without one a cleanup can check)."""
    record = copy.with_name(copy.name + OWNER)
    shutil.rmtree(copy, ignore_errors=True)
    owners.release(record)
    record.unlink(missing_ok=True)


def _reader_gone(readers: Path, name: str) -> bool:
    """Whether the owner of the copy ``name`` is gone, by its record (``owners.gone``). A
    copy made before owners were recorded is judged by the pid in its name."""
    record = readers / (name + OWNER)
    if not record.exists():
        pid = name.split("-", 1)[0]
        return pid.isdigit() and not _alive(int(pid))
    return owners.gone(record)


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


def _damage_fix(store_path: Path, generation: str) -> str:
    """What to do about a damaged version, for a reader's message."""
    try:
        working = (store_path / GENERATION_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        working = ""
    if generation != current(store_path):
        return "discard it (`ragpipe index discard`) or run the ingest that wrote it again"
    if working == generation:
        return "the next `ragpipe ingest` publishes the index again"
    return (
        "the next `ragpipe ingest` puts the working index in its place (with index.gate, "
        "once judged); meanwhile `ragpipe index list` and `ragpipe index promote` an older "
        "version"
    )


def reader_copy(
    store_path: Path, version: str | None = None
) -> tuple[Path, IndexVersion | None] | None:
    """A private copy of the current published version (or of ``version``, staged or held
    ones too), for one reader to open.

    None when nothing is published yet. The caller removes the copy when done
    (``EdgeStore`` does, on close).
    """
    base = root(store_path)
    for _ in range(5):  # a publish may replace CURRENT between reading it and locking
        lost = False
        generation = version or current(store_path)
        if generation is None:
            return None
        lock = _lock_file(base, generation)
        if not lock.exists():  # removed with its version a moment ago, or not made yet
            with suppress(OSError):
                lock.touch()
        with _shared(lock) as held:
            source = base / generation
            if version is not None and not source.is_dir():
                raise StageError(f"no index version {version} under {base}")
            if not source.is_dir() and version is None and current(store_path) == generation:
                lost = True  # still live after the lock: gone, not replaced a moment ago
            elif not held or not source.is_dir():
                continue
            if lost or not intact(source):  # a power cut, a disk: it would open, or half-open
                fix = _damage_fix(store_path, generation)
                what = "its folder is gone" if lost else "files missing or cut short"
                raise StageError(
                    f"index version {generation[:12]} under {base} is damaged ({what}); {fix}"
                )
            readers = base / READERS
            readers.mkdir(exist_ok=True)
            target = readers / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:  # the owner first: a copy is never without one a cleanup can check
                owners.claim(target.with_name(target.name + OWNER))
                _copy_tree(source, target)
            except BaseException:
                drop_copy(target)
                raise
        return target, IndexVersion.read(target)
    raise StageError(
        f"the published versions of {store_path} changed five times while opening one; try again"
    )


def describe(version: IndexVersion | None) -> dict[str, Any]:
    """The version fields a report records (empty when unknown)."""
    return asdict(version) if version is not None else {}
