"""Readers never meet the writer: published versions of an Edge index (issue 17)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ragpipe.errors import StageError
from ragpipe.ingest.pipeline import run_ingest
from ragpipe.locking import _pid_namespace
from ragpipe.query.retrieve import Retriever
from ragpipe.store import EdgeStore, open_reader, open_store, published
from tests.support.corpora import make_config, topic_doc, write_topics
from tests.support.paths import REPO

pytestmark = pytest.mark.integration

ONNX = "paraphrase-MiniLM-L3-v2"
# Records "from another pid namespace" differ from this one only where it is known.
needs_pid_ns = pytest.mark.skipif(
    not _pid_namespace(), reason="/proc/self/ns/pid is not readable here"
)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_topics(tmp_path / "corpus", 3, ".txt")


def _versions(store_path: Path) -> list[str]:
    base = published.root(store_path)
    return sorted(p.name for p in base.iterdir() if p.is_dir() and p.name != published.READERS)


def test_an_ingest_publishes_what_it_wrote_and_a_no_op_publishes_nothing(
    corpus: Path, tmp_path: Path
) -> None:
    cfg = make_config(corpus, tmp_path)
    first = run_ingest(cfg)
    assert first.stages["upsert"]["published"] == 1
    generation = published.current(cfg.store.path)
    assert generation is not None and _versions(cfg.store.path) == [generation]
    version = published.IndexVersion.read(published.root(cfg.store.path) / generation)
    assert version is not None
    assert (version.points, version.files) == (first.points_total, 3)
    assert version.bytes > 0 and version.publish_seconds >= 0
    # A run killed while removing a superseded version leaves it renamed to a temp copy
    # (a whole index at scale): the next night, a no-op, removes it.
    doomed = published.root(cfg.store.path) / f".{'0' * 16}.deadbeef.tmp"
    (doomed / "segments").mkdir(parents=True)
    again = run_ingest(cfg)
    assert again.stages["upsert"]["published"] == 0
    assert published.current(cfg.store.path) == generation
    assert not doomed.exists()
    (corpus / "wings.txt").write_text(topic_doc("wings", version=2), encoding="utf-8")
    changed = run_ingest(cfg)
    assert changed.stages["upsert"]["published"] == 1
    new = published.current(cfg.store.path)
    assert new != generation and _versions(cfg.store.path) == [new]  # the old one removed


def test_a_first_publish_stopped_before_its_switch_says_so(corpus: Path, tmp_path: Path) -> None:
    """Killed between recording its version and writing CURRENT: readers said the gate had
    let none through, with no gate configured (the kill/resume review)."""
    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)
    generation = published.current(cfg.store.path)
    assert generation is not None
    (published.root(cfg.store.path) / published.CURRENT).unlink()  # where the kill fell
    with pytest.raises(StageError) as caught:
        open_reader(cfg.store, ONNX)
    message = str(caught.value)
    assert f"version {generation[:12]} was recorded as promoted" in message
    assert "stopped before making it live" in message and "gate has not" not in message
    assert run_ingest(cfg).failed == 0  # the next night finishes it
    assert published.current(cfg.store.path) == generation


def test_readers_and_the_writer_never_block_each_other(corpus: Path, tmp_path: Path) -> None:
    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)
    old = published.current(cfg.store.path)
    with Retriever(cfg) as one, Retriever(cfg) as two:  # two readers at once
        assert one.index_version["generation"] == old
        before = [h.point_id for h in one.search("engines sentence").hits]
        (corpus / "astronomy.txt").write_text(topic_doc("astronomy"), encoding="utf-8")
        summary = run_ingest(cfg)  # writes and publishes while both are open
        assert summary.added == 1
        assert [h.point_id for h in two.search("engines sentence").hits] == before
        assert one.store.count() == summary.points_total - summary.chunks_written  # old version
        copies = [Path(r.store.path) for r in (one, two)]
    assert not any(c.exists() for c in copies)  # private copies removed on close
    with Retriever(cfg) as three:  # the next open sees the new version
        assert three.index_version["generation"] == published.current(cfg.store.path) != old
        assert three.store.count() == summary.points_total


def test_a_version_being_copied_is_kept_until_no_reader_holds_it(
    corpus: Path, tmp_path: Path
) -> None:
    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)
    base = published.root(cfg.store.path)
    old = published.current(cfg.store.path)
    assert old is not None
    fd = os.open(base / f"{old}.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_SH)  # as a reader copying it
    (corpus / "extra.txt").write_text(topic_doc("extra"), encoding="utf-8")
    run_ingest(cfg)
    new = published.current(cfg.store.path)
    assert sorted(_versions(cfg.store.path)) == sorted([old, new])
    os.close(fd)
    assert published.remove_unused(cfg.store.path) == 1
    assert _versions(cfg.store.path) == [new] and not (base / f"{old}.lock").exists()


def test_a_killed_readers_copy_is_removed_by_the_next_publish(corpus: Path, tmp_path: Path) -> None:
    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)
    script = (
        "import os, sys\nfrom pathlib import Path\nfrom ragpipe.config import StoreConfig\n"
        "from ragpipe.store import open_reader\n"
        f"s = open_reader(StoreConfig(path=Path({str(cfg.store.path)!r})), {ONNX!r})\n"
        "print(s.path, flush=True)\nos._exit(0)\n"
    )
    child = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    left = Path(child.stdout.strip())
    owner = left.with_name(left.name + published.OWNER)
    assert left.is_dir() and owner.is_file(), child.stderr  # exited without closing
    published.remove_unused(cfg.store.path)
    assert not left.exists() and not owner.exists()


def _dead_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    return int(child.stdout)


@needs_pid_ns
def test_a_readers_copy_is_judged_by_the_owner_it_recorded(corpus: Path, tmp_path: Path) -> None:
    """A reader in another container or on another host shares the store's volume but not
    this pid namespace: its pid means nothing here, so its copy is kept, not removed under
    it; a reader of this host and namespace whose process is gone loses its copy."""
    import json

    from ragpipe.locking import process_identity

    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)
    readers = published.root(cfg.store.path) / published.READERS
    me, dead = process_identity(), _dead_pid()

    def owned(name: str, owner: dict[str, object] | None, copy: bool = True) -> Path:
        path = readers / name
        if copy:
            path.mkdir(parents=True)
        if owner is not None:
            path.with_name(name + published.OWNER).write_text(json.dumps(owner), "utf-8")
        return path

    kept = [
        owned(f"{dead}-0000000a", {**me, "host": "elsewhere", "pid": dead}),
        owned(f"{dead}-0000000b", {**me, "pid_ns": "pid:[1]", "pid": dead}),  # a container
        owned(f"{os.getpid()}-0000000c", me),
        owned(f"{os.getpid()}-0000000d", me, copy=False),  # recorded, copy not begun yet
    ]
    gone = [
        owned(f"{os.getpid()}-0000000e", {**me, "pid": dead, "start_ticks": ""}),
        owned(f"{os.getpid()}-0000000f", {**me, "start_ticks": "1"}),  # this pid, reused
        owned(f"{dead}-00000010", None),  # made before owners were recorded
        owned(f"{os.getpid()}-00000011", {**me, "pid": dead}, copy=False),  # killed first
    ]
    with Retriever(cfg) as reader:  # a live reader of this process, with its own record
        assert reader.search("astronomy").hits
        live = {p for p in readers.iterdir() if p.is_dir()} - set(kept) - set(gone)
        assert len(live) == 1
        published.remove_unused(cfg.store.path)
        assert reader.search("astronomy").hits
        left = {p.name for p in readers.iterdir()}
    owner = published.OWNER
    expected = {p.name for p in [*kept, *live]} | {p.name + owner for p in [*kept, *live]}
    assert left == expected - {kept[3].name}
    assert not (readers / next(iter(live)).name).exists()  # closed: copy and owner removed
    assert not (readers / (next(iter(live)).name + owner)).exists()


def test_an_uncheckable_owner_is_gone_when_its_record_is_unlocked_and_quiet(
    corpus: Path, tmp_path: Path
) -> None:
    """A reader in another container or on another host cannot be checked by pid: its copy
    was kept for good, so a pod restarted in a new pid namespace leaked a copy of the index
    each time. Its record is now locked and touched while it lives: unlocked and untouched
    for STALE_S, it is gone; locked or touched, it is kept."""
    import json

    from ragpipe.locking import process_identity
    from ragpipe.store import owners

    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)
    readers = published.root(cfg.store.path) / published.READERS
    readers.mkdir(exist_ok=True)
    quiet = time.time() - owners.STALE_S - 60
    elsewhere = {**process_identity(), "host": "elsewhere", "pid": 12345}

    def owned(name: str, owner: dict[str, object] | str, touched: float) -> Path:
        (readers / name).mkdir()
        record = readers / (name + published.OWNER)
        record.write_text(owner if isinstance(owner, str) else json.dumps(owner), "utf-8")
        os.utime(record, (touched, touched))
        return readers / name

    beating = {**elsewhere, "heartbeat_s": owners.HEARTBEAT_S}
    dead = owned("12345-000000a1", beating, quiet)
    beats = owned("12345-000000a2", beating, time.time())  # touched a minute ago
    holding = owned("12345-000000a3", beating, quiet)  # quiet, but its lock is held
    older = owned("12345-000000a4", elsewhere, quiet)  # a record from before the heartbeat
    garbled = owned("12345-000000a7", '{"host": "elsew', quiet)  # a disk error: the lock and
    garbled_new = owned("12345-000000a8", '{"host": "elsew', time.time())  # heartbeat judge
    temp_old = readers / f"12345-000000a5{published.OWNER}.0badcafe.tmp"
    temp_new = readers / f"12345-000000a6{published.OWNER}.0badcafe.tmp"
    for temp, touched in ((temp_old, time.time() - owners.TEMP_STALE_S - 60),
                          (temp_new, time.time())):  # fmt: skip
        temp.write_text("{", "utf-8")
        os.utime(temp, (touched, touched))
    fd = os.open(holding.with_name(holding.name + published.OWNER), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # as its owner does, from another open of the file
        published.remove_unused(cfg.store.path)
    finally:
        os.close(fd)
    left = {p.name for p in readers.iterdir()}
    kept = (beats, holding, older, garbled_new)
    assert left == {
        *(c.name for c in kept),
        *(c.name + published.OWNER for c in kept),
        temp_new.name,
    }
    published.remove_unused(cfg.store.path)  # the lock is gone now: so is that copy
    assert not holding.exists() and not holding.with_name(holding.name + ".owner.json").exists()
    assert dead.name not in left and temp_old.name not in left and garbled.name not in left


@needs_pid_ns
def test_a_reader_in_another_namespace_is_judged_by_its_lock(corpus: Path, tmp_path: Path) -> None:
    """A real reader process: its record stays locked while it lives, even when quiet (a
    stalled heartbeat), and the kernel drops the lock when it is killed. The records are
    rewritten as if from another pid namespace, where the pid says nothing."""
    import json

    from ragpipe.store import owners

    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)
    script = (
        "import sys\nfrom pathlib import Path\nfrom ragpipe.config import StoreConfig\n"
        "from ragpipe.store import open_reader\n"
        f"s = open_reader(StoreConfig(path=Path({str(cfg.store.path)!r})), {ONNX!r})\n"
        "print(s.path, flush=True)\nsys.stdin.read()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert child.stdout is not None
        copy = Path(child.stdout.readline().strip())
        record = copy.with_name(copy.name + published.OWNER)
        owner = json.loads(record.read_text("utf-8"))
        assert owner["heartbeat_s"] == owners.HEARTBEAT_S
        # Rewritten in place (the same inode, so the child's lock stays on it).
        with record.open("r+", encoding="utf-8") as f:
            f.write(json.dumps({**owner, "pid_ns": "pid:[1]"}))
            f.truncate()
        quiet = time.time() - owners.STALE_S - 60
        os.utime(record, (quiet, quiet))
        published.remove_unused(cfg.store.path)
        assert copy.is_dir() and record.is_file()  # alive: its lock is held
        child.kill()
        child.wait(30)
        published.remove_unused(cfg.store.path)
        assert not copy.exists() and not record.exists()  # killed: lock dropped, quiet
    finally:
        child.kill()
        child.wait(30)


def test_a_live_reader_touches_and_locks_its_record(corpus: Path, tmp_path: Path) -> None:
    from ragpipe.store import owners

    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)
    readers = published.root(cfg.store.path) / published.READERS
    with Retriever(cfg) as reader:
        assert reader.search("astronomy").hits
        (record,) = [p for p in readers.iterdir() if p.name.endswith(published.OWNER)]
        os.utime(record, (1.0, 1.0))
        assert record in owners._held and owners.beat() >= 1
        assert time.time() - record.stat().st_mtime < 60 and owners._locked(record)
    assert not record.exists() and record not in owners._held  # closed: released


def test_search_works_while_the_working_shard_is_held_by_a_writer(
    corpus: Path, tmp_path: Path
) -> None:
    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)
    writer = open_store(cfg.store, ONNX, 384)  # holds the working shard, as an ingest does
    assert isinstance(writer, EdgeStore)
    try:
        reader = open_reader(cfg.store, ONNX)
        assert isinstance(reader, EdgeStore) and reader.owned_copy
        assert reader.count() == writer.count() > 0
        reader.close()
    finally:
        writer.close()


def test_the_heartbeat_touches_held_records_and_stops_when_none_is_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragpipe.store import owners

    monkeypatch.setattr(owners, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(owners, "_held", {})  # this test's records alone, its own thread
    monkeypatch.setattr(owners, "_beating", None)
    record = tmp_path / f"1-00000001{published.OWNER}"
    owners.claim(record)
    try:
        assert owners._locked(record) and not list(tmp_path.glob("*.tmp"))
        os.utime(record, (1.0, 1.0))
        deadline = time.monotonic() + 10
        while record.stat().st_mtime < 2.0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert time.time() - record.stat().st_mtime < 60  # touched by the thread
    finally:
        owners.release(record)
    assert not owners._locked(record)
    deadline = time.monotonic() + 10
    while owners._beating is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert owners._beating is None  # nothing held: the thread ended


def test_the_lock_probe_keeps_a_copy_unless_the_filesystem_has_no_locks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NFS answers LOCK_EX on a descriptor it cannot lock with EBADF: read as 'no locks'
    that removed a live reader's copy on the heartbeat alone. Only a filesystem that says
    it has no locks (ENOLCK, EOPNOTSUPP, ENOSYS) leaves the heartbeat to decide."""
    import errno

    from ragpipe.store import owners

    record = tmp_path / f"1-00000001{published.OWNER}"
    record.write_text("{}", "utf-8")
    assert not owners._locked(record)  # nobody holds it

    def failing(code: int) -> Any:
        def flock(fd: int, operation: int) -> None:
            raise OSError(code, os.strerror(code))

        return flock

    for code, locked in ((errno.EBADF, True), (errno.EIO, True), (errno.ENOLCK, False),
                         (errno.EOPNOTSUPP, False), (errno.ENOSYS, False)):  # fmt: skip
        monkeypatch.setattr(owners.fcntl, "flock", failing(code))
        assert owners._locked(record) is locked, errno.errorcode[code]


def test_a_failing_tidy_is_logged_and_fails_no_night(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from ragpipe.store import remove_leftovers

    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)
    for name in (published.STATUS_FILE, published.STATUS_COPY):  # both damaged
        (published.root(cfg.store.path) / name).write_text("{", "utf-8")
    with caplog.at_level("WARNING", logger="ragpipe.store"):
        assert remove_leftovers(cfg.store) == 0
    assert "the next ingest tries again" in caplog.text and "is not valid JSON" in caplog.text


def test_a_damaged_live_version_is_published_again(corpus: Path, tmp_path: Path) -> None:
    """A power cut after CURRENT was synced, before the copy's files were (cp syncs none):
    readers failed on it, and every later night, a no-op, left it so."""
    from ragpipe.errors import StageError

    cfg = make_config(corpus, tmp_path)
    first = run_ingest(cfg)
    generation = published.current(cfg.store.path)
    assert generation is not None
    live = published.root(cfg.store.path) / generation
    sizes = published._sync_tree(live)  # what was recorded: every file, at its size
    recorded = (live / published.SIZES_FILE).read_text("utf-8")
    own = (published.VERSION_FILE, published.SIZES_FILE)
    assert json.loads(recorded) == {k: v for k, v in sizes.items() if k not in own}
    assert published.intact(live)
    largest = max((p for p in (live / "segments").rglob("*") if p.is_file()),
                  key=lambda p: p.stat().st_size)  # fmt: skip
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])
    assert not published.intact(live)
    # Refused, not opened: a version with a payload file cut in half opened and searched.
    with pytest.raises(StageError, match=r"is damaged .* the next `ragpipe ingest` publishes"):
        open_reader(cfg.store, ONNX)
    again = run_ingest(cfg)
    assert (again.added, again.changed, again.failed) == (0, 0, 0)
    assert again.stages["upsert"]["published"] == 1
    # Under a new token, so that a running server (polling for one) switches to it.
    renewed = published.current(cfg.store.path)
    assert renewed not in (None, generation) and _versions(cfg.store.path) == [renewed]
    assert published.intact(published.root(cfg.store.path) / renewed)
    reader = open_reader(cfg.store, ONNX)
    assert reader is not None
    try:
        assert reader.count() == first.points_total
    finally:
        reader.close()
    assert run_ingest(cfg).stages["upsert"]["published"] == 0  # whole again: a no-op


def test_a_copy_that_cannot_be_removed_fails_no_night(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A dead reader's copy in a folder this user may not write failed every ingest, a no-op
    too, after the new version was live."""
    cfg = make_config(corpus, tmp_path)
    run_ingest(cfg)

    def denied(copy: Path) -> None:
        raise PermissionError(13, "Permission denied", str(copy))

    monkeypatch.setattr(published, "drop_copy", denied)
    monkeypatch.setattr(published, "_reader_gone", lambda readers, name: True)
    readers = published.root(cfg.store.path) / published.READERS
    (readers / "1-deadbeef").mkdir(parents=True)
    (corpus / "new.txt").write_text(topic_doc("gardens"), encoding="utf-8")
    with caplog.at_level("WARNING", logger="ragpipe.store"):
        changed = run_ingest(cfg)
        assert changed.added == 1 and changed.failed == 0
        assert changed.stages["upsert"]["published"] == 1
        assert run_ingest(cfg).failed == 0  # and a no-op night
    assert "Permission denied" in caplog.text and "the next ingest tries again" in caplog.text
    assert (readers / "1-deadbeef").is_dir()


def test_a_working_shard_never_published_is_not_read(corpus: Path, tmp_path: Path) -> None:
    """A first ingest killed in upsert: readers opened its half-written working shard as the
    index (22 of 45 points, no warning), and held it, failing the next ingest."""
    from ragpipe.errors import StageError

    cfg = make_config(corpus, tmp_path)
    store = open_store(cfg.store, ONNX, 384)
    assert store is not None
    store.close()
    with pytest.raises(StageError, match="has not been published: the ingest that wrote it "
                       "did not finish"):  # fmt: skip
        open_reader(cfg.store, ONNX)
    assert open_reader(make_config(corpus, tmp_path / "none").store, ONNX) is None  # no index
    empty = make_config(corpus, tmp_path / "empty")
    empty.store.path.mkdir(parents=True)  # a folder, no index (a wrong --store-path)
    assert open_reader(empty.store, ONNX) is None
    run_ingest(cfg)
    reader = open_reader(cfg.store, ONNX)
    assert reader is not None
    reader.close()


def test_a_publish_killed_mid_copy_and_a_users_temp_files_are_left_alone(
    tmp_path: Path,
) -> None:
    """The docs' layout ``work_dir: data``, ``roots: [data/docs]``, store in ``data/store``:
    the sweep of stale temp files deleted every ".*.tmp" below the work dir. So it deleted
    a user's ".budget.xlsx.tmp" in the corpus, and hit the folder a publish killed mid-copy
    leaves (``.<generation>.<uuid>.tmp``): IsADirectoryError, every later night."""
    data = tmp_path / "data"
    docs = data / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "engines.md").write_text(topic_doc("engines"), encoding="utf-8")
    users = [docs / ".budget.xlsx.tmp", docs / "sub" / ".notes.tmp",
             docs / f".engines.md.{os.getpid()}.{'a' * 12}.tmp"]  # fmt: skip
    for path in users:
        path.write_bytes(b"the user's own")
    cfg = make_config(docs, tmp_path, store={"path": data / "store"}, paths={"work_dir": data})
    run_ingest(cfg)
    killed = published.root(cfg.store.path) / f".{'0' * 16}.{'f' * 32}.tmp"
    (killed / "segments").mkdir(parents=True)
    ours = data / "plan" / f".plan.parquet.{os.getpid()}.{'b' * 12}.tmp"  # a killed writer's
    ours.write_bytes(b"half a checkpoint")
    (docs / "wings.md").write_text(topic_doc("wings"), encoding="utf-8")
    again = run_ingest(cfg)
    assert again.added == 1 and again.failed == 0
    assert all(path.read_bytes() == b"the user's own" for path in users)
    assert not ours.exists()
